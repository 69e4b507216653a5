"""isl AST -> loop IR: the last stage that sees isl.

isl's AST generator turns the schedule tree into loops. While it builds each `for`, a
callback decides, exactly as PPCG's CPU path does, whether that loop carries a dependence:
equate the outer schedule dimensions of every dependence and test whether the current one
stays equal. A loop that carries none is parallel; one that carries only reduction
self-dependences is a reduction loop. The AST is then walked into `loop_ir` nodes; each
statement call's arguments are the statement's indices as expressions of the loops, and
each statement's value has its subscripts lowered to index expressions (polyhedral/subscripts.py).
"""

from __future__ import annotations

from dataclasses import replace

import islpy as isl

from polyhedral import loop_ir as L
from polyhedral.affexpr import pw_aff_expr
from polyhedral.dependences import Dependences
from polyhedral.isl_callbacks import build_ast, descendants, map_bottom_up, maps, pieces, \
    pw_affs, sets
from polyhedral.packing import PACK_MARK, PACK_STATEMENT, PackPlan
from polyhedral.register_tiles import UNROLL_MARK
from polyhedral.scop import Scop, tensor_box
from polyhedral.statement_groups import SPLIT_STATEMENTS
from polyhedral.scatter_loops import (atomic_scatters, expand_scatters, scatter_def,
                                      threaded_scatters)
from polyhedral.subscripts import lower_value, size_index
from tclang.lang import program as P
from tclang.lang.recurrences import recurrence_reads
from tclang.dtypes import identity

_BINARY = {
    isl.ast_expr_op_type.add: "add", isl.ast_expr_op_type.sub: "sub",
    isl.ast_expr_op_type.mul: "mul", isl.ast_expr_op_type.div: "div_nonneg",
    isl.ast_expr_op_type.fdiv_q: "floordiv", isl.ast_expr_op_type.pdiv_q: "div_nonneg",
    isl.ast_expr_op_type.pdiv_r: "rem", isl.ast_expr_op_type.zdiv_r: "rem",
    isl.ast_expr_op_type.min: "min", isl.ast_expr_op_type.max: "max",
    isl.ast_expr_op_type.lt: "lt", isl.ast_expr_op_type.le: "le",
    isl.ast_expr_op_type.gt: "gt", isl.ast_expr_op_type.ge: "ge",
    isl.ast_expr_op_type.eq: "eq", isl.ast_expr_op_type.and_: "and",
    isl.ast_expr_op_type.and_then: "and", isl.ast_expr_op_type.or_: "or",
    isl.ast_expr_op_type.or_else: "or",
}


