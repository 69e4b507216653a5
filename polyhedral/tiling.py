"""CPU schedule-tree passes: manual loop order, tiling, and the intra-tile loop order.

`apply_loop_order` permutes outermost bands as the user asked (both targets). Then, for the
CPU, `transform_bands` visits each outermost band: tile it when it is
permutable and tiling pays (a reduction, or a read reused along some member), with sizes
from the options or from a heuristic fed by the target's cache and vector sizes; then
order the point loops so that the member giving stride-1 accesses is innermost (the isl
scheduler does not optimise intra-tile order, and loop order is what makes CPU code fast:
polyhedral notes, section 6.2).
"""

from __future__ import annotations

import islpy as isl

from polyhedral import bands as B
from polyhedral import packing as P
from polyhedral import register_tiles as R
from polyhedral.isl_callbacks import sets
from polyhedral.row_fusion import ROW_MARK
from polyhedral.scheduled import UNTILED, BandReport  # noqa: F401 - re-exported
from polyhedral.scop import Scop
from tclang import budget as compile_budget
from tclang.errors import TCScheduleError
from tclang.options import Options
from tclang.target import Target


def transform_bands(schedule: isl.Schedule, scop: Scop, options: Options, target: Target,
                    reports: list[BandReport] | None = None,
                    packs: dict[str, P.PackPlan] | None = None) -> isl.Schedule:
    """`packs` receives the plan of each packed operand (see polyhedral/packing.py), which
    the lowering needs; None: pack nothing."""
    # tile loops count tiles (not scaled by the tile size) and point loops start at 0:
    # isl generates the AST about twice as fast this way
    scop.ctx.set_tile_scale_tile_loops(0)
    scop.ctx.set_tile_shift_point_loops(1)
    node = _visit(schedule.get_root(), scop, options, target, reports, packs, in_band=False)
    return node.get_schedule()


def _visit(node, scop, options, target, reports, packs, in_band):
    compile_budget.check()  # once a node: the stage's long walk (issue 34)
    if node.get_type() == isl.schedule_node_type.band and not in_band:
        node = _transform_band(node, scop, options, target, reports, packs)
        return _below_rows(node, scop, options, target, reports, packs)
    is_band = node.get_type() == isl.schedule_node_type.band
    for k in range(node.n_children()):
        node = _visit(node.child(k), scop, options, target, reports, packs,
                      in_band or is_band).parent()
    return node


def _below_rows(node, scop, options, target, reports, packs):
    """A fused row band's passes (polyhedral/row_fusion.py: the bands below its mark) are
    transformed as outermost bands; `node` is the row band, after its own transform."""
    depth = 0
    while node.n_children() == 1 and node.get_type() == isl.schedule_node_type.band:
        node, depth = node.child(0), depth + 1
    if node.get_type() == isl.schedule_node_type.mark and \
            node.mark_get_id().get_name() == ROW_MARK:
        node = _visit(node.child(0), scop, options, target, reports, packs, False).parent()
    for _ in range(depth):
        node = node.parent()
    return node


def apply_loop_order(schedule: isl.Schedule, scop: Scop, loop_order) -> isl.Schedule:
    """Reorder the loops of every outermost loop nest as `loop_order` says (positions or
    index names). A nest is an outermost band and the bands nested directly in it (isl
    splits a nest into nested bands where it cannot keep one permutable band); they are
    merged into one band first. Whether the order keeps every dependence is checked on the
    final schedule, which refuses an illegal order with the dependence it breaks."""
    def visit(node):
        if node.get_type() == isl.schedule_node_type.band:
            node = B.merge_nested(node)
            return B.permute(node, _manual_order(loop_order, B.members(node, scop), scop))
        for k in range(node.n_children()):
            node = visit(node.child(k)).parent()
        return node
    return visit(schedule.get_root()).get_schedule()


