"""GPU mapping (PPCG's `gpu_create_kernel`, TC's outer-block/inner-thread strategy).

Each outermost band becomes one kernel launch. A permutable band with leading coincident
members is tiled (tile loops count tiles, point loops start at 0); the innermost three
coincident members (at most) are mapped to blocks by filters `b_k = tile_k mod grid_k`
and to threads by `t_k = point_k mod block_k`, with the innermost mapped member on x
(threadIdx.x walks the stride-1 dimension, so accesses coalesce); outer coincident members
are loops in every thread. The block and thread ids are isl parameters bounded by a
context node above the filters; sizes that do not divide give guards or strided loops,
and a grid smaller than the number of tiles makes blocks loop over tiles. Tile sizes
follow the machine: smaller y and z tiles when 32-wide ones would leave multiprocessors
idle, 32x128 tiles for large contractions (a 4x4 register tile a thread), 256 threads
for a single mapped member. A band with no coincident member runs as one thread (see
`polyhedral.reductions` for reductions mapped across a block, and for the elementwise
statements of the next band that a row reduction's launch takes along).
"""

from __future__ import annotations

from dataclasses import dataclass

import islpy as isl

from polyhedral import bands as B
from polyhedral import loop_ir as L
from polyhedral.isl_callbacks import sets
from polyhedral.promotion import SharedTile, plan_shared
from polyhedral.reductions import plan_block_reduction
from polyhedral.scop import Scop
from polyhedral.tile_contraction import plan_tile_contraction
from polyhedral.tiling import UNTILED, _multi_val
from tclang.options import Options
from tclang.target import Target

THREADS = (32, 8, 4)  # default threads per mapped member, x (innermost member) first
TILE = 32
# one mapped member alone (an elementwise chain, a row's statements): 32 threads a block
# would cap an SM at half its threads (it runs at most 32 blocks), so a block takes 256
THREADS_1D = 256
MIN_BLOCKS = 264  # two blocks for each of an H100's 132 multiprocessors
COLUMNS = 4  # points each x thread takes along a contraction's x member
GENERIC_GRID = 4096  # blocks per mapped member when the sizes are not known


@dataclass(frozen=True)
class LaunchPlan:
    name: str  # the kernel mark's id
    grid: tuple[L.IExpr, ...]  # blocks, x first
    block: tuple[int, ...]  # threads, x first
    mapped: int  # band members mapped to blocks and threads
    shared: tuple[SharedTile, ...] = ()  # tiles copied to shared memory at each tile
    body: L.Node | None = None  # a launch built directly (a block reduction)
    buffers: tuple[L.Buffer, ...] = ()
    statements: tuple[L.StatementDef, ...] = ()


def map_to_gpu(schedule: isl.Schedule, scop: Scop, options: Options,
               target: Target) -> tuple[isl.Schedule, dict[str, LaunchPlan]]:
    scop.ctx.set_tile_scale_tile_loops(0)
    scop.ctx.set_tile_shift_point_loops(1)
    plans: dict[str, LaunchPlan] = {}
    absorbed: set[str] = set()
    node = _visit(schedule.get_root(), scop, options, target, plans, absorbed)
    return node.get_schedule(), plans


def _visit(node, scop, options, target, plans, absorbed: set[str]):
    if node.get_type() == isl.schedule_node_type.band:
        return _map_band(node, scop, options, target, plans, absorbed)
    for k in range(node.n_children()):
        node = _visit(node.child(k), scop, options, target, plans, absorbed).parent()
    return node


def _statements(node: isl.ScheduleNode) -> list[str]:
    return [s.get_tuple_name() for s in sets(node.get_domain())]


def _next_band_statements(node: isl.ScheduleNode) -> list[str]:
    """The statements of the band a sequence runs right after this one's, if it is one."""
    parent = node.parent()
    if parent.get_type() != isl.schedule_node_type.filter or not parent.has_next_sibling():
        return []
    after = parent.next_sibling()
    if after.n_children() != 1 or after.child(0).get_type() != isl.schedule_node_type.band:
        return []
    return _statements(after.child(0))  # (a filter's own domain is what reaches it)