class _Lowering:
    def __init__(self, scop: Scop, deps: Dependences | None, unroll: int = 0,
                 launches: dict | None = None, parallel: bool = True, vectorize: bool = True,
                 packs: dict[str, PackPlan] | None = None):
        self.scop = scop
        self.packs = packs or {}
        # tensor -> (its packed buffer, the box's offsets) after a packing copy, for the
        # statement instances that follow it (the copy's own loops enclose them)
        self.packed: dict[str, tuple[str, tuple[L.IExpr, ...]]] = {}
        self.vectorize = vectorize  # False: Options(vectorize=False), no SIMD hints
        self.deps = deps
        self.unroll = unroll
        self.parallel = parallel  # False: Options(parallel=False), no loop runs on threads
        self.launches = launches or {}
        self.derived = {name: size_index(e, None) for name, e in scop.derived.items()}
        self.unrolling = False  # inside a register tile's points (UNROLL_MARK)

    # ---- AST generation with parallelism annotations ----
    def ast(self, schedule: isl.Schedule, extra_context: isl.Set | None = None) -> isl.AstNode:
        ctx = self.scop.ctx
        ctx.set_ast_build_detect_min_max(1)
        context = self.scop.context if extra_context is None else extra_context
        build = isl.AstBuild.from_context(context)
        deps = _LoopDependences(self.deps, len(self.scop.statements) <= SPLIT_STATEMENTS)

        def before_for(build: isl.AstBuild) -> isl.Id:
            schedule_map = build.get_schedule()
            validity, order_free = deps.of(schedule_map)
            ordered_ok = _carries_nothing(schedule_map, validity)
            parallel = ordered_ok and _carries_nothing(schedule_map, order_free)
            reduction = ordered_ok and not parallel
            return isl.Id(f"loop_p{int(parallel)}_r{int(reduction)}", context=ctx)

        def serial(build: isl.AstBuild) -> isl.Id:  # isl's answer after a failure (raised)
            return isl.Id("loop_p0_r0", context=ctx)

        self.promoting: dict[str, tuple] = {}  # kernel -> its shared tiles, while inside it
        return build_ast(build, drop_members_after_injective_prefix(schedule), before_for,
                         serial)

    # ---- AST -> loop IR ----
    def node(self, ast: isl.AstNode) -> L.Node:
        t = ast.get_type()
        if t == isl.ast_node_type.for_:
            return self._for(ast)
        if t == isl.ast_node_type.if_:
            other = self.node(ast.if_get_else_node()) if ast.if_has_else_node() else None
            return L.If(self.expr(ast.if_get_cond()), self.node(ast.if_get_then_node()), other)
        if t == isl.ast_node_type.block:
            children = ast.block_get_children()
            return L.Block(tuple(self.node(children.get_at(k))
                                 for k in range(children.n_ast_node())))
        if t == isl.ast_node_type.user:
            call = ast.user_get_expr()
            sid = call.get_op_arg(0).get_id().get_name()
            args = tuple(self.expr(call.get_op_arg(k)) for k in range(1, call.get_op_n_arg()))
            if sid.startswith("tc_copy_"):
                return self._copies(self.launches[sid[len("tc_copy_"):]], args)
            if sid.startswith("tc_sync_"):
                return L.Barrier()  # the next tile's copies must not overwrite these
            if sid.startswith(PACK_STATEMENT):
                return self._pack(self.packs[sid[len(PACK_STATEMENT):]], args)
            return L.Run(sid, args, self._promotions(sid, args))
        if t == isl.ast_node_type.mark:
            name = ast.mark_get_id().get_name()
            if name == UNROLL_MARK:  # loops of constant bounds in it: see _for
                saved, self.unrolling = self.unrolling, True
                body = self.node(ast.mark_get_node())
                self.unrolling = saved
                return body
            if name.startswith(PACK_MARK + "_"):
                plan = self.packs[name[len(PACK_MARK) + 1:]]
                saved, self.packed = self.packed, dict(self.packed)
                body = self.node(ast.mark_get_node())
                self.packed = saved
                dtype = self.scop.definition.tensor
                return L.Scratch(tuple(
                    L.Buffer(op.buffer, dtype(op.tensor).dtype, tuple(L.Int(x) for x in op.shape),
                             "scratch", op.strides) for op in plan.operands), body)
            plan = self.launches.get(name)
            if plan is not None and plan.body is not None:  # built by the mapping itself
                if plan.body == L.Block(()):  # its statements run in an earlier launch
                    return plan.body
                if isinstance(plan.body, L.Block) and \
                        all(isinstance(x, L.Launch) for x in plan.body.body):
                    return plan.body  # launches in sequence (a reduction across blocks)
                return L.Launch(name, plan.grid, plan.block, plan.buffers, plan.body)
            if plan is not None:
                self.promoting = {t.tensor: t for t in plan.shared}
            body = self.node(ast.mark_get_node())
            self.promoting = {}
            if plan is None:
                return body
            buffers = tuple(L.Buffer(tile.buffer, self.scop.definition.tensor(tile.tensor).dtype,
                                     tuple(L.Int(x) for x in tile.sizes), "shared")
                            for tile in plan.shared)
            return L.Launch(name, plan.grid, plan.block, buffers, body)
        raise ValueError(f"unexpected isl AST node {t}")

    # ---- shared-memory promotion ----
    def _copies(self, plan, tile_coords: tuple[L.IExpr, ...]) -> L.Node:
        """Every thread of the block copies part of each promoted box; then a barrier."""
        copies = []
        for tile in plan.shared:
            offset = tuple(pw_aff_expr(o, tile_coords, self.derived) for o in tile.offsets)
            copies.append(self._copy_in(tile, offset, plan.block))
        return L.Block(tuple(copies) + (L.Barrier(),))

    def _copy_in(self, tile, offset: tuple[L.IExpr, ...], block: tuple[int, ...]) -> L.Node:
        """Consecutive threads copy consecutive elements of the box (coalesced), skipping
        the part of a boundary tile that lies outside the tensor."""
        linear, threads = L.Int(0), 1
        for k, extent in enumerate(block):
            linear = L.add(linear, L.Op("mul", (L.Var(f"t{k}"), L.Int(threads))))
            threads *= extent
        volume = 1
        for s in tile.box:
            volume *= s
        flat = L.Var(f"p_{tile.tensor}")
        index, cond, rest = [], None, flat
        for d in reversed(range(len(tile.box))):
            local = L.Op("rem", (rest, L.Int(tile.box[d]))) if d > 0 else rest
            rest = L.Op("div_nonneg", (rest, L.Int(tile.box[d])))
            element = L.add(offset[d], local)
            index.insert(0, element)
            extent = size_index(self.scop.extents[tile.tensor][d], self.scop.sizes)
            inside = L.Op("and", (L.Op("ge", (element, L.Int(0))), L.Op("lt", (element, extent))))
            cond = inside if cond is None else L.Op("and", (cond, inside))
        copy = L.Copy(tile.buffer, tile.tensor, "in", tuple(index), offset)
        return L.For(flat.name, linear, L.Int(volume), threads, L.If(cond, copy))

    # ---- packing for the CPU micro-kernel ----
    def _pack(self, plan: PackPlan, prefix: tuple[L.IExpr, ...]) -> L.Node:
        """Copy each operand's box (the part inside the tensor) into its packed buffer, the
        last dimension innermost (contiguous on both sides, vectorized, unless the buffer
        is lanes-first); the reads that follow go to the buffer."""
        copies = []
        for op in plan.operands:
            offset = tuple(pw_aff_expr(o, prefix, self.derived) for o in op.offsets)
            self.packed[op.tensor] = (op.buffer, offset)
            steps = [L.Var(f"{op.buffer}_{d}") for d in range(len(op.shape))]
            node: L.Node = L.Copy(op.buffer, op.tensor, "in",
                                  tuple(L.add(o, p) for o, p in zip(offset, steps)), offset)
            for d in reversed(range(len(op.shape))):
                extent = size_index(self.scop.extents[op.tensor][d], self.scop.sizes)
                hi = L.Op("min", (L.Int(op.shape[d]), L.sub(extent, offset[d])))
                node = L.For(steps[d].name, L.Int(0), hi, 1, node,
                             vectorize=self.vectorize and d == len(op.shape) - 1
                             and op.strides[d] == 1)
            copies.append(node)
        return L.Block(tuple(copies))

    def _promotions(self, sid: str, indices: tuple[L.IExpr, ...]) -> tuple[L.Promotion, ...]:
        if self.packed:
            st = self.scop.statement(sid)
            if st.kind == "init":  # it writes the identity and reads nothing
                return ()
            return tuple(L.Promotion(read.ref, *self.packed[read.tensor])
                         for read in st.source.reads() if read.tensor in self.packed)
        if not self.promoting or sid.startswith("I"):
            return ()
        st = self.scop.statement(sid)
        found = []
        for read in st.source.reads():
            tile = self.promoting.get(read.tensor)
            if tile is not None:
                offset = tuple(pw_aff_expr(o, indices, self.derived)
                               for o in tile.statement_offsets[sid])
                found.append(L.Promotion(read.ref, tile.buffer, offset))
        return tuple(found)

    def _for(self, ast: isl.AstNode) -> L.For:
        var = ast.for_get_iterator().get_id().get_name()
        lo = self.expr(ast.for_get_init())
        body = self.node(ast.for_get_body())
        note = ast.get_annotation().get_name() if ast.get_annotation() else "loop_p0_r0"
        parallel, reduction = note.endswith("p1_r0") and self.parallel, note.endswith("r1")
        if ast.for_is_degenerate():
            hi, step = L.add(lo, L.Int(1)), 1
        else:
            hi = self._upper(var, ast.for_get_cond())
            step = ast.for_get_inc().get_val().to_python()
        loops = [n for n in L.walk_nodes(body) if isinstance(n, L.For)]
        if self.unrolling and isinstance(lo, L.Int) and isinstance(hi, L.Int):
            # a register tile's point loop: the backend unrolls it, and makes an innermost
            # one whose iterations carry nothing (whatever the threads) vector lanes
            return L.For(var, lo, hi, step, body, reduction=reduction, unrolled=True,
                         vectorize=self.vectorize and not loops and note.endswith("p1_r0"))
        if ast.for_is_degenerate():
            return L.For(var, lo, hi, 1, body)
        innermost = all(n.unrolled for n in loops)
        return L.For(var, lo, hi, step, body, parallel=parallel,
                     vectorize=self.vectorize and innermost and (parallel or reduction),
                     reduction=reduction,
                     unroll=self.unroll if innermost else 0)

    def _upper(self, var: str, cond: isl.AstExpr) -> L.IExpr:
        """isl writes loop conditions as `var <= e` or `var < e`: the exclusive bound."""
        op = cond.get_op_type()
        first = cond.get_op_arg(0)
        if first.get_type() != isl.ast_expr_type.id or first.get_id().get_name() != var:
            raise ValueError(f"unexpected loop condition {cond.to_C_str()}")
        bound = self.expr(cond.get_op_arg(1))
        if op == isl.ast_expr_op_type.le:
            return L.add(bound, L.Int(1))
        if op == isl.ast_expr_op_type.lt:
            return bound
        raise ValueError(f"unexpected loop condition {cond.to_C_str()}")

    def expr(self, e: isl.AstExpr) -> L.IExpr:
        return ast_expr(e, self.derived)