def _transform_band(node, scop: Scop, options: Options, target: Target, reports, packs):
    band = B.members(node, scop)
    order = list(range(len(band)))
    sizes, reason = _tile_sizes(node, scop, band, options, target)
    named = tuple(_member_name(m) for m in band)
    if sizes is not None:
        node = _tile(node, band, sizes)
        if options.loop_order is None:
            node = _order_point_loops(node.child(0), scop, target).parent()
        node = _atomic(node, scop)
        if options.loop_order is None and options.register_tile is not False:
            shape = options.register_tile if isinstance(options.register_tile, tuple) else None
            registers = R.plan(node.child(0), scop, target, shape,
                               pack=packs is not None and _lanes_first(options, target))
            if registers is not None:
                points = B.members(node.child(0), scop)  # the positions `registers` names
                reduction = points[registers.reductions[-1]].index_of.get(registers.statement)
                node = R.apply(node.child(0), registers)
                # `registers` names positions in the point band, which _order_point_loops
                # may have permuted: the band's own member for each, by its indices
                rows_at, lanes_at = (next((k for k, m in enumerate(band)
                                           if m.index_of == points[p].index_of), p)
                                     for p in (registers.i, registers.j))
                if packs is not None and options.pack is not False:
                    extent = band[rows_at].extent
                    rows = min(sizes[rows_at], extent if extent is not None else UNTILED)
                    node = P.pack(node, registers, rows, scop, target, packs,
                                   force=options.pack is True)
                    lanes = band[lanes_at].extent
                    columns = min(sizes[lanes_at], lanes if lanes is not None else UNTILED)
                    if reduction is not None and columns >= 2 * registers.nr:
                        node = P.pack_rows(node, registers, reduction, scop, target, packs)
                node = node.parent()
        if reports is not None:
            reports.append(BandReport(len(band), tuple(sizes), tuple(order), named, reason,
                                      tuple(m.extent for m in band)))
        return node
    elif options.loop_order is None and node.band_get_permutable():
        node = _order_point_loops(node, scop, target)
    if reports is not None:
        reports.append(BandReport(len(band), tuple(sizes) if sizes else None, tuple(order),
                                  named, reason, tuple(m.extent for m in band)))
    return _atomic(node, scop)


def _atomic(node, scop: Scop):
    """Ask isl for one loop per member, not one per piece of the domain (PPCG's CPU
    choice): much less code and much faster AST generation. The innermost loop is the
    exception: it is separated, so a guard on its first or last iteration (a fused init
    or epilogue) is peeled out and the loop in between is clean for the vectorizer.

    Where the band runs a sum inside a recurrence (the backward of a recurrence whose
    reads are not constant shifts: tclang/autodiff/scans.py), every loop is separated:
    its domain is a union of one piece per read, each a few dimensions inside the others'
    hull, and one loop per member over that hull visited every pair (a 300 x 300
    forward substitution's backward: 8.8 ms, separated 2.1 ms)."""
    every = _sums_in_recurrences(node, scop)
    inner = node
    while inner.n_children() == 1 and inner.child(0).get_type() == isl.schedule_node_type.band:
        inner = inner.child(0)
    depth = 0
    node_at = node
    while True:
        last = node_at.band_n_member() - 1
        for k in range(node_at.band_n_member()):
            innermost = node_at.is_equal(inner) and k == last
            kind = isl.ast_loop_type.separate if innermost or every else \
                isl.ast_loop_type.atomic
            node_at = node_at.band_member_set_ast_loop_type(k, kind)
        if node_at.n_children() == 1 and node_at.child(0).get_type() == isl.schedule_node_type.band:
            node_at = node_at.child(0)
            depth += 1
        else:
            break
    for _ in range(depth):
        node_at = node_at.parent()
    return node_at


def _sums_in_recurrences(node, scop: Scop) -> bool:
    """Whether a statement under `node` is a reduction that reads earlier points of its
    own target."""
    summed = scop.summed_recurrences
    return bool(summed) and any(s.get_tuple_name() in summed for s in sets(node.get_domain()))


