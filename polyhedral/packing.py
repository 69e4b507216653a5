"""Packing for the CPU micro-kernel: the operand a register tile reads along its lanes is
copied, one sliver at a time, into a small contiguous per-thread buffer.

BLIS packs both operands of a matmul into micro-panels: the kernel then streams through
contiguous memory whatever the layout of the caller's arrays. Without it, the kc x nr sliver
of B that the register tile reads for each of its mr-row steps is kc rows of nr elements,
one row of B apart: with rows 4 KiB apart (a power-of-two width) all of them fall into the
same L1 set and the sliver is read from L2 on every one of the mc/mr steps; with a
transposed or strided operand the rows are further apart still.

Here the register-tile band [others, j | i, reductions] (see polyhedral/register_tiles.py) is
split after the lane loop `j`. Below it, every mr-row step reuses the same sliver of each
operand that moves with the lanes and not with the rows; its footprint there is a box of
constant size (the same footprint analysis as the GPU's shared-memory promotion,
polyhedral/promotion.py). A statement `tc_pack_<n>` grafted before the rows' loop copies the
box into a buffer of the box's shape (dense, row-major: for a matmul kc x nr, one cache line
a row), and the reads of that operand below it are redirected to the buffer. The buffer is a
`Scratch` of the thread that runs the tile: the copy costs one load and store per element of
the sliver against mc/mr register-tile steps that read it.

Only read-only, affine operands are packed, only when each copied element is read by at
least `MIN_REUSE` rows, only boxes that fit the cache the micro-kernel reads the sliver
from (`register_tiles.sliver_bytes`: half of L1, or of L2 with 32 vector registers), and
never a box that is one run of memory already (`in_layout`).
"""

from __future__ import annotations

from dataclasses import dataclass

import islpy as isl

from polyhedral.promotion import footprint_box
from polyhedral.register_tiles import RegisterTile, sliver_bytes
from polyhedral.scop import Scop
from tclang.lang.program import evaluate_shape
from tclang.target import Target

PACK_MARK = "tclang_pack"
"""Marks the sequence [copies, register-tile steps] of one packed sliver (`tclang_pack_<n>`)."""

PACK_STATEMENT = "tc_pack_"
"""The name prefix of the grafted copy statement (`tc_pack_<n>`)."""

MIN_REUSE = 4
"""Register-tile steps (of mr rows) that must read a packed sliver: below it the copy costs
more than the strided reads it saves."""


@dataclass(frozen=True)
class PackedOperand:
    """One operand packed below a register-tile band."""

    tensor: str
    buffer: str
    shape: tuple[int, ...]  # the box: the buffer's shape
    offsets: tuple[isl.PwAff, ...]  # per dimension, in the coordinates of the loops above
    #: the buffer's strides in elements: row-major, or lanes-first for an operand the
    #: lanes read with a stride (W(o, i) of x @ w.T, packed as its transpose)
    strides: tuple[int, ...] = ()


@dataclass(frozen=True)
class PackPlan:
    name: str  # the mark's and (with PACK_STATEMENT) the copy statement's suffix
    operands: tuple[PackedOperand, ...]
    tiles: isl.Set  # the points of the loops above at which something is packed


def pack(node: isl.ScheduleNode, tile: RegisterTile, rows: int, scop: Scop, target: Target,
         plans: dict[str, PackPlan], force: bool = False) -> isl.ScheduleNode:
    """Pack the lane operands of the register-tile band `node` (as `register_tiles.apply`
    ordered it) when `rows` (its rows in one cache tile) reuse them enough, or whenever it
    can with `force`; records the plan in `plans`. Returns the node at the band's position
    (its first part, if it was split)."""
    force = force or bool(tile.transposed)  # unpacked, the lanes would gather
    if tile.kind != "lanes" or (rows < MIN_REUSE * tile.mr and not force):
        return node
    split_at = node.band_n_member() - len(tile.reductions) - 1  # members before the rows'
    if split_at < 1:
        return node
    written = {s.source.target for s in scop.statements}
    tensors: list[str] = []
    for read in scop.statement(tile.statement).source.reads():
        if read.is_gather or read.tensor in written or read.tensor in tensors or \
                _read_twice(scop, tile, read.tensor):
            continue
        names = {i for a in read.affine for i in a.indices()}
        if tile.lanes in names and tile.rows not in names:
            tensors.append(read.tensor)
    if not tensors:
        return node
    outer = node.band_split(split_at)
    inner = outer.child(0)
    domain = inner.get_domain()
    prefix = inner.get_prefix_schedule_union_map().intersect_domain(domain)
    name = str(len(plans))
    plan = _plan(scop, tensors, domain, prefix, sliver_bytes(target), name,
                 lambda tensor, shape, _: _strides(shape, _lane_dimension(scop, tile, tensor)),
                 keep=lambda tensor, shape: tensor in tile.transposed or
                 not in_layout(scop, tensor, shape))
    if plan is None:
        return node  # the band as it was, unsplit
    plans[name] = plan
    marked = inner.insert_mark(isl.Id(f"{PACK_MARK}_{name}", context=node.get_ctx()))
    return marked.parent()