def ast_expr(e: isl.AstExpr, derived: dict[str, L.IExpr]) -> L.IExpr:
    """An isl AST expression as a loop-IR index expression; `derived` gives the value of
    each derived parameter (a product of sizes, see polyhedral.scop)."""
    t = e.get_type()
    if t == isl.ast_expr_type.id:
        name = e.get_id().get_name()
        return derived.get(name, L.Var(name))
    if t == isl.ast_expr_type.int:
        return L.Int(e.get_val().to_python())
    op = e.get_op_type()
    args = [ast_expr(e.get_op_arg(k), derived) for k in range(e.get_op_n_arg())]
    if op == isl.ast_expr_op_type.minus:
        return L.Op("neg", (args[0],))
    if op in (isl.ast_expr_op_type.select, isl.ast_expr_op_type.cond):
        return L.Op("select", tuple(args))
    name = _BINARY[op]
    result = args[0]
    for arg in args[1:]:  # min and max are n-ary in isl
        result = L.Op(name, (result, arg))
    return result


def drop_members_after_injective_prefix(schedule: isl.Schedule) -> isl.Schedule:
    """The schedule without the band members that come after an injective prefix.

    Once the outer schedule dimensions tell every instance apart, later members order
    nothing: every loop they give is degenerate, so dropping them keeps the order. They
    must go because isl's AST generator miscompiles some of them: when isl's scheduler
    carries a reduction in program order (`reorder_reductions=False`) it linearizes the
    indices into one dimension (`8j + 4k + 2l + m` over 2x2x2x2), then adds the members
    `j, k, l` for full rank; from that tree isl's AST generator (islpy 2026.2) emits a
    guard that runs only the instances with `l = 0` (fuzz program 262). Without the
    redundant members it recovers every index from the linearized one correctly.
    The trigger is a member that combines indices (the linearization): schedules
    without one (nearly all) skip the injectivity tests, which would cost up to a
    quarter of the AST stage."""
    if not _combines_indices(schedule):
        return schedule

    def visit(node: isl.ScheduleNode) -> isl.ScheduleNode:
        if node.get_type() != isl.schedule_node_type.band:
            return node
        needed = _members_needed(node)
        if needed == 0:
            return node.delete()
        if needed < node.band_n_member():
            return node.band_split(needed).child(0).delete().parent()
        return node

    return map_bottom_up(schedule, visit)


