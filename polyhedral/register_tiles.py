"""Register tiles for contraction bands: the CPU micro-kernel's loop structure.

A contraction band (matmul, batched matmul, convolution, any tensor contraction the
language can write) is a permutable band around a reduction statement where two of its
parallel loops each leave one operand invariant: along `j` (the stride-1 loop, the
vector lanes) one operand is broadcast, along `i` the other one is reused. BLIS keeps an
mr x nr block of the result in vector registers for the whole reduction (Low et al.,
"Analytical modeling is enough for high-performance BLIS"); Polly's matmul optimizer
builds that block from the schedule tree. Here, after the cache-level tiling, the point
band is tiled again by mr along `i` and nr along `j` (1 along every other member), the
register-tile loops are ordered [other parallel members, j, i, reduction members], and
the mr x nr points of full tiles get loops of constant bounds, marked for unrolling
(isl's `isolate` option: partial tiles at the edges keep ordinary loops; lowering marks
the loops `unrolled`). The reduction loops then hold the updates of mr x nr result
elements that do not move along them, which the LLVM backend keeps in registers (see
backends/llvm/accumulators.py), each row of nr lanes one vector (backends/llvm/lanes.py).

mr and nr come from a model of the machine, not constants tuned on one box (shape_for):
with 16 vector registers (AVX2) nr is two vectors and mr fills the registers left with two
accumulators and a broadcast per row; with 32 (AVX-512) the tile is the one that loads the
fewest operands per FMA (4 x 6 vectors for float32), as BLIS's and AOCL's AVX-512 kernels
(4 x 6 vectors ran at 107 GFLOP/s a core on znver4 against 85 for 8 x 2).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import islpy as isl

from polyhedral import bands as B
from polyhedral.scop import Scop, generic_sizes
from tclang.errors import TCScheduleError
from tclang.target import Target

UNROLL_MARK = "tclang_unroll"
"""Marks the register tile's point loops: those with constant bounds are unrolled."""

MAX_GENERIC_SIZES = 3
"""A partly generic kernel (Options(specialize="auto")) gets register tiles while at most
this many of its sizes are generic (compile time, see `plan`)."""

MAX_UNROLLED = 384
"""Updates in one unrolled register tile at most (mr x nr): more only grows the code (the
AVX-512 float32 tile, 4 x 96, is 24 vector FMAs a step)."""


SHORT_REDUCTION = 256
"""Reduction steps below which a 32-register tile stays at most SHORT_ROWS x 2 vectors
(see shape_for)."""
SHORT_ROWS = 8

NC_VECTORS = 64
"""Register tiles along the lanes in one cache tile (BLIS's nc / nr: its B panel lives in
L3, of which the target knows nothing; 64 x 16 floats is 4 KB per row of it)."""


@dataclass(frozen=True)
class RegisterTile:
    """Which members of a band form the register tile, and its shape."""

    i: int  # position of the member the mr rows run over
    j: int  # position of the stride-1 member the nr lanes run over
    reductions: tuple[int, ...]  # positions of the reduction members
    mr: int
    nr: int
    statement: str  # the reduction statement whose results stay in registers
    element_bytes: int
    kind: str = "lanes"  # vectors along j ("lanes") or along the innermost reduction ("dot")
    rows: str = ""  # the reduction statement's index that member i runs over
    lanes: str = ""  # and member j
    #: operands the lanes would read with a stride (x @ w.T reads W(o, i) across o): a
    #: "lanes" tile is only fast once packing copies them lanes-first (polyhedral/packing.py)
    transposed: tuple[str, ...] = ()