def _map_band(node, scop: Scop, options: Options, target: Target, plans,
              absorbed: set[str]) -> isl.ScheduleNode:
    name = f"kernel{len(plans)}"
    if set(_statements(node)) <= absorbed:  # the launch before runs these
        plans[name] = LaunchPlan(name, (L.Int(1),), (1,), 0, (), L.Block(()))
        return node.insert_mark(_id(scop, name))
    band = B.members(node, scop)
    leading = 0
    while leading < len(band) and band[leading].coincident:
        leading += 1
    if not node.band_get_permutable():
        leading = 0
    tiled = plan_tile_contraction(node, scop, options, target, _next_band_statements(node)) \
        if leading else None
    if tiled is not None:
        body, grid, block, followers = tiled
        absorbed.update(followers)
        plans[name] = LaunchPlan(name, grid, block, 0, (), body)
        return node.insert_mark(_id(scop, name))
    reduction = plan_block_reduction(node, scop, options, target, name, leading,
                                     _next_band_statements(node))
    if reduction is not None:
        body, buffers, statements, grid, block, followers = reduction
        absorbed.update(followers)
        plans[name] = LaunchPlan(name, grid, block, 0, (), body, buffers, statements)
        return node.insert_mark(_id(scop, name))
    if leading == 0:
        plans[name] = LaunchPlan(name, (L.Int(1),), (1,), 0)
        return node.insert_mark(_id(scop, name))
    mapped = min(3, leading)
    first = leading - mapped  # the innermost coincident members: the last walks stride 1
    sizes = _tile_sizes(band, first, mapped, options)
    if options.tile_sizes(len(band)) is None and not options.block:
        sizes = _enough_blocks(band, sizes, first, mapped)
        sizes = _wider_x_for_contractions(band, sizes, first, mapped)
    tile = node.band_tile(_multi_val(node, sizes))
    block = _block(band, sizes, first, mapped, options, target)
    grid_caps, grid = _grid(tile, scop, first, mapped, options, target)
    # members are mapped backwards: the innermost mapped member goes to x
    members = list(reversed(range(first, first + mapped)))
    blocks = _mod_filter(tile, members, [f"b{k}" for k in range(mapped)], grid_caps, scop)
    threads = _mod_filter(tile.child(0), members, [f"t{k}" for k in range(mapped)], block,
                          scop)
    ids = " and ".join([f"0 <= b{k} < {g}" for k, g in enumerate(grid_caps)] +
                       [f"0 <= t{k} < {t}" for k, t in enumerate(block)])
    names = ", ".join([f"b{k}" for k in range(mapped)] + [f"t{k}" for k in range(mapped)])
    context = isl.Set(f"[{names}] -> {{ [] : {ids} }}", context=scop.ctx)
    shared = plan_shared(tile, scop, options, target)
    # PPCG's layout: blocks filter above the tile band; the thread filter only above the
    # point band, so the copies and barriers grafted between them run on every thread
    tile = tile.child(0).insert_filter(threads).parent()
    node = tile.insert_filter(blocks).insert_context(context).insert_mark(_id(scop, name))
    plans[name] = LaunchPlan(name, grid, tuple(block), mapped, tuple(shared))
    if shared:  # mark -> context -> block filter -> tile band -> thread filter
        node = _graft_copies(node.child(0).child(0).child(0).child(0), name)
    return node


def _graft_copies(point: isl.ScheduleNode, kernel: str) -> isl.ScheduleNode:
    """Statements `tc_copy_<kernel>` before and `tc_sync_<kernel>` after the point loops,
    one instance per tile: isl keeps every thread-dependent guard below them. Returns the
    kernel's mark."""
    tiles = point.get_prefix_schedule_union_map().range()
    found = sets(tiles)
    tile_set = found[0]
    for s in found[1:]:
        tile_set = tile_set.union(s)
    identity = isl.Map.identity(tile_set.get_space().map_from_set()).intersect_domain(tile_set)
    before = identity.set_tuple_name(isl.dim_type.out, f"tc_copy_{kernel}")
    after = identity.set_tuple_name(isl.dim_type.out, f"tc_sync_{kernel}")
    point = point.graft_before(isl.ScheduleNode.from_extension(isl.UnionMap.from_map(before)))
    point = point.graft_after(isl.ScheduleNode.from_extension(isl.UnionMap.from_map(after)))
    while not (point.get_type() == isl.schedule_node_type.mark and
               point.mark_get_id().get_name() == kernel):  # back up to the kernel's mark
        point = point.parent()
    return point


def _tile_sizes(band: list[B.Member], first: int, mapped: int,
                options: Options) -> list[int]:
    manual = options.tile_sizes(len(band))
    if manual is not None and any(manual):
        return [s if s > 0 else UNTILED for s in manual]
    sizes = []
    for m in band:
        is_mapped = first <= m.position < first + mapped
        size = TILE
        if mapped == 1 and is_mapped:  # 4 points a thread where there are plenty of blocks
            long = m.extent is not None and m.extent >= 4 * THREADS_1D * MIN_BLOCKS
            size = 4 * THREADS_1D if long else THREADS_1D
        if m.extent is not None and m.extent <= size:
            size = max(m.extent, 1) if is_mapped else UNTILED
        sizes.append(size)
    return sizes