def _combines_indices(schedule: isl.Schedule) -> bool:
    """Whether some band member is a function of two or more indices of a statement."""
    for node in descendants(schedule.get_root()):
        if node.get_type() != isl.schedule_node_type.band:
            continue
        partial = node.band_get_partial_schedule()
        for k in range(node.band_n_member()):
            for pa in pw_affs(partial.get_at(k)):
                for _, aff in pieces(pa):
                    if sum(aff.involves_dims(isl.dim_type.in_, j, 1)
                           for j in range(aff.dim(isl.dim_type.in_))) > 1:
                        return True
    return False


def _members_needed(band: isl.ScheduleNode) -> int:
    """How many leading members of `band`, after its prefix, tell its instances apart
    (all of them when even the whole band does not)."""
    domain = band.get_domain()
    time = band.get_prefix_schedule_union_map().intersect_domain(domain)
    partial = band.band_get_partial_schedule()
    for needed in range(band.band_n_member()):
        if time.is_injective():
            return needed
        member = isl.UnionMap.from_union_pw_aff(partial.get_at(needed))
        time = time.flat_range_product(member.intersect_domain(domain))
    return band.band_n_member()


class _LoopDependences:
    """The dependences among the statements of a loop, for the test of what it carries.

    coincidence = validity + the reductions' order-free self-dependences: the two parts are
    tested apart, each only once per loop (the test dominates AST build time). A program
    of few statements tests the whole program's; one of more than SPLIT_STATEMENTS has
    many loops, each over a few of its statements, and tests only the dependences among
    those (the answer is the same: the others do not meet the loop's instances), found
    per pair of statements instead of a pass over all of them per loop."""

    def __init__(self, deps: Dependences, whole: bool):
        self.deps = deps
        self.whole = whole
        self.known: dict[frozenset[str], tuple[isl.UnionMap, isl.UnionMap]] = {}
        if self.whole:
            validity = deps.validity
            self.all = (validity, deps.coincidence.subtract(validity).coalesce())

    def of(self, schedule_map: isl.UnionMap) -> tuple[isl.UnionMap, isl.UnionMap]:
        """(validity, order-free) dependences among the statements of `schedule_map`."""
        if self.whole:
            return self.all
        key = frozenset(m.get_tuple_name(isl.dim_type.in_) for m in maps(schedule_map))
        if key not in self.known:
            among = self.deps.among(key)
            self.known[key] = (among.validity, among.coincidence.subtract(among.validity))
        return self.known[key]


