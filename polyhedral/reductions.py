"""Parallel reductions inside a GPU block (for +, *, min and max).

A kernel whose band holds one reduction (its update, and its init if it has one) and no
parallel member would otherwise run on one thread. Instead each block takes one point of
the left side at a time; its threads each accumulate a strided share of the reduction
into a private register, then combine the partial results in shared memory by a tree
(halving the active threads, a barrier per level), and thread 0 stores the result. TC had
this only for `+`, through a library; here it is plain loop IR for every reduction
operator, so the interpreter, the CUDA code and its emulation all run the same steps.
The same plan is used when the left side is small and the reduction long.
"""

from __future__ import annotations

import islpy as isl

from polyhedral import loop_ir as L
from polyhedral.loop_ir import size_index
from polyhedral.scop import Scop, ScopStatement
from tclang import program as P
from tclang.dtypes import identity
from tclang.options import Options
from tclang.target import Target

THREADS = 256
SMALL_OUTPUT = 128  # left-side points below which a long reduction goes across a block
LONG_REDUCTION = 4096


def plan_block_reduction(node: isl.ScheduleNode, scop: Scop, options: Options,
                         target: Target, name: str, parallel_members: int):
    """(launch body, its buffers, extra statements, grid, block) or None if the band is not
    a single reduction worth spreading over a block."""
    st = _single_reduction(node, scop)
    if st is None:
        return None
    sizes = scop.sizes
    lhs = [st.source.range_of(i) for i in st.source.indices]
    red = [st.source.range_of(i) for i in st.source.reduction_indices]
    if parallel_members:
        if sizes is None:
            return None
        points = _volume(lhs, sizes)
        if points >= SMALL_OUTPUT or _volume(red, sizes) < LONG_REDUCTION:
            return None
    threads = _power_of_two(min(options.block[0] if options.block else THREADS,
                                target.max_threads_per_block))
    return _build(st, lhs, red, scop, threads, name, target)


def _single_reduction(node, scop: Scop) -> ScopStatement | None:
    names = []
    node.get_domain().foreach_set(lambda s: names.append(s.get_tuple_name()))
    statements = [scop.statement(n) for n in names]
    updates = [s for s in statements if s.kind == "reduce" and s.source.reduction_indices]
    if len(updates) != 1:
        return None
    update = updates[0]
    others = [s for s in statements if s is not update]
    if any(s.kind != "init" or s.source is not update.source for s in others):
        return None
    if update.source.op not in ("+", "*", "min", "max"):
        return None
    return update


def _build(st: ScopStatement, lhs, red, scop: Scop, threads: int, name: str, target: Target):
    s = st.source
    dtype = scop.definition.tensor(s.target).dtype
    sizes = scop.sizes
    points = _count(lhs, sizes)
    grid_cap = target.max_grid[0]
    grid = L.Op("max", (L.Int(1), L.Op("min", (L.Int(grid_cap), points))))
    acc, partial = f"{s.target}_acc", f"{s.target}_partial"
    ident_id = f"R{s.position}"
    ident = _identity_statement(ident_id, s, dtype, st)
    q, r, t = L.Var("rq"), L.Var("rr"), L.Var("t0")
    lhs_values = _decompose(q, lhs, sizes)
    red_values = _decompose(r, red, sizes)
    to_acc = (L.Promotion(-1, acc, tuple(lhs_values)),)
    body = [
        L.Run(ident_id, tuple(lhs_values), to_acc),
        L.For(r.name, t, _count(red, sizes), threads,
              L.Run(st.id, tuple(lhs_values) + tuple(red_values), to_acc)),
        L.Combine(None, dtype, partial, (t,), acc, (L.Int(0),) * max(1, len(lhs))),
        L.Barrier(),
    ]
    half = threads // 2
    while half >= 1:
        body.append(L.If(L.Op("lt", (t, L.Int(half))),
                         L.Combine(s.op, dtype, partial, (t,), partial,
                                   (L.add(t, L.Int(half)),))))
        body.append(L.Barrier())
        half //= 2
    final_op = None if s.reset else s.op
    body.append(L.If(L.Op("eq", (t, L.Int(0))),
                     L.Combine(final_op, dtype, s.target, tuple(lhs_values), partial,
                               (L.Int(0),))))
    body.append(L.Barrier())  # the next point reuses the partial results
    loop = L.For(q.name, L.Var("b0"), points, grid_cap, L.Block(tuple(body)))
    buffers = (L.Buffer(partial, dtype, (L.Int(threads),), "shared"),
               L.Buffer(acc, dtype, (L.Int(1),) * max(1, len(lhs)), "private"))
    return loop, buffers, (ident,), (grid,), (threads,)


def _identity_statement(sid: str, s: P.Statement, dtype, st: ScopStatement) -> L.StatementDef:
    return L.StatementDef(sid, s.target, s.indices, s.indices, "init", s.op,
                          P.Const(identity(s.op, dtype), dtype), s.text, s.span.line)


def _decompose(flat: L.IExpr, ranges, sizes) -> list[L.IExpr]:
    """Row-major coordinates of `flat` in the box of `ranges` (each from lo to hi)."""
    values: list[L.IExpr] = []
    rest = flat
    for k in reversed(range(len(ranges))):
        extent = _extent(ranges[k], sizes)
        here = L.Op("rem", (rest, extent)) if k > 0 else rest
        values.insert(0, L.add(size_index(ranges[k].lo, sizes), here))
        rest = L.Op("div_nonneg", (rest, extent))
    return values


def _extent(r: P.IndexRange, sizes) -> L.IExpr:
    return L.Op("max", (L.Int(0), size_index(r.extent, sizes)))


def _count(ranges, sizes) -> L.IExpr:
    total: L.IExpr = L.Int(1)
    for r in ranges:
        total = L.Op("mul", (total, _extent(r, sizes)))
    return total


def _volume(ranges, sizes) -> int:
    return L.evaluate(_count(ranges, sizes), {})


def _power_of_two(n: int) -> int:
    p = 1
    while p * 2 <= n:
        p *= 2
    return p
