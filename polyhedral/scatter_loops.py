"""The loops of scatters (tclang/lang/scatters.py), which isl schedules as single points.

In the scop a scatter is one instance that reads and writes the whole of each tensor it
touches (polyhedral/scop.py): any of its updates may land on any element of its target,
so every statement before it that writes what it reads or updates, and every statement
after it that reads its target, is ordered around all of it. Here that one instance becomes
its loop nest over the scatter's index ranges, in the statement's index order.

On the CPU a scatter runs on threads (`threaded_scatters`, `parallel_nest`) when its
target is small, at most PRIVATE_ELEMENTS elements at sizes known when compiled (a
histogram's bins, a scatter-max's slots), its type is float32, float64, int32 or int64,
and it has at least PARALLEL_UPDATES updates (or a number known only at run time): the
outermost loop of its nest is marked parallel and reduction, and the backend runs each
chunk of its iterations into a privatized copy of the target, set to the identity, then
merges the copy into the target once with compare-and-swap updates
(backends/llvm/kernel_module.py, `colliding_loop`). Why privatized copies: a small target
is where updates collide most, and a contended atomic update costs tens of cycles where a
private one costs a few (benchmarks/scatters.py, two cores shared with another job: a
histogram of 10^6 ids into 1000 bins 0.48 ms on two threads against 1.05 ms for the
sequential nest). A large target (an embedding backward's table, a scatter-add into 10^5
elements) keeps the sequential nest: a private copy per thread would cost more than its
updates, compare-and-swap updates in place were 3x slower than the sequential nest
(1e6 updates into 100003 elements, two threads), and so were blocks of a plain index on
threads (the `d` of `G(Ids(b, l), d)`: no element touched twice, but the rows walked in
strides; 2x slower on one thread). A target extent known only at run time keeps it too
(a copy's size must be known when compiled). The merge order of the chunks varies, so
colliding float sums may round differently from run to run.

With `Options(reorder_reductions=False)`, or for other types (half, bfloat16, 8- and
16-bit integers, bool), the nest is sequential: colliding updates happen one at a time, in
index order, the same on every run (the reference interpreter runs every nest so).

On a GPU a scatter gets a launch of one thread per update, each update an atomic one
(`atomic_scatters`); with `Options(reorder_reductions=False)`, or a type CUDA has no atomic
update for (half, bfloat16, 8- and 16-bit integers, an int64 min or max), one thread runs
the nest in index order instead. Each update's subscripts are checked against the target's
extents first.
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


#: the CPU scatter types whose colliding updates the backend combines (privatized copies
#: merged with compare-and-swap updates of 32- and 64-bit elements)
THREADED_TYPES = ("float32", "float64", "int32", "int64")
PARALLEL_UPDATES = 1 << 15  # fewer updates (at known sizes): the sequential nest
PRIVATE_ELEMENTS = 4096  # the largest target privatized (backends/llvm/kernel_module.py)


def threaded_scatters(scop_statements, tensors, sizes: Mapping[str, int] | None,
                      deterministic: bool) -> frozenset[str]:
    """The scatters a CPU kernel runs on threads (`parallel_nest`): none where the order
    must be fixed (`Options(reorder_reductions=False)`), else those of a type in
    THREADED_TYPES whose target has at most PRIVATE_ELEMENTS elements at sizes known
    when compiled, with at least PARALLEL_UPDATES updates (or a number known only at run
    time: the backend's own threshold then keeps a small loop on one thread)."""
    if deterministic:
        return frozenset()
    chosen = set()
    for st in scop_statements:
        s = st.source
        target = tensors[s.target] if s.is_scatter else None
        if target is None or target.dtype.value not in THREADED_TYPES:
            continue
        elements = _product([size_index(e, sizes) for e in target.shape])
        if elements is None or not 0 < elements <= PRIVATE_ELEMENTS:
            continue
        updates = _product([L.sub(size_index(s.range_of(i).hi, sizes),
                                  size_index(s.range_of(i).lo, sizes))
                            for i in s.reduction_indices])
        if updates is None or updates >= PARALLEL_UPDATES:
            chosen.add(st.id)
    return frozenset(chosen)


def _product(extents: list[L.IExpr]) -> int | None:
    """The product of `extents`, or None where one is known only at run time."""
    total = 1
    for e in extents:
        if not isinstance(e, L.Int):
            return None
        total *= max(0, e.value)
    return total


def parallel_nest(sid: str, s: P.Statement, sizes: Mapping[str, int] | None) -> L.Node:
    """The scatter's sequential nest with its outermost loop marked parallel and
    reduction: its iterations may update the same elements, and the backend combines
    them (backends/llvm/kernel_module.py, `colliding_loop`: a privatized copy of the
    target per chunk of iterations, merged into it once)."""
    return replace(_nest(sid, s, sizes), parallel=True, reduction=True)


def _nest(sid: str, s: P.Statement, sizes: Mapping[str, int] | None) -> L.Node:
    """The sequential nest, in index order."""
    names = [f"{sid.lower()}_{k}" for k in range(len(s.reduction_indices))]
    node: L.Node = L.Run(sid, tuple(L.Var(n) for n in names))
    for name, index in reversed(list(zip(names, s.reduction_indices))):
        r = s.range_of(index)
        node = L.For(name, size_index(r.lo, sizes), size_index(r.hi, sizes), 1, node)
    return node
