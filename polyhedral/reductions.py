"""Parallel reductions inside a GPU block (for +, *, min and max).

A kernel whose band holds one reduction (its update, and its init if it has one) and no
parallel member would otherwise run on one thread. Instead each block takes one point of
the left side at a time; its threads each accumulate a strided share of the reduction
into a private register, then combine the partial results in shared memory by a tree
(halving the active threads, a barrier per level), and thread 0 stores the result. TC had
this only for `+`, through a library; here it is plain loop IR for every reduction
operator, so the interpreter, the CUDA code and its emulation all run the same steps.
The same plan is used when the left side is small and the reduction long, and for row
reductions (softmax's max and sum, layernorm's mean and variance, a matrix-vector product):
each left-side point reads its own row along the reduction's stride-1 subscript, so one
thread per point would read with a stride of a whole row and no reuse across points, while
a block per point reads the row coalesced. Several reductions of one band over the same
left side (softmax's max then sum) run one after the other for each point, which is legal
because each reads the earlier ones' results only at its own point.

The loops built here walk boxes (each statement's index ranges, flattened and strided
over the threads), not the statements' domains that isl's own loops walk: every instance
is run through `_instance`, under the condition its domain adds to the box (a guarded
sum's `c ? e : 0` is in the domain, not in the value: tclang/lang/guarded_sums.py).
"""

from __future__ import annotations

import islpy as isl

from polyhedral import loop_ir as L
from polyhedral.lowering import ast_expr
from polyhedral.isl_callbacks import sets
from polyhedral.scop import Scop, ScopStatement, statement_box
from polyhedral.subscripts import size_index
from tclang.lang import program as P
from tclang.lang.affine import Affine
from tclang.dtypes import DType, identity
from tclang.options import Options
from tclang.target import Target

THREADS = 256
SMALL_OUTPUT = 128  # left-side points below which a long reduction goes across a block
LONG_REDUCTION = 4096
ACROSS_BLOCKS = 1 << 16  # a reduction to one value this long is shared by many blocks
ACROSS_GRID = 1024
# partials a warp shuffle moves in one register (or two): the rest combine by a tree
SHUFFLED = (DType.FLOAT32, DType.FLOAT64, DType.INT32, DType.INT64, DType.UINT32,
            DType.UINT64)


def plan_block_reduction(node: isl.ScheduleNode, scop: Scop, options: Options,
                         target: Target, name: str, parallel_members: int,
                         next_statements: list[str] = ()):
    """(launch body, its buffers, extra statements, grid, block, absorbed) or None if the
    band is not a sequence of reductions worth spreading over a block. `next_statements`:
    those of the band run next; `absorbed` names those the launch runs too (a row
    reduction's elementwise consumers, softmax's division), else it is empty."""
    steps = _reductions(node, scop)
    if steps is None:
        return None
    updates = [st for st in steps if st.kind == "reduce"]
    sizes = scop.sizes
    first = updates[0].source
    lhs = [first.range_of(i) for i in first.indices]
    longest = 0
    if sizes is not None:
        longest = max(_volume([u.source.range_of(i) for i in u.source.reduction_indices], sizes)
                      for u in updates)
    limit = _power_of_two(min(options.block[0] if options.block else THREADS,
                              target.max_threads_per_block))
    if parallel_members:
        if sizes is None:
            return None
        small_output = _volume(lhs, sizes) < SMALL_OUTPUT and longest >= LONG_REDUCTION
        results = {st.source.target for st in steps}
        # (a `+=` with no reduction index is a pointwise step, as an assignment is)
        # a row reduction shorter than a warp (Target.warp) stays on one thread
        rows = longest >= target.warp and all(_reads_own_row(u.source, results)
                                                for u in updates if u.source.reduction_indices)
        if not (small_output or rows):
            return None
        limit = min(limit, _power_of_two(longest))
        followers = _row_followers(next_statements, steps, scop) if rows else None
        if followers:
            return _build(steps, lhs, scop, limit, target, followers) + \
                (tuple(f.id for f in followers),)
    across = _across_blocks(steps, lhs, longest, scop, options)
    if across is not None:
        return _build_across_blocks(across, lhs, longest, scop, limit, target)
    return _build(steps, lhs, scop, limit, target) + ((),)