def pack_rows(node: isl.ScheduleNode, tile: RegisterTile, reduction: str, scop: Scop,
              target: Target, plans: dict[str, PackPlan]) -> isl.ScheduleNode:
    """Pack the operand a "lanes" register tile broadcasts along its rows when the
    innermost reduction `reduction` reads it with a stride (A^T of At(k, m) * B(k, n)):
    its mc x kc block, the footprint of one iteration of the cache tiles' loops, copied
    once into a buffer whose rows are padded off multiples of 1 KiB: row by row as in the
    tensor (a vectorized copy) with 32 vector registers, the reduction innermost with 16
    (`_reduction_first`). Read in place, each reduction step of the tile reads a
    new cache line one row of the tensor apart: 4 KiB for a 1024-wide float32 tensor, so
    every step's line fell into the same L1 set; matmul_ta at 1024^3 ran ~10% behind the
    contiguous matmul, ~3% packed so. (Packed transposed, each row along k as BLIS packs A,
    the element-by-element transposing copy cost as much as it saved: ~8%.) The caller
    packs only where at least two register-tile columns reuse the block. `node` is the
    register-tile band (after `pack`); the mark goes above it. Returns the node at the
    band's position."""
    if tile.kind != "lanes":
        return node
    written = {s.source.target for s in scop.statements}
    tensors = []
    for read in scop.statement(tile.statement).source.reads():
        names = {i for a in (read.affine or ()) if a is not None for i in a.indices()}
        if read.is_gather or read.tensor in written or read.tensor in tensors or \
                _read_twice(scop, tile, read.tensor) or \
                tile.rows not in names or tile.lanes in names or reduction not in names:
            continue
        *outer, last = read.affine
        if reduction in last.indices() and abs(last.coefficient(reduction)) == 1 and \
                not any(reduction in a.indices() for a in outer):
            continue  # contiguous along the reduction already
        tensors.append(read.tensor)
    if not tensors:
        return node
    domain = node.get_domain()
    prefix = node.get_prefix_schedule_union_map().intersect_domain(domain)
    name = str(len(plans))
    plan = _plan(scop, tensors, domain, prefix, block_bytes(target), name,
                 lambda tensor, shape, itemsize: _strides(
                     shape, _reduction_first(scop, tile, tensor, reduction, target),
                     itemsize))
    if plan is None:
        return node
    plans[name] = plan
    return node.insert_mark(isl.Id(f"{PACK_MARK}_{name}", context=node.get_ctx()))


def block_bytes(target: Target) -> int:
    """The cache a packed mc x kc block of the rows' operand may fill (`pack_rows`): half
    of L2, where the blocking model keeps it (register_tiles.cache_tiles). Before, the
    block had the sliver's budget, half of L1 with 16 vector registers: a model-sized
    block (256 x 256 float32) never fit, so with AVX2 no strided rows' operand was
    packed (W(k, b) of O(a, b, c) +=! X(a, k, c) * W(k, b) read a row apart a step)."""
    return target.l2_bytes // 2


def _plan(scop: Scop, tensors: list[str], domain: isl.UnionSet, prefix: isl.UnionMap,
          budget: int, name: str, strides, keep=None) -> PackPlan | None:
    """The plan packing each of `tensors` whose footprint under `prefix` is a box of
    constant shape, while their buffers fit `budget` bytes together; `strides(tensor,
    shape, itemsize)` lays each buffer out; `keep(tensor, shape)`, where given, says
    whether a box is worth copying at all. None if nothing is packed."""
    operands, footprint = [], None
    for tensor in tensors:
        box = footprint_box(prefix, _reads_of(scop, tensor, domain))
        if box is None:
            continue
        offsets, shape, tiles = box
        if keep is not None and not keep(tensor, shape):
            continue
        itemsize = scop.definition.tensor(tensor).dtype.numpy.itemsize
        size = itemsize
        for extent in shape:
            size *= extent
        if size > budget:
            continue
        budget -= size
        operands.append(PackedOperand(tensor, f"{tensor}_packed{name}", shape, offsets,
                                      strides(tensor, shape, itemsize)))
        footprint = tiles if footprint is None else footprint.union(tiles)
    return PackPlan(name, tuple(operands), footprint) if operands else None