def shape_for(target: Target, element_bytes: int, lane_extent: int | None = None,
              row_extent: int | None = None,
              reduction_extent: int | None = None) -> tuple[int, int]:
    """(mr, nr) of a "lanes" register tile for the target's registers, for a band whose
    lanes, rows and reduction run `lane_extent`, `row_extent` and `reduction_extent`
    iterations (None: unknown, many).

    16 registers (AVX2): nr two vectors wide (one where the lanes run fewer: 7 x 8);
    each of the mr rows takes two accumulators
    and its broadcast operand (LLVM hoists all mr broadcasts of one step ahead of the FMAs,
    so BLIS's 6 x 16 with one broadcast register at a time spills there), after the two
    vectors of the other operand: 4 x 16 for float32.

    32 registers (AVX-512): each step loads nv vectors and broadcasts mr values for
    mr x nv FMAs, so the tile with the fewest loads per FMA wins (`_loads_per_fma`), its
    mr x nv accumulators and nv vectors leaving two registers for broadcasts; within 5% of
    the fewest, the one with fewer rows (a broadcast is an instruction of its own; a vector
    load folds into the FMA): 4 x 6 vectors (4 x 96 for float32) on long loops. Measured on
    znver4, one core, 1024^3: 4 x 96 107 GFLOP/s, 6 x 64 107, 5 x 80 105, 8 x 32 (the
    16-register rule) 98; a 3x3 convolution over 64 rows ran twice as slow with 10-row
    tiles (their last 4 rows a loop) as with 8. Under SHORT_REDUCTION steps, where each
    tile's result is stored after few FMAs, the tile stays at most SHORT_ROWS x 2 vectors:
    at 4096 x 64 x 4096, 8 x 32 ran in 11.9 ms and 4 x 96 in 15.2; at 1024 x 128 x 1024
    1.25 and 2.84 ms (10 x 32 and 6 x 64 fell in between); the two tie from K = 256 on."""
    lanes = max(1, target.vector_bytes // element_bytes)
    registers = target.vector_registers
    if registers < 32:
        # one vector a row where the lanes run fewer than two (a permuted contraction's
        # result whose stride-1 index has 8-15 values: no tile at all with two)
        per_row = 1 if lane_extent is not None and lane_extent < 2 * lanes else 2
        mr = max(1, (registers - per_row) // (per_row + 1))
        return mr, per_row * lanes
    most = registers - 2
    vectors = None if lane_extent is None else max(1, -(-lane_extent // lanes))
    widest = most if lane_extent is None else max(1, lane_extent // lanes)  # nr <= extent
    short = reduction_extent is not None and reduction_extent < SHORT_REDUCTION
    shapes = [(mr, nv) for nv in range(1, (min(widest, 2) if short else widest) + 1)
              for mr in range(1, SHORT_ROWS + 1 if short else most)
              if mr * nv + nv <= most and (row_extent is None or mr <= row_extent)]
    cost = {shape: _loads_per_fma(*shape, vectors, row_extent) for shape in shapes}
    if short:
        mr, nv = min(shapes, key=lambda s: (cost[s], -s[0]))
        return mr, nv * lanes
    fewest = min(cost.values())
    mr, nv = min((s for s in shapes if cost[s] <= fewest * 1.05),
                 key=lambda s: (s[0], cost[s]))
    return mr, nv * lanes


def _loads_per_fma(mr: int, nv: int, vectors: int | None, rows: int | None) -> float:
    """Operands loaded per vector FMA by mr x nv-vector tiles over `rows` x `vectors`
    (None: many): each tile loads its rows and its vectors once a step, so the whole grid
    loads (vectors / nv tiles) x rows + (rows / mr tiles) x vectors, edge tiles as narrow
    as what is left. The rows of a partial tile run as a loop (only full tiles are
    unrolled): each of its FMAs counts one load more."""
    lane_tiles = 1 / nv if vectors is None else -(-vectors // nv) / vectors
    if rows is None:
        return lane_tiles + 1 / mr
    return lane_tiles + -(-rows // mr) / rows + (rows % mr) / rows


def plan(node: isl.ScheduleNode, scop: Scop, target: Target,
         shape: tuple[int, int] | None = None, pack: bool = False) -> RegisterTile | None:
    """The register tile for the permutable band `node`, or None when it is not a
    contraction band (or its loops are too short to fill one tile). `shape`: the user's
    (mr, nr) instead of the model's. `pack`: operands the lanes would read with a stride
    may be packed lanes-first, so the tile keeps its vectors along the lanes (BLIS's
    outer product, as for a contiguous operand); without it such a tile takes the dot
    form. The caller decides (polyhedral/tiling.py: by default with AVX-512, not with
    AVX2, where the packed outer product ran ~25% slower than the dot form on x @ w.T:
    LLVM's SLP vectorizer splits the second vector of lanes into pieces there)."""
    if not node.band_get_permutable() or node.band_n_member() < 3:
        return None
    if scop.sizes is None or \
            len(generic_sizes(scop.definition, scop.sizes)) > MAX_GENERIC_SIZES:
        # shape-generic: isl's AST generation of the full-tile split over symbolic sizes
        # took seconds per kernel (a 3x3 convolution: 6 s); such code keeps cache tiles only.
        # Generic in a few sizes (Options(specialize="auto")), it costs little: a 3x3
        # convolution generic in 1, 2, 3, 5 and 6 of its 7 sizes took 0.9, 1.3, 1.2, 2.9
        # and 3.1 s to compile, in all 7 over a minute
        return None
    band = B.members(node, scop)
    here = B.statement_ids(node)
    active = [st for st in scop.statements if st.id in here]
    reduces = [st for st in active if st.kind == "reduce"]
    if len(reduces) != 1:
        return None
    st = reduces[0]
    dtype = scop.definition.tensor(st.source.target).dtype
    index_of = {m.position: m.index_of.get(st.id) for m in band}
    lhs = tuple(st.source.indices)
    if not lhs or len(set(lhs)) != len(lhs):
        return None
    lanes = [m.position for m in band if m.coincident and index_of[m.position] == lhs[-1]]
    if len(lanes) != 1:
        return None  # the lanes must run along the result's stride-1 dimension
    j = lanes[0]
    reductions = tuple(m.position for m in band
                       if not m.coincident and index_of[m.position] is not None
                       and index_of[m.position] not in lhs)
    if not reductions or any(m.position not in reductions and not m.coincident
                             and index_of[m.position] is not None for m in band):
        return None  # (a member of one value, from a cache tile of 1, is no loop)
    reads = [r.affine for r in st.source.reads()]
    if any(a is None for r in reads for a in r):
        return None  # a gather: no operand is known to be invariant
    element_bytes = max(1, dtype.bits // 8)
    short = band[j].extent is not None and \
        band[j].extent < max(1, target.vector_bytes // element_bytes)
    if short and shape is None:
        return _dot_across(band, index_of, lhs, reads, reductions, st.id, element_bytes,
                           target)
    lanes_name = index_of[j]
    written = {x.source.target for x in scop.statements}
    strided = [r for r in st.source.reads()
               if _uses(r.affine, lanes_name) and not _unit_stride(r.affine, lanes_name)]
    transposed = tuple(dict.fromkeys(r.tensor for r in strided))
    packable = all(_packable_lanes_first(r, lanes_name, written) for r in strided)
    inner = [k for k in reductions
             if all(_unit_stride(r, index_of[k]) for r in reads if _uses(r, index_of[k]))
             and any(_uses(r, index_of[k]) for r in reads)]
    if not strided or (packable and (pack or not inner)):
        # vectors along the result's rows: matmul, conv, bmm; and any contraction whose
        # strided lane operands packing copies lanes-first where no dot form exists
        # (`_lanes_or_dot`)
        kind = "lanes"
        model = None  # shape_for, once the rows' member is known
    else:
        # the lanes would gather (x @ w.T reads W(o, i) across o): vectors along a
        # reduction loop every operand is contiguous in instead, one per accumulator
        kind = "dot"
        if not inner:
            return None
        reductions = tuple(k for k in reductions if k != inner[-1]) + (inner[-1],)
        model = dot_shape_for(target)
    best = None
    for m in band:
        name = index_of[m.position]
        if m.position == j or not m.coincident or name not in lhs:
            continue
        # rows: an operand that moves with the lanes but not with the rows is reused
        # from registers across the mr rows; an operand that moves with the rows but not
        # with the lanes is reused across the nr columns
        across_rows = any(not _uses(r, name) and _uses(r, lanes_name) for r in reads)
        across_lanes = any(_uses(r, name) and not _uses(r, lanes_name) for r in reads)
        if across_rows and across_lanes:
            if best is None or m.position > best.position:
                best = m
    if best is None:
        return None
    if kind == "lanes" and any(_uses(r.affine, index_of[best.position]) for r in strided):
        if not pack:  # unpacked lanes-first is chosen again where no dot form exists
            return None
        return plan(node, scop, target, shape, pack=False)  # not one sliver per mr rows
    if shape is not None:
        check_shape(shape, kind, target, element_bytes, st.source.span,
                    scop.definition.source)
    extents = {m.position: m.extent for m in band}
    steps = 1  # the reduction's length, where known
    for k in reductions:
        steps = None if steps is None or extents[k] is None else steps * extents[k]
    mr, nr = shape or model or shape_for(target, element_bytes, extents[j],
                                         extents[best.position], steps)
    if extents[j] is not None and extents[j] < nr:
        return None
    if extents[best.position] is not None:
        mr = min(mr, extents[best.position])
    if shape is None:
        mr = max(1, min(mr, MAX_UNROLLED // nr))
    return RegisterTile(best.position, j, reductions, mr, nr, st.id, element_bytes, kind,
                        index_of[best.position], lanes_name,
                        transposed if kind == "lanes" else ())


def check_shape(shape: tuple[int, int], kind: str, target: Target, element_bytes: int,
                span=None, source: str | None = None) -> None:
    """Refuse the user's register_tile=(mr, nr) where its accumulators and the operand
    vectors each step loads do not fit the target's vector registers, two left for
    broadcasts (the rule of the model's shapes and of the tuner's): LLVM would spill them
    on every FMA, and (100, 100) unrolled 10,000 updates. `span`, `source`: the
    contraction statement's place, for the error."""
    mr, nr = shape
    registers = target.vector_registers
    lanes = max(1, target.vector_bytes // element_bytes)
    if kind == "lanes":  # mr rows of nr lanes: ceil(nr / lanes) vectors a row
        vectors = -(-nr // lanes)
        needed = mr * vectors + vectors
        what = (f"{mr} x {vectors} vectors of accumulators and {vectors} of the operand "
                f"along the lanes ({lanes} {element_bytes * 8}-bit lanes a vector)")
        fits = shape_for(target, element_bytes)
    else:  # mr x nr results, each a vector of partial sums along the reduction
        needed = mr * nr + mr + nr
        what = (f"{mr * nr} accumulators (this contraction keeps each result as a vector "
                f"of partial sums along its reduction) and {mr + nr} operand vectors")
        fits = dot_shape_for(target)
    if needed > registers - 2:
        raise TCScheduleError(
            f"register_tile {shape} needs {what}: {needed} vector registers, but this "
            f"CPU has {registers}, two of them kept for broadcasts", span, source,
            hint=f"a tile that fits here is register_tile={fits}; or leave register_tile "
                 "unset for the model's choice")


def _dot_across(band, index_of, lhs, reads, reductions, statement: str,
                element_bytes: int, target: Target) -> RegisterTile | None:
    """The dot form over two other result members, for a result whose stride-1 member is
    shorter than a vector (a weight gradient dW(m, c, kh, kw): kw has 3 values). Each of
    the mr x nr results (rows along i, columns along j) is a vector of partial sums along
    a reduction loop every operand is contiguous in (the image row w); one operand must be
    invariant along i and the other along j, so each step loads mr + nr vectors for
    mr x nr FMAs."""
    inner = [k for k in reductions
             if all(_unit_stride(r, index_of[k]) for r in reads if _uses(r, index_of[k]))
             and any(_uses(r, index_of[k]) for r in reads)]
    if not inner:
        return None
    mr, nr = dot_shape_for(target)
    best = None
    candidates = [m for m in band if m.coincident and index_of[m.position] in lhs]
    for mj in candidates:
        for mi in candidates:
            if mi.position == mj.position:
                continue
            ni, nj = index_of[mi.position], index_of[mj.position]
            if not (any(_uses(r, nj) and not _uses(r, ni) for r in reads) and
                    any(_uses(r, ni) and not _uses(r, nj) for r in reads)):
                continue
            if (mj.extent is not None and mj.extent < nr) or \
                    (mi.extent is not None and mi.extent < mr):
                continue
            key = (mj.extent or 1 << 30) + (mi.extent or 1 << 30)
            if best is None or key > best[0]:
                best = (key, mi, mj)
    if best is None:
        return None
    _, mi, mj = best
    reductions = tuple(k for k in reductions if k != inner[-1]) + (inner[-1],)
    return RegisterTile(mi.position, mj.position, reductions, mr, nr, statement,
                        element_bytes, "dot", index_of[mi.position], index_of[mj.position])


def _packable_lanes_first(read, lanes: str, written: set[str]) -> bool:
    """Whether packing can lay `read`'s sliver out with the lanes contiguous: an input,
    read where `lanes` moves exactly one subscript, by one."""
    if read.is_gather or read.tensor in written:
        return False
    moved = [a for a in read.affine if lanes in a.indices()]
    return len(moved) == 1 and abs(moved[0].coefficient(lanes)) == 1


def dot_shape_for(target: Target) -> tuple[int, int]:
    """(mr, nr) for vectors along the reduction: each of the mr x nr results is a vector of
    partial sums, and each step loads one vector per row and per column; the most results
    whose accumulators and loads fit the registers with two to spare (2 x 4 with AVX2,
    4 x 5 with AVX-512)."""
    budget = target.vector_registers - 2
    best = (1, 1)
    for mr in range(1, budget):
        for nr in range(mr, budget):
            if mr * nr + mr + nr <= budget and (mr * nr, nr) > (best[0] * best[1], best[1]):
                best = (mr, nr)
    return best


def cache_tiles(band: list[B.Member], tile: RegisterTile, target: Target) -> list[int | None]:
    """Cache-level tile sizes for a contraction band (None: leave the member whole), after
    BLIS's analytical model (Low et al.); mc a multiple of mr. The reduction tile is spread
    over the reduction members outermost first (a convolution's 3 x 3 window stays whole
    inside its channel tile).

    With 16 vector registers the kc x nr sliver of the operand read along the lanes stays
    in half of L1 while the mr rows move, the mc x kc block of the other one in half of L2.
    A 32-register tile (4 x 6 vectors) loads one vector a 4 FMAs, which L2 feeds at full
    speed: the sliver and the block then share half of L2, and their shape minimises the
    traffic left, the lanes' operand read again for each block of mc rows and the result
    read and written for each block of kc (M N K (1/mc + 2/kc) under kc (mc + nr) <= L2/2:
    kc = 2 mc; `sliver_bytes`). kc is then split evenly over the reduction (1024 -> two
    blocks of 512, not 425 + 425 + 174). Measured on znver4 at 1024^3 (two cores): kc 128
    169, 256 202, 512 210 GFLOP/s; at 2048^3 mc x kc 256 x 512 205, 64 x 512 178."""
    eb = tile.element_bytes
    sizes: list[int | None] = [None] * len(band)
    inner = 1
    for k in tile.reductions[1:]:
        inner *= band[k].extent or 1
    if tile.kind == "lanes" and target.vector_registers >= 32:
        room = sliver_bytes(target) // eb  # elements of the block and the sliver
        nr = tile.nr
        mc = max(tile.mr, int((math.sqrt(nr * nr + 2 * room) - nr) / 2) // tile.mr * tile.mr)
        kc = max(8, room // (mc + nr))
        outer = band[tile.reductions[0]].extent
        steps = max(1, kc // inner)
        if outer is not None and outer > steps:  # even blocks over the reduction
            blocks = max(1, round(outer / steps))
            steps = -(-outer // blocks)
        elif outer is not None:  # a short reduction (4096 x 64 x 4096): taller blocks
            steps = outer
        mc = max(mc, (room // (steps * inner) - nr) // tile.mr * tile.mr)
        sizes[tile.i] = mc
        sizes[tile.j] = NC_VECTORS * tile.nr
        sizes[tile.reductions[0]] = steps
        return sizes
    # lanes: a kc x nr sliver of one operand; dot: kc elements of mr + nr rows
    sliver = tile.nr if tile.kind == "lanes" else tile.mr + tile.nr
    kc = max(8, target.l1_bytes // 2 // (sliver * eb))
    if tile.kind == "dot":
        kc = max(64, kc // 64 * 64)  # whole vectors, no remainder loop per tile
    mc = max(tile.mr, target.l2_bytes // 2 // (kc * eb) // tile.mr * tile.mr)
    sizes[tile.i] = mc
    sizes[tile.j] = NC_VECTORS * tile.nr
    sizes[tile.reductions[0]] = max(1, kc // inner)
    return sizes


def sliver_bytes(target: Target) -> int:
    """The cache a packed sliver of the lanes' operand may fill: half of L1 where the
    micro-kernel reads it from there (16 registers), half of L2 where a 32-register tile
    reads it from L2 (see cache_tiles)."""
    return target.l2_bytes // 2 if target.vector_registers >= 32 else target.l1_bytes // 2


def _unit_stride(subscripts, name: str) -> bool:
    """Whether `name` moves only the last subscript, by one (row-major: contiguous)."""
    *outer, last = subscripts
    return not _uses(outer, name) and abs(last.coefficient(name)) == 1


def _uses(subscripts, name: str) -> bool:
    return any(name in a.indices() for a in subscripts)


def apply(node: isl.ScheduleNode, tile: RegisterTile) -> isl.ScheduleNode:
    """Tile the band `node` into [register-tile loops] -> [unrolled mr x nr points]; returns
    the register-tile band (its child is the point band)."""
    n = node.band_n_member()
    sizes = [1] * n
    sizes[tile.i], sizes[tile.j] = tile.mr, tile.nr
    mv = isl.MultiVal.zero(node.band_get_space())
    for k, s in enumerate(sizes):
        mv = mv.set_val(k, isl.Val.int_from_si(node.get_ctx(), s))
    node = node.band_tile(mv)
    others = [k for k in range(n) if k not in (tile.i, tile.j) and k not in tile.reductions]
    order = others + [tile.j, tile.i] + list(tile.reductions)
    node = B.permute(node, order)
    # the register-tile loops: one loop each, but the outermost reduction loop separated,
    # so its first and last iterations (where a fused init or epilogue runs) are peeled
    # off and the loop in between holds nothing but the updates (separating the inner
    # reduction loops too multiplies the unrolled code: a 3x3 window peeled 4 ways)
    for k in range(n):
        kind = isl.ast_loop_type.separate if k == n - len(tile.reductions) else \
            isl.ast_loop_type.atomic
        node = node.band_member_set_ast_loop_type(k, kind)
    point = node.child(0)
    point = B.permute(point, [tile.i] + [k for k in range(n) if k not in (tile.i, tile.j)]
                      + [tile.j])
    point = _isolate_full_tiles(point, [0, n - 1], [tile.mr, tile.nr])
    # the full tiles' point loops have constant bounds: lowering marks them `unrolled` for
    # the backend (isl's own unrolling costs ten times the AST generation of the kernel)
    return point.insert_mark(isl.Id(UNROLL_MARK, context=point.get_ctx())).parent()


def _isolate_full_tiles(point: isl.ScheduleNode, unrolled: list[int],
                        sizes: list[int]) -> isl.ScheduleNode:
    """Unroll the point loops `unrolled` (of extents `sizes`) where the tile is full; the
    partial tiles at the edges keep one ordinary loop per member."""
    n = point.band_n_member()
    prefix = point.get_prefix_schedule_union_map()
    partial = point.band_get_partial_schedule_union_map()
    times = prefix.flat_range_product(partial).intersect_domain(point.get_domain()).range()
    times = isl.Set.from_union_set(times)
    outer = times.dim(isl.dim_type.set) - n
    prefixes = times.project_out(isl.dim_type.set, outer, n)
    box = isl.Set.universe(times.get_space())
    for k in range(n):
        dim = outer + k
        if k in unrolled:
            extent = sizes[unrolled.index(k)]
            box = box.lower_bound_val(isl.dim_type.set, dim, isl.Val.int_from_si(box.get_ctx(), 0))
            box = box.upper_bound_val(isl.dim_type.set, dim,
                                      isl.Val.int_from_si(box.get_ctx(), extent - 1))
        else:
            box = box.fix_val(isl.dim_type.set, dim, isl.Val.int_from_si(box.get_ctx(), 0))
    wanted = box.intersect(prefixes.insert_dims(isl.dim_type.set, outer, n))
    missing = wanted.subtract(times).project_out(isl.dim_type.set, outer, n)
    full = _convex_if_possible(prefixes.subtract(missing).coalesce(), times, outer, n,
                               unrolled, sizes)
    # only what tells a full tile from a partial one: the constraints that the prefixes'
    # hull implies change nothing (isl isolates within the domain), but they cost isl's AST
    # generator most of its time (a 3x3 convolution: 0.8 s of AST generation, 0.3 s)
    full = full.gist(prefixes.simple_hull()).coalesce()
    if full.is_empty():
        for k in range(n):
            point = point.band_member_set_ast_loop_type(k, isl.ast_loop_type.atomic)
        return point
    isolate = isl.Map.from_domain_and_range(
        full, isl.Set.universe(isl.Space.set_alloc(point.get_ctx(), 0, n)))
    # (a union of pieces here is isolated by isl only in part: M = 500 with mr = 8 lost
    # its register tile in every step, the row loop a loop, not only in the last one)
    isolate = isolate.wrap().set_tuple_name("isolate")
    point = point.band_set_ast_build_options(isl.UnionSet.from_set(isolate))
    # the partial tiles separated along the unrolled members, so that an edge of one of
    # them (the last 21 lanes of N = 501, the last 4 rows of M = 500) has constant bounds
    # in the other and stays unrolled there (500x499x501: 1.98 ms atomic, 1.71 separated)
    for k in range(n):
        edge = isl.ast_loop_type.separate if k in unrolled else isl.ast_loop_type.atomic
        point = point.band_member_set_ast_loop_type(k, edge)
        point = point.band_member_set_isolate_ast_loop_type(k, isl.ast_loop_type.atomic)
    return point


def _convex_if_possible(full: isl.Set, times: isl.Set, outer: int, n: int,
                        unrolled: list[int], sizes: list[int]) -> isl.Set:
    """`full` (the prefixes of full tiles) as one convex piece where it is one. Computed
    as prefixes less those missing a point, it comes out as a union wherever the edge
    depends on two tile loops (the rows' edge of M = 500 at 128-row blocks of 8-row
    tiles: `c4 <= 13 or c0 <= 2`), and isl's AST generator leaves such a union mostly
    unisolated. A tile is full when its last point exists, in a rectangular domain: the
    prefixes whose last point is scheduled are `128 c0 + 8 c4 <= 492`, one piece. They
    are used only where they are exactly the full tiles."""
    if full.n_basic_set() <= 1:
        return full
    corner = times
    for k in range(n):
        last = sizes[unrolled.index(k)] - 1 if k in unrolled else 0
        corner = corner.fix_val(isl.dim_type.set, outer + k,
                                isl.Val.int_from_si(times.get_ctx(), last))
    corners = corner.project_out(isl.dim_type.set, outer, n).coalesce()
    if corners.n_basic_set() == 1 and corners.is_equal(full):
        return corners
    return full