def _carries_nothing(schedule_map: isl.UnionMap, deps: isl.UnionMap) -> bool:
    """Whether the innermost dimension of `schedule_map` carries none of `deps` (PPCG)."""
    in_time = deps.apply_domain(schedule_map).apply_range(schedule_map)
    if in_time.is_empty():
        return True
    relation = isl.Map.from_union_map(in_time)
    last = relation.dim(isl.dim_type.out) - 1
    for k in range(last):
        relation = relation.equate(isl.dim_type.in_, k, isl.dim_type.out, k)
    same = isl.Map.universe(relation.get_space()).equate(isl.dim_type.in_, last,
                                                         isl.dim_type.out, last)
    return relation.is_subset(same)




def statement_defs(scop: Scop) -> tuple[L.StatementDef, ...]:
    defs = []
    for st in scop.statements:
        s = st.source
        dtype = scop.definition.tensor(s.target).dtype
        if s.is_scatter:
            defs.append(scatter_def(st.id, s, scop.sizes, dtype))
            continue
        if st.kind == "init":
            value: P.Expr = P.Const(identity(s.op, dtype), dtype)
        else:
            value = lower_value(s.rhs, scop.sizes)
        defs.append(L.StatementDef(st.id, s.target, st.indices, s.indices, st.kind, s.op,
                                   value, s.text, s.span.line))
    return tuple(defs)