def _manual_order(order, band: list[B.Member], scop: Scop) -> list[int]:
    n = len(band)
    positions = []
    for item in order:
        if isinstance(item, int):
            positions.append(item)
            continue
        matches = [m.position for m in band if item in m.index_of.values()]
        if len(matches) != 1:
            names = ", ".join("|".join(sorted({i for i in m.index_of.values() if i})) or "-"
                              for m in band)
            raise TCScheduleError(f"loop_order names {item!r}, which is not the index of "
                                  f"exactly one loop of the band ({names})",
                                  hint="give positions instead, e.g. loop_order=(1, 0)")
        positions.append(matches[0])
    if sorted(positions) != list(range(n)):
        raise TCScheduleError(f"loop_order {tuple(order)!r} is not a permutation of the "
                              f"band's {n} loops", hint=f"list each of 0..{n - 1} once")
    return positions


def _member_name(member: B.Member) -> str:
    names = sorted({n for n in member.index_of.values() if n is not None})
    return "/".join(names) or "?"


def _tile_sizes(node, scop: Scop, band: list[B.Member], options: Options,
                target: Target) -> tuple[list[int] | None, str]:
    """The band's tile sizes (None: left untiled) and why, in words (tclang explain)."""
    if not node.band_get_permutable():
        return None, "not permutable (a dependence forbids tiling)"
    manual = options.tile_sizes(len(band))
    if manual is not None:
        if not any(manual):
            return None, "tiling turned off (Options tile)"
        return [s if s > 0 else UNTILED for s in manual], "manual (Options tile)"
    if len(band) < 2:
        return None, "a single loop: nothing to tile"
    if not _worth_tiling(node, scop, band):
        return None, "no reduction and no reuse between its loops"
    return _heuristic_sizes(node, scop, band, target, options.vector_width,
                            options.register_tile is not False and options.loop_order is None,
                            pack=_lanes_first(options, target))


def _lanes_first(options: Options, target: Target) -> bool:
    """Whether a register tile whose lanes read an operand with a stride (x @ w.T's W) keeps
    the outer-product form, that operand packed lanes-first, rather than the dot form:
    `Options(pack=...)` decides, else the vector width. Measured on x @ w.T at 1024^2: with
    AVX2 the dot form ran ~25% faster; with AVX-512 it ran 20x slower (376 ms against
    19 ms, NumPy 15 ms; already 20x at 384^2): its 16-lane strided reads thrash there."""
    if options.pack is not None:
        return options.pack
    return target.vector_bytes >= 64