def _enough_blocks(band: list[B.Member], sizes: list[int], first: int,
                   mapped: int) -> list[int]:
    """Tiles no larger than the threads on y and z when 32-wide tiles would leave most of
    the GPU's multiprocessors idle (a convolution's 56x56 image and 64 channels make 8
    blocks; each thread then loops over 4 rows and 8 channels): one point per thread on
    those members, the x member kept 32 wide for coalescing."""
    count = _block_count(band, sizes, first, mapped)
    if count is None or count >= MIN_BLOCKS:  # (None: sizes known at run time)
        return sizes
    smaller = list(sizes)
    for k in range(1, mapped):  # y, then z: the members outside x
        position = first + mapped - 1 - k
        if smaller[position] != UNTILED:
            smaller[position] = min(smaller[position], THREADS[k])
    return smaller


def _wider_x_for_contractions(band: list[B.Member], sizes: list[int], first: int,
                               mapped: int) -> list[int]:
    """A contraction (a reduction member inside the mapped ones: matmul's k) whose grid
    stays large gets x tiles COLUMNS times the x threads: each thread then owns a 4x4
    register tile of 32x128 points (the CUDA code jams them into the reduction loop), so
    each element loaded from shared memory feeds four multiply-adds instead of one."""
    x = first + mapped - 1
    member = band[x]
    wide = COLUMNS * THREADS[0]
    if mapped < 2 or len(band) <= first + mapped or member.extent is None or \
            member.extent < wide or sizes[x] != TILE or sizes[x - 1] != TILE:
        return sizes
    wider = list(sizes)
    wider[x] = wide
    count = _block_count(band, wider, first, mapped)
    return wider if count is not None and count >= MIN_BLOCKS else sizes


def _block_count(band: list[B.Member], tiles: list[int], first: int,
                 mapped: int) -> int | None:
    """The tiles of the mapped members (the blocks a grid needs); None if a size is only
    known at run time."""
    count = 1
    for m in band[first:first + mapped]:
        if m.extent is None:
            return None
        count *= -(-m.extent // max(1, min(tiles[m.position], m.extent)))
    return count


def _block(band, sizes, first: int, mapped: int, options: Options,
           target: Target) -> list[int]:
    wanted = list(options.block) if options.block else \
        [THREADS_1D] if mapped == 1 else list(THREADS)
    block = []
    for k in range(mapped):
        member = band[first + mapped - 1 - k]  # x is the innermost mapped member
        threads = wanted[k] if k < len(wanted) else 1
        limit = sizes[member.position]
        if member.extent is not None:
            limit = min(limit, member.extent)
        block.append(max(1, min(threads, limit, target.max_block[k])))
    while _product(block) > target.max_threads_per_block:
        block[block.index(max(block))] //= 2
    return block


def _grid(tile, scop: Scop, first: int, mapped: int, options: Options, target: Target):
    """(the moduli of the block filters, the launch grid as index expressions)."""
    partial = tile.band_get_partial_schedule()
    domain = tile.get_domain()
    caps, grid = [], []
    for k in range(mapped):
        member = first + mapped - 1 - k
        cap = target.max_grid[k]
        if options.grid and k < len(options.grid):
            cap = min(cap, options.grid[k])
        count = _tile_count(partial.get_union_pw_aff(member), domain, scop)
        if isinstance(count, L.Int):
            cap = max(1, min(cap, count.value))
            grid.append(L.Int(cap))
        else:
            cap = min(cap, GENERIC_GRID)
            grid.append(L.Op("max", (L.Int(1), L.Op("min", (L.Int(cap), count)))))
        caps.append(cap)
    return caps, tuple(grid)


def _tile_count(upa: isl.UnionPwAff, domain: isl.UnionSet, scop: Scop) -> L.IExpr:
    """1 + the largest tile index of a member, as an index expression in the sizes."""
    values = isl.UnionMap.from_union_pw_aff(upa).intersect_domain(domain).range()
    found = sets(values)
    if not found:
        return L.Int(1)
    highest = found[0]
    for s in found[1:]:
        highest = highest.union(s)
    from polyhedral.lowering import pw_aff_index
    return L.add(pw_aff_index(highest.dim_max(0), scop), L.Int(1))


def _mod_filter(node, members: list[int], names: list[str], sizes: list[int],
                scop: Scop) -> isl.UnionSet:
    """{ instances : member_k mod size_k = id_k } (PPCG's set_schedule_modulo)."""
    ctx = scop.ctx
    result = node.get_universe_domain()
    partial = node.band_get_partial_schedule()
    for member, name, size in zip(members, names, sizes):
        upa = partial.get_union_pw_aff(member).mod_val(isl.Val.int_from_si(ctx, size))
        ident = isl.Set(f"[{name}] -> {{ : }}", context=ctx).get_dim_id(isl.dim_type.param, 0)
        equal = upa.sub(isl.UnionPwAff.param_on_domain_id(result, ident)).zero_union_set()
        result = result.intersect(equal)
    return result


def _id(scop: Scop, name: str) -> isl.Id:
    return isl.Id(name, context=scop.ctx)


def _product(values) -> int:
    out = 1
    for v in values:
        out *= v
    return out