def buffers(scop: Scop) -> tuple[L.Buffer, ...]:
    d = scop.definition
    return tuple(L.Buffer(t.name, t.dtype, tuple(size_index(e, scop.sizes) for e in t.shape),
                          t.role) for t in d.inputs + d.outputs + d.temporaries)


def zero_filled(scop: Scop) -> tuple[str, ...]:
    """Outputs and temporaries some point of which no statement writes, or whose first
    access reads the initial contents (a `+=`, or the float32 start of a widened half `+=`,
    see tclang/lang/half_accumulators.py): they start as zeros."""
    d = scop.definition
    first: dict[str, P.Statement] = {}  # each tensor's first accessing statement
    for s in d.statements:
        for name in [s.target] + [r.tensor for r in s.reads()]:
            first.setdefault(name, s)
    written = scop.writes.range()
    result = []
    for t in d.outputs + d.temporaries:
        if first[t.name].target != t.name or \
                (first[t.name].is_reduction and not first[t.name].reset):
            result.append(t.name)
            continue
        box = tensor_box(scop, t.name).intersect_params(scop.context)
        if not box.is_subset(written.extract_set(box.get_space())):
            result.append(t.name)
    return tuple(result) + _read_before_written(scop, result)


def _read_before_written(scop: Scop, already: list[str]) -> tuple[str, ...]:
    """Tensors some statement reads at a point no earlier statement wrote: it reads their
    initial contents, zeros. (`O(j, k) max=! A(j, k) where k in 1:Q` then `O(j, k) =
    O(j, k) * 2` writes every point of O, but the second statement reads column 0 first.)
    One pass in program order, each tensor's written points so far as an isl set; a tensor
    is done once some statement's writes leave no point of it unwritten."""
    d = scop.definition
    candidates = {t.name for t in d.outputs + d.temporaries} - set(already)
    if not candidates:
        return ()
    domains = {s.get_tuple_name(): s for s in sets(scop.domain)}
    writes = {m.get_tuple_name(isl.dim_type.in_): m for m in maps(scop.writes)}
    written: dict[str, isl.Set] = {}
    done: set[str] = set()  # every point written: no later read sees the initial contents
    found: list[str] = []
    for st in scop.statements:
        domain = domains.get(st.id)
        if domain is None:  # no instance
            continue
        s = st.source
        if st.kind != "init":
            accessed = [((s.target, writes[st.id], False) if st.kind == "reduce" and
                         not s.reset else None)]
            recurrent = {r.ref for r in recurrence_reads(s)}
            for read in s.reads():
                if read.tensor in candidates:
                    accessed.append((read.tensor, scop.ref_reads.get((st.id, read.ref)),
                                     read.ref in recurrent))
            for tensor, access, recurs in filter(None, accessed):
                if tensor in done or tensor in found or tensor not in candidates:
                    continue
                before = written.get(tensor)
                points = None if access is None else access.intersect_domain(domain).range()
                if points is not None and recurs:
                    # a recurrence reads what this statement wrote earlier (recurrences.py)
                    points = points.subtract(writes[st.id].intersect_domain(domain).range())
                    before = before if before is not None else points.empty(points.space)
                if points is None or before is None or not points.is_subset(before):
                    found.append(tensor)
        target = s.target
        if target in candidates and target not in done and target not in found:
            points = writes[st.id].intersect_domain(domain).range()
            before = written.get(target)
            now = points if before is None else before.union(points).coalesce()
            written[target] = now
            box = tensor_box(scop, target).intersect_params(scop.context)
            if box.is_subset(now):
                done.add(target)
    return tuple(found)