def in_layout(scop: Scop, tensor: str, box: tuple[int, ...]) -> bool:
    """Whether every box of shape `box` in the row-major `tensor` is one contiguous run
    already (ones, then one partial dimension, then whole dimensions: a sliver X[a][k][:]
    of O(a, b, c) +=! X(a, k, c) * W(k, b) where C is the register tile's width), which a
    copy would only duplicate. Unknown extents count as longer than any box."""
    if not scop.specialized:
        return False
    extents = evaluate_shape(scop.definition.tensor(tensor).shape, scop.sizes)
    d = len(box) - 1
    while d >= 0 and box[d] == extents[d]:
        d -= 1
    return all(n == 1 for n in box[:max(d, 0)])


def graft_copies(schedule: isl.Schedule, plans: dict[str, PackPlan]) -> isl.Schedule:
    """The copy statement of each plan grafted below its mark, before the register-tile
    steps. Last of the schedule passes: isl cannot build the schedule map of a tree with
    extension nodes, which the legality check needs."""
    if not plans:
        return schedule

    def visit(node: isl.ScheduleNode) -> isl.ScheduleNode:
        for k in range(node.n_children()):  # first the marks nested in this one
            node = visit(node.child(k)).parent()
        if node.get_type() == isl.schedule_node_type.mark:
            name = node.mark_get_id().get_name()
            if name.startswith(PACK_MARK + "_"):
                plan = plans[name[len(PACK_MARK) + 1:]]
                copy = isl.Map.identity(plan.tiles.get_space().map_from_set()) \
                    .intersect_domain(plan.tiles) \
                    .set_tuple_name(isl.dim_type.out, f"{PACK_STATEMENT}{plan.name}")
                node = node.child(0).graft_before(
                    isl.ScheduleNode.from_extension(isl.UnionMap.from_map(copy)))
                while node.get_type() != isl.schedule_node_type.mark:  # back up to the mark
                    node = node.parent()
        return node

    return visit(schedule.get_root()).get_schedule()


def _read_twice(scop: Scop, tile: RegisterTile, tensor: str) -> bool:
    """Whether the tile's statement reads `tensor` at two places (C(k, l, i) and C(j, i, n)):
    one buffer would serve both reads, laid out for one of them; such operands are not
    packed (fuzz program 656 crashed looking for the lanes in the other read)."""
    reads = scop.statement(tile.statement).source.reads()
    return sum(r.tensor == tensor for r in reads) > 1


def _lane_dimension(scop: Scop, tile: RegisterTile, tensor: str) -> int | None:
    """The dimension of `tensor` the lanes move, where it is packed lanes-first."""
    if tensor not in tile.transposed:
        return None
    read = next(r for r in scop.statement(tile.statement).source.reads()
                if r.tensor == tensor)
    return next(d for d, a in enumerate(read.affine) if tile.lanes in a.indices())


def _strides(shape: tuple[int, ...], last: int | None,
             itemsize: int | None = None) -> tuple[int, ...]:
    """Strides for `shape`, row-major but with dimension `last` (if any) innermost; dense,
    or with `itemsize`, one cache line more wherever a stride would be a multiple of 1 KiB
    (rows that far apart share few L1 sets: see `pack_rows`)."""
    order = [d for d in range(len(shape)) if d != last] + ([last] if last is not None else [])
    strides = [0] * len(shape)
    step = 1
    for d in reversed(order):
        strides[d] = step
        step *= shape[d]
        if itemsize and (step * itemsize) % 1024 == 0:
            step += 64 // itemsize
    return tuple(strides)


def _reads_of(scop: Scop, tensor: str, domain: isl.UnionSet) -> isl.UnionMap:
    """Every read of `tensor` by the statement instances in `domain`."""
    access = None
    for (sid, ref), relation in scop.ref_reads.items():
        read = next(r for r in scop.statement(sid).source.reads() if r.ref == ref)
        if read.tensor == tensor:
            relation = isl.UnionMap.from_map(relation)
            access = relation if access is None else access.union(relation)
    return access.intersect_domain(domain)


def _reduction_first(scop: Scop, tile: RegisterTile, tensor: str, reduction: str,
                     target: Target) -> int | None:
    """The dimension of `tensor` that `reduction` moves, laid innermost in its packed
    block with 16 vector registers (`pack_rows`): each step's mr rows then come from mr
    lines that serve the next 16 steps too, as a row-major A in a plain matmul; in the
    tensor's order every step reads a new line for its mr values. With AVX2 (one core,
    load 5-6 on 2 cores, medians of 3 rounds against np.einsum): O(a, b, c) +=! X(a, k, c)
    * W(k, b) at 64 x 256 x 64 x 256 19.9 ms packed in the tensor's order, 11.0
    transposed (einsum 12); matmul_ta at 1024^3 0.72x of einsum in order, 0.77x
    transposed. With 32 registers the block is read from L2 in the tensor's order (the
    measure above, on znver4): None there."""
    if target.vector_registers >= 32:
        return None
    read = next(r for r in scop.statement(tile.statement).source.reads()
                if r.tensor == tensor)
    return next((d for d, a in enumerate(read.affine) if reduction in a.indices()), None)
