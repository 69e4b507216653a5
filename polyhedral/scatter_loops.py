"""The loops of scatters (tclang/lang/scatters.py), which isl schedules as single points.

In the scop a scatter is one instance that reads and writes the whole of each tensor it
touches (polyhedral/scop.py): any of its updates may land on any element of its target,
so every statement before it that writes what it reads or updates, and every statement
after it that reads its target, is ordered around all of it. Here that one instance becomes
its loop nest over the scatter's index ranges, in the statement's index order.

On the CPU and the reference the loops are sequential: colliding updates happen one at a
time, in index order, the same on every run, whatever `Options(reorder_reductions=...)`
says. On a GPU a scatter gets a launch of one thread per update, each update an atomic
one (`atomic_scatters`); with `Options(reorder_reductions=False)`, or a type CUDA has no
atomic update for (half, bfloat16, 8- and 16-bit integers, an int64 min or max), one
thread runs the nest in index order instead. Each update's subscripts are checked against
the target's extents first.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Mapping

from polyhedral import loop_ir as L
from polyhedral.subscripts import lower_value, size_index
from tclang.lang import program as P


def scatter_def(sid: str, s: P.Statement, sizes: Mapping[str, int] | None,
                dtype) -> L.StatementDef:
    """The loop IR's statement of scatter `s`: an update at the point its subscripts name."""
    return L.StatementDef(sid, s.target, s.reduction_indices, (), "reduce", s.op,
                          lower_value(s.rhs, sizes), s.text, s.span.line,
                          scatter=tuple(lower_value(e, sizes) for e in s.scatter))


def expand_scatters(node: L.Node, statements: Mapping[str, P.Statement],
                    sizes: Mapping[str, int] | None, atomic: frozenset[str] = frozenset(),
                    threaded: frozenset[str] = frozenset()) -> L.Node:
    """`node` with each run of a scatter (ids in `statements`) replaced by its loop nest
    (a parallel one for a scatter in `threaded`: `parallel_nest`); the one-thread launch of
    a scatter in `atomic` by a launch of a thread per update."""
    def again(n: L.Node) -> L.Node:
        return expand_scatters(n, statements, sizes, atomic, threaded)

    match node:
        case L.Launch(body=L.Run(statement=sid)) if sid in atomic:
            return _atomic_launch(sid, statements[sid], sizes)
        case L.Run(statement=sid) if sid in threaded:
            return parallel_nest(sid, statements[sid], sizes)
        case L.Run(statement=sid) if sid in statements:
            return _nest(sid, statements[sid], sizes)
        case L.For(body=b) | L.Launch(body=b) | L.Scratch(body=b):
            return replace(node, body=again(b))
        case L.If(then=t, other=o):
            return replace(node, then=again(t), other=None if o is None else again(o))
        case L.Block(body=items):
            return L.Block(tuple(again(i) for i in items))
    return node


#: what CUDA's atomics update (backends/cuda/codegen.py, ATOMIC_PRELUDE), by operator
ATOMIC_TYPES = {"+": ("float32", "float64", "int32", "int64"),
                "min": ("float32", "float64", "int32"), "max": ("float32", "float64", "int32")}
THREADS = 256  # a block of the atomic launch


def atomic_scatters(scop_statements, tensors, deterministic: bool) -> frozenset[str]:
    """The scatters a GPU kernel runs a thread per update, with atomic updates: all whose
    operator and type CUDA updates atomically, unless the order must be fixed
    (`Options(reorder_reductions=False)`: then one thread runs the nest in order)."""
    if deterministic:
        return frozenset()
    return frozenset(st.id for st in scop_statements if st.source.is_scatter and
                     tensors[st.source.target].dtype.value in ATOMIC_TYPES[st.source.op])


def _atomic_launch(sid: str, s: P.Statement, sizes: Mapping[str, int] | None) -> L.Launch:
    """`flat = b0 * THREADS + t0; if (flat < total) S(decompose(flat))`."""
    ranges = [s.range_of(i) for i in s.reduction_indices]
    extents = [size_index(r.hi - r.lo, sizes) for r in ranges]
    total: L.IExpr = L.Int(1)
    for e in extents:
        total = e if total == L.Int(1) else L.Op("mul", (total, e))
    flat = L.add(L.Op("mul", (L.Var("b0"), L.Int(THREADS))), L.Var("t0"))
    values, stride = [], L.Int(1)
    for r, e in reversed(list(zip(ranges, extents))):
        part = flat if stride == L.Int(1) else L.Op("div_nonneg", (flat, stride))
        values.append(L.add(size_index(r.lo, sizes), L.Op("rem", (part, e))))
        stride = e if stride == L.Int(1) else L.Op("mul", (stride, e))
    run = L.Run(sid, tuple(reversed(values)))
    blocks = L.Op("div_nonneg", (L.add(total, L.Int(THREADS - 1)), L.Int(THREADS)))
    return L.Launch("scatter", (blocks,), (THREADS,), (),
                    L.If(L.Op("lt", (flat, total)), run))