def pw_aff_index(pa: isl.PwAff, scop: Scop) -> L.IExpr:
    """A piecewise affine function of the sizes as an index expression."""
    build = isl.AstBuild.from_context(scop.context)
    return _Lowering(scop, None).expr(build.expr_from_pw_aff(pa.gist_params(scop.context)))


def _serial_launches(node: L.Node) -> L.Node:
    """On a GPU every statement runs in a kernel: wrap those outside any launch in a
    one-thread launch. Host code keeps only sequences and conditions on the sizes."""
    match node:
        case L.Launch():
            return node
        case L.Run():
            return L.Launch("serial", (L.Int(1),), (1,), (), node)
        case L.Block(body=items):
            return L.Block(tuple(_serial_launches(i) for i in items))
        case L.If(cond=c, then=t, other=o):
            return L.If(c, _serial_launches(t), _serial_launches(o) if o is not None else None)
        case L.For():
            raise ValueError("a loop outside every kernel of a GPU schedule")
    return node


def hoist_invariant_conditions(node: L.Node) -> L.Node:
    """`for (...) if (c) A else B` -> `if (c) for (...) A else for (...) B` where `c` does
    not depend on the loop: isl tests whether a register tile is full inside the reduction
    loops around it, and a loop whose body is one straight run of updates is what lets
    the backend keep the updated elements in registers through it. The body is not
    copied; the loop's bounds are evaluated in either branch as before."""
    match node:
        case L.Block(body=(item,)):
            return hoist_invariant_conditions(item)
        case L.Block(body=items):
            return L.Block(tuple(hoist_invariant_conditions(i) for i in items))
        case L.For(body=L.Block(body=(item,))):
            return hoist_invariant_conditions(replace(node, body=item))
        case L.If(cond=c, then=t, other=o):
            return L.If(c, hoist_invariant_conditions(t),
                        hoist_invariant_conditions(o) if o is not None else None)
        case L.For(body=L.If(cond=c, then=t, other=o)) if not L.uses_var(c, node.var) \
                and not node.parallel:
            then = hoist_invariant_conditions(replace(node, body=t))
            other = hoist_invariant_conditions(replace(node, body=o)) if o is not None else None
            return L.If(c, then, other)
        case L.For(body=body) | L.Scratch(body=body):
            node = replace(node, body=hoist_invariant_conditions(body))
            if isinstance(node, L.For) and isinstance(node.body, L.If) \
                    and not L.uses_var(node.body.cond, node.var) and not node.parallel:
                # a condition hoisted out of the loop inside leaves this one too (the
                # register tile's full-tile test, through every reduction loop around it)
                return hoist_invariant_conditions(node)
            return node
    return node


def lower_to_loops(scop: Scop, schedule: isl.Schedule, deps: Dependences, name: str,
                   unroll: int = 0, launches: dict | None = None,
                   parallel: bool = True, vectorize: bool = True,
                   packs: dict[str, PackPlan] | None = None, reorder: bool = True) -> L.Kernel:
    lowering = _Lowering(scop, deps, unroll, launches, parallel, vectorize, packs)
    body = hoist_invariant_conditions(lowering.node(lowering.ast(schedule)))
    if launches is not None:
        body = _serial_launches(body)
    scatters = {st.id: st.source for st in scop.statements if st.source.is_scatter}
    if scatters:  # after: on a GPU, each scatter has a launch of its own
        atomic = atomic_scatters(scop.statements, scop.definition.tensors,
                                 not reorder) if launches is not None else frozenset()
        threaded = threaded_scatters(scop.statements, scop.definition.tensors, scop.sizes,
                                     not reorder) if launches is None and parallel \
            else frozenset()
        body = expand_scatters(body, scatters, scop.sizes, atomic, threaded)
    sizes = scop.sizes
    extra = tuple(s for plan in (launches or {}).values() for s in plan.statements)
    return L.Kernel(name=name, sizes=scop.definition.sizes,
                    size_values=tuple(sorted(sizes.items())) if sizes is not None else (),
                    buffers=buffers(scop), statements=statement_defs(scop) + extra, body=body,
                    zero_fill=zero_filled(scop))