def _balanced_rows(extent: int, size: int, mr: int, cores: int) -> int:
    """A contraction's row tile (whole register tiles) for its parallel loop: at least two
    blocks a core, their count a multiple of the cores and their sizes even, so that no
    core waits on a last block the others do not share (five blocks of 212 rows on two
    cores run as three rounds, six of 172 as three of two)."""
    blocks = max(-(-extent // size), 2 * cores)
    blocks = -(-blocks // cores) * cores
    rows = -(-extent // blocks)
    return max(mr, -(-rows // mr) * mr)


def _worth_tiling(node, scop: Scop, band: list[B.Member]) -> bool:
    if len(band) < 2:
        return False
    reduces = any(not m.coincident for m in band)
    return reduces or B.reads_reuse(node, scop, band)


def _heuristic_sizes(node, scop: Scop, band: list[B.Member], target: Target,
                     vector_width: int | None = None, register_tiles: bool = True,
                     pack: bool = False) -> tuple[list[int] | None, str]:
    """Tiles of roughly L2 size: a long stride-1 member, shorter parallel members, medium
    reduction members; members shorter than their tile stay whole; the outermost parallel
    member keeps enough tiles for every core. With the reason, in words."""
    registers = R.plan(node, scop, target, pack=pack) if register_tiles else None
    if registers is not None:  # a contraction: BLIS's blocking around the micro-kernel
        sizes = [UNTILED if s is None else s for s in R.cache_tiles(band, registers, target)]
        reason = (f"cache blocks around a register tile (BLIS's model: L1 "
                  f"{target.l1_bytes >> 10} KiB, L2 {target.l2_bytes >> 10} KiB)")
    else:
        reason = "L2-sized: the stride-1 loop longest, parallel loops shorter"
        scores = B.short_members_penalized(B.stride_scores(node, scop, band), band, target)
        inner = max(range(len(band)), key=lambda k: (scores[k], band[k].coincident, k))
        lanes = vector_width or max(1, target.vector_bytes // 4)
        sizes = []
        for m in band:
            if m.position == inner:
                size = 32 * lanes
            elif m.coincident:
                size = 32
            else:
                size = 64
            sizes.append(size)
    first = band[0]
    if first.coincident and first.extent is not None and target.cores > 1:
        if registers is not None and registers.i == 0:
            sizes[0] = _balanced_rows(first.extent, sizes[0], registers.mr, target.cores)
        else:
            # a contraction's batch (bmm's b, a convolution's n): four blocks a core, so
            # the runtime's dynamic chunks can move work off a core another process slows
            # (64 x 128^3 in 4 blocks of 16 ran 2-3x slower in such moments)
            batch = registers is not None and 0 not in (registers.i, registers.j)
            least, blocks = (1, 4) if batch else (8, 2)
            while sizes[0] > least and -(-first.extent // sizes[0]) < blocks * target.cores:
                sizes[0] //= 2
        reason += f"; the outer tile sized to share work among {target.cores} cores"
    # a member shorter than its tile stays whole; but the rows and lanes of a register
    # tile are tiled even then: untiled before the first tiled member, they would get
    # tiles of 1 (see _tile), leaving the register tile nothing to run over
    kept = (registers.i, registers.j) if registers is not None else ()
    sizes = [UNTILED if m.extent is not None and m.extent <= s and m.position not in kept
             else s for m, s in zip(band, sizes)]
    if not any(s != UNTILED for s in sizes):
        return None, "every loop is shorter than its tile"
    return sizes, reason


def _tile(node, band: list[B.Member], sizes: list[int]):
    """Tile the members with a size; the untiled ones join the point loops, in place.

    Untiled parallel members before the first tiled one get tiles of 1, so their loops
    stay outermost (and parallel). The other untiled members are moved behind the tiled
    ones (legal: the band is permutable) and left out of the tile band: "tiling" a member
    by a huge size would cost isl two dimensions, and where the member takes negative
    values (a skewed schedule) its point loop would run up to that size, guarded."""
    first = next(k for k, s in enumerate(sizes) if s != UNTILED)
    sizes = [1 if s == UNTILED and k < first and band[k].coincident else s
             for k, s in enumerate(sizes)]
    tiled = [k for k, s in enumerate(sizes) if s != UNTILED]
    order = tiled + [k for k, s in enumerate(sizes) if s == UNTILED]
    if order != sorted(order):
        node = B.permute(node, order)
    split = len(tiled) < len(sizes)
    if split:
        node = node.band_split(len(tiled))
    node = node.band_tile(_multi_val(node, [sizes[k] for k in tiled]))
    if split:  # the point loops and the untiled rest, back in the band's order
        point = B.merge_nested(node.child(0), levels=1).band_set_permutable(1)
        if order != sorted(order):
            point = B.permute(point, [order.index(k) for k in range(len(order))])
        node = point.parent()
    return node


def _multi_val(node, sizes: list[int]) -> isl.MultiVal:
    mv = isl.MultiVal.zero(node.band_get_space())
    for k, s in enumerate(sizes):
        mv = mv.set_val(k, isl.Val.int_from_si(node.get_ctx(), s))
    return mv


def _order_point_loops(node, scop: Scop, target: Target):
    """Move the member with the best stride-1 score innermost (ties: a parallel one).
    Only within a permutable band: elsewhere the order is the dependences' to choose."""
    band = B.members(node, scop)
    if len(band) < 2 or not node.band_get_permutable():
        return node
    scores = B.short_members_penalized(B.stride_scores(node, scop, band), band, target)
    best = max(range(len(band)), key=lambda k: (scores[k], band[k].coincident, k))
    if best == len(band) - 1 or scores[best] <= scores[-1]:
        return node
    order = [k for k in range(len(band)) if k != best] + [best]
    return B.permute(node, order)