def _across_blocks(steps, lhs, longest: int, scop: Scop, options: Options):
    """The update if the band is one long reduction to a single value that blocks can share:
    `+`, `min` or `max` of a type with atomic updates, reading nothing it writes, and
    reductions allowed to be reordered (the blocks' results arrive in any order)."""
    if scop.sizes is None or len(steps) != 1 or steps[0].kind != "reduce" or \
            options.reorder_reductions is False or longest < ACROSS_BLOCKS or \
            _volume(lhs, scop.sizes) != 1:
        return None
    st = steps[0]
    s = st.source
    dtype = scop.definition.tensor(s.target).dtype
    if s.op not in ("+", "min", "max") or dtype not in SHUFFLED or \
            any(r.tensor == s.target for r in _all_reads(s)):
        return None
    return st


def _build_across_blocks(st: ScopStatement, lhs, longest: int, scop: Scop, threads: int,
                         target: Target):
    """A reduction to one value over many blocks: the target starts at the identity (a
    launch of one thread, for `op=!`), then each block reduces a strided share into a
    register, its threads combine in shared memory, and its thread 0 combines the block's
    result into the target atomically."""
    s = st.source
    sizes = scop.sizes
    dtype = scop.definition.tensor(s.target).dtype
    blocks = max(1, min(ACROSS_GRID, -(-longest // (threads * 4))))
    t = L.Var("t0")
    lhs_values = _decompose(L.Int(0), lhs, sizes)
    red = [s.range_of(i) for i in s.reduction_indices]
    acc, partial = f"{s.target}_acc", f"{s.target}_partial"
    ident_id = f"R{s.position}"
    identity_def = _identity_statement(ident_id, s, dtype, st)
    to_acc = (L.Promotion(-1, acc, tuple(lhs_values)),)
    r = L.Var("rr")
    first = L.add(L.Op("mul", (L.Var("b0"), L.Int(threads))), t)
    body: list[L.Node] = [
        L.Run(ident_id, tuple(lhs_values), to_acc),
        L.For(r.name, first, _count(red, sizes), blocks * threads,
              _instance(scop, st, lhs_values + _decompose(r, red, sizes), to_acc)),
        L.Combine(None, dtype, partial, (t,), acc, (L.Int(0),) * max(1, len(lhs))),
        L.Barrier(),
        L.BlockCombine(s.op, dtype, partial, threads),
        L.Barrier(),
        L.If(L.Op("eq", (t, L.Int(0))),
             L.Combine(s.op, dtype, s.target, tuple(lhs_values), partial, (L.Int(0),),
                       atomic=True)),
    ]
    buffers = (L.Buffer(partial, dtype, (L.Int(threads),), "shared"),
               L.Buffer(acc, dtype, (L.Int(1),) * max(1, len(lhs)), "private"))
    launches = []
    if s.reset:
        launches.append(L.Launch("identity", (L.Int(1),), (1,), (),
                                 L.Run(ident_id, tuple(lhs_values))))
    launches.append(L.Launch("blocks", (L.Int(blocks),), (threads,), buffers,
                             L.Block(tuple(body))))
    return L.Block(tuple(launches)), (), (identity_def,), (L.Int(blocks),), (threads,), ()


def _row_followers(names, steps: list[ScopStatement], scop: Scop):
    """The next band's statements if each block can run them for its row right after the
    reductions: assignments over the same left side and more indices (softmax's
    `Y(n, d) = exp(X(n, d) - m(n)) / s(n)`), reading the reductions' results only at their
    own row, reading nothing they write themselves, and writing nothing the reductions
    read. Then a row's data is read once from memory, not twice, and one launch does it."""
    followers = [scop.statement(n) for n in names]
    if not followers:
        return None
    first = steps[0].source
    k = len(first.indices)
    results = {st.source.target for st in steps}
    written = {f.source.target for f in followers}
    if written & results or any(r.tensor in written for st in steps
                                for r in _all_reads(st.source)):
        return None
    for f in followers:
        s = f.source
        if f.kind != "assign" or s.reduction_indices or len(s.indices) <= k:
            return None
        for mine, theirs in zip(s.indices[:k], first.indices):
            a, b = s.range_of(mine), first.range_of(theirs)
            if (a.lo, a.hi) != (b.lo, b.hi):
                return None
        own_row = tuple(Affine.index(i) for i in s.indices[:k])
        for read in _all_reads(s):
            if read.tensor in written or read.tensor in results and read.affine != own_row:
                return None
    return followers


def _reductions(node, scop: Scop) -> list[ScopStatement] | None:
    """The band's reductions and assignments in program order, if it holds reductions (+,
    *, min, max) over one left side, their inits, assignments to points of that left side
    (a mean's division by the count, moved out of its reduction), and reads of each other's
    results only at the reading statement's own point."""
    names = [s.get_tuple_name() for s in sets(node.get_domain())]
    statements = [scop.statement(n) for n in names]
    steps = sorted((s for s in statements if s.kind != "init"),
                   key=lambda s: s.source.position)
    updates = [s.source for s in steps if s.kind == "reduce" and s.source.reduction_indices]
    if not updates:
        return None
    if any(s.source not in updates for s in statements if s.kind == "init"):
        return None
    first = updates[0]
    for st in steps:
        s = st.source
        if st.kind == "reduce" and s.op not in ("+", "*", "min", "max") or \
                st.kind == "assign" and s.reduction_indices or \
                s.indices != first.indices or \
                any(s.range_of(i) != first.range_of(i) for i in s.indices):
            return None
    targets = {st.source.target for st in steps}
    own_point = tuple(Affine.index(i) for i in first.indices)
    for st in steps:
        for read in _all_reads(st.source):
            if read.tensor in targets and read.affine != own_point:
                return None
    return steps


def _all_reads(s: P.Statement) -> list[P.Read]:
    return [r for e in (s.rhs, *s.exists) for r in P.reads_of(e)]


def _reads_own_row(s: P.Statement, results: set[str]) -> bool:
    """Whether every read of `s` (but the band's own results, read at this point) either
    holds the whole left side (each point reads its own data) or none of it (a vector all
    points share), and walks its last subscript with the innermost reduction index only:
    the shape of a row reduction."""
    lhs = set(s.indices)
    innermost = s.reduction_indices[-1]
    walks = False
    for read in _all_reads(s):
        if read.tensor in results:
            continue
        if read.is_gather:
            return False
        if not read.affine:
            continue  # a scalar: shared by every row
        used = set().union(*(a.indices() for a in read.affine))
        if used & lhs and not lhs <= used:
            return False  # part of the left side: reuse across points, not a row
        last = read.affine[-1]
        if last.indices() & lhs:
            return False  # the left side walks the stride-1 subscript: threads coalesce
        walks = walks or (last.indices() == {innermost} and last.coefficient(innermost) == 1
                          and bool(used & lhs))
    return walks


def _build(steps: list[ScopStatement], lhs, scop: Scop, threads: int, target: Target,
           followers: list[ScopStatement] = ()):
    sizes = scop.sizes
    points = _count(lhs, sizes)
    grid_cap = target.max_grid[0]
    grid = L.Op("max", (L.Int(1), L.Op("min", (L.Int(grid_cap), points))))
    q, t = L.Var("rq"), L.Var("t0")
    lhs_values = _decompose(q, lhs, sizes)
    body: list[L.Node] = []
    buffers: list[L.Buffer] = []
    identities = []
    for st in steps:
        s = st.source
        if st.kind == "assign":  # one thread computes the point; the others wait for it
            body += [L.If(L.Op("eq", (t, L.Int(0))), _instance(scop, st, lhs_values)),
                     L.Barrier()]
            continue
        dtype = scop.definition.tensor(s.target).dtype
        red = [s.range_of(i) for i in s.reduction_indices]
        r = L.Var("rr")
        again = sum(x.source.target == s.target for x in steps if x.kind == "reduce") > 1
        tag = f"{s.target}{s.position if again else ''}"  # two reductions into one tensor
        acc, partial = f"{tag}_acc", f"{tag}_partial"
        ident_id = f"R{s.position}"
        identities.append(_identity_statement(ident_id, s, dtype, st))
        to_acc = (L.Promotion(-1, acc, tuple(lhs_values)),)
        body += [
            L.Run(ident_id, tuple(lhs_values), to_acc),
            L.For(r.name, t, _count(red, sizes), threads,
                  _instance(scop, st, lhs_values + _decompose(r, red, sizes), to_acc)),
            L.Combine(None, dtype, partial, (t,), acc, (L.Int(0),) * max(1, len(lhs))),
            L.Barrier(),
        ]
        shuffled = threads >= target.warp and dtype in SHUFFLED
        if shuffled:
            body += [L.BlockCombine(s.op, dtype, partial, threads), L.Barrier()]
        half = 0 if shuffled else threads // 2
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
        # the next reduction may read this result, the next point reuses the partials
        body.append(L.Barrier())
        buffers += [L.Buffer(partial, dtype, (L.Int(threads),), "shared"),
                    L.Buffer(acc, dtype, (L.Int(1),) * max(1, len(lhs)), "private")]
    for f in followers:  # the rest of each follower's indices, strided over the threads
        rest = [f.source.range_of(i) for i in f.source.indices[len(lhs):]]
        e = L.Var("re")
        body.append(L.For(e.name, t, _count(rest, sizes), threads,
                          _instance(scop, f, lhs_values + _decompose(e, rest, sizes))))
    if followers:
        body.append(L.Barrier())  # (the next row's first step overwrites nothing they read)
    loop = L.For(q.name, L.Var("b0"), points, grid_cap, L.Block(tuple(body)))
    return loop, tuple(buffers), tuple(identities), (grid,), (threads,)


def _instance(scop: Scop, st: ScopStatement, values: list[L.IExpr],
              promoted: tuple[L.Promotion, ...] = ()) -> L.Node:
    """A run of `st` at `values` (its indices as the launch's loops compute them: a point
    of the box of its ranges) under the condition its domain adds to that box. A run
    outside the domain is an instance the source does not have: `Z(i) +=! (j <= i) ?
    S(i, j) : 0` would add S(i, j) for every j."""
    run = L.Run(st.id, tuple(values), promoted)
    guard = _domain_guard(scop, st)
    if guard is None:
        return run
    at = {L.index_var(name).name: value for name, value in zip(st.indices, values)}
    return L.If(L.substitute(guard, at), run)


def _domain_guard(scop: Scop, st: ScopStatement) -> L.IExpr | None:
    """What the domain of `st` adds to the box of its ranges, as a test of its index
    variables (`L.index_var`) and the sizes, written by isl's AST generator; None where
    the domain is the whole box. Taken from the domain itself, whatever put the
    constraint there."""
    box = statement_box(scop, st)
    domain = scop.domain.extract_set(box.get_space())
    if box.is_subset(domain):
        return None
    extra = domain.gist(box)
    for k, name in enumerate(st.indices):  # parameters now: no size has these names
        extra = extra.set_dim_id(isl.dim_type.set, k,
                                 isl.Id(L.index_var(name).name, context=scop.ctx))
    extra = extra.move_dims(isl.dim_type.param, extra.dim(isl.dim_type.param),
                            isl.dim_type.set, 0, len(st.indices)).params()
    build = isl.AstBuild.from_context(isl.Set.universe(extra.get_space()))
    derived = {name: size_index(e, None) for name, e in scop.derived.items()}
    return ast_expr(build.expr_from_set(extra), derived)


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