#: the CPU scatter types whose colliding updates the backend combines safely (privatized
#: copies, or compare-and-swap updates of 32- and 64-bit elements)
THREADED_TYPES = ("float32", "float64", "int32", "int64")
PARALLEL_UPDATES = 1 << 15  # fewer updates (at known sizes): the sequential nest
BLOCK = 32  # elements of a plain trailing index per parallel iteration


def threaded_scatters(scop_statements, tensors, sizes: Mapping[str, int] | None,
                      deterministic: bool) -> frozenset[str]:
    """The scatters a CPU kernel runs in parallel (`parallel_nest`): none where the order
    must be fixed (`Options(reorder_reductions=False)`), else those of a type in
    THREADED_TYPES with enough updates (any number where a size is known only at run time:
    the backend's own threshold then keeps a small loop on one thread)."""
    if deterministic:
        return frozenset()
    chosen = set()
    for st in scop_statements:
        s = st.source
        if not s.is_scatter or tensors[s.target].dtype.value not in THREADED_TYPES:
            continue
        updates = _updates(s, sizes)
        if updates is None or updates >= PARALLEL_UPDATES:
            chosen.add(st.id)
    return frozenset(chosen)


def _updates(s: P.Statement, sizes: Mapping[str, int] | None) -> int | None:
    total = 1
    for index in s.reduction_indices:
        r = s.range_of(index)
        lo, hi = size_index(r.lo, sizes), size_index(r.hi, sizes)
        if not (isinstance(lo, L.Int) and isinstance(hi, L.Int)):
            return None
        total *= max(0, hi.value - lo.value)
    return total


def _plain_index(s: P.Statement, sizes: Mapping[str, int] | None) -> str | None:
    """The last plain index of the target's subscripts (the `d` of `G(Ids(b, l), d)`), if
    its range is wide enough to share out in blocks (or known only at run time)."""
    for e in reversed(s.scatter):
        if isinstance(e, P.IndexValue):
            r = s.range_of(e.name)
            lo, hi = size_index(r.lo, sizes), size_index(r.hi, sizes)
            if isinstance(lo, L.Int) and isinstance(hi, L.Int) and \
                    hi.value - lo.value < 2 * BLOCK:
                return None
            return e.name
    return None


def parallel_nest(sid: str, s: P.Statement, sizes: Mapping[str, int] | None) -> L.Node:
    """The scatter's nest with parallel iterations (the CPU, reorder_reductions=True).

    With a plain index among the target's subscripts (the `d` of an embedding backward),
    two values of it never update the same element: an outer parallel loop takes blocks
    of BLOCK values of it, and inside it the nest is the sequential one over the block.
    The updates of each element keep their index order: the same sums as the sequential
    nest, bit for bit, with no atomic. Otherwise the outermost loop is marked parallel
    and reduction: its iterations may update the same elements, and the backend combines
    them safely (backends/llvm/kernel_module.py, `colliding_loop`: a privatized copy of a
    small target per chunk of iterations, merged once, else compare-and-swap updates)."""
    index = _plain_index(s, sizes)
    if index is None:
        nest = _nest(sid, s, sizes)
        return replace(nest, parallel=True, reduction=True)
    r = s.range_of(index)
    lo, hi = size_index(r.lo, sizes), size_index(r.hi, sizes)
    block = f"{sid.lower()}_block"
    offset = L.Op("mul", (L.Var(block), L.Int(BLOCK)))
    start = offset if lo == L.Int(0) else L.add(lo, offset)
    inner = _nest(sid, s, sizes, {index: (start, L.Op("min", (hi, L.add(start, L.Int(BLOCK)))))})
    extent = L.add(L.sub(hi, lo), L.Int(BLOCK - 1))
    blocks = L.Int(extent.value // BLOCK) if isinstance(extent, L.Int) else \
        L.Op("div_nonneg", (extent, L.Int(BLOCK)))
    return L.For(block, L.Int(0), blocks, 1, inner, parallel=True)


def _nest(sid: str, s: P.Statement, sizes: Mapping[str, int] | None,
          bounds: Mapping[str, tuple[L.IExpr, L.IExpr]] | None = None) -> L.Node:
    """The sequential nest, in index order; `bounds` narrows some indices' loops."""
    names = [f"{sid.lower()}_{k}" for k in range(len(s.reduction_indices))]
    node: L.Node = L.Run(sid, tuple(L.Var(n) for n in names))
    for name, index in reversed(list(zip(names, s.reduction_indices))):
        r = s.range_of(index)
        lo, hi = (bounds or {}).get(index, (size_index(r.lo, sizes), size_index(r.hi, sizes)))
        node = L.For(name, lo, hi, 1, node)
    return node
