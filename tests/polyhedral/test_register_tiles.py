"""Register tiles of contraction bands (the CPU micro-kernel), asserted on the loop IR and on
the accumulators the LLVM backend carries in registers; never on timing."""

import pytest

import tclang as tc
from backends.llvm import accumulators, lanes
from polyhedral import loop_ir as L
from polyhedral import register_tiles
from polyhedral.pipeline import schedule_definition
from tclang.errors import TCScheduleError
from tclang.lang.frontend import check_source
from tclang.layouts import layout_key, row_major
from tclang.target import Target

from .loops import enclosing_loops, executed_instances

AVX2 = Target("cpu", "threads", cores=2, vector_bytes=32)
AVX512 = Target("cpu", "threads", cores=2, vector_bytes=64)

CONTRACTIONS = {
    "matmul": ("def mm(float(M,K) A, float(K,N) B) -> (C) { C(m, n) +=! A(m, k) * B(k, n) }",
               dict(M=40, K=24, N=48)),
    # other names, the operands the other way round, odd sizes: the same micro-kernel
    "matmul_renamed": ("def mm(float(P,Q) X, float(Q,R) Y) -> (Z) {"
                       " Z(row, col) +=! Y(q, col) * X(row, q) }", dict(P=37, Q=29, R=71)),
    "batched": ("def bmm(float(B,N,M) X, float(B,M,K) Y) -> (Z) {"
                " Z(b, n, k) +=! X(b, n, m) * Y(b, m, k) }", dict(B=3, N=20, M=16, K=40)),
    "conv2d": ("def conv(float(N,C,H,W) I, float(M,C,KH,KW) Wt) -> (O) {"
               " O(n, m, h, w) +=! I(n, c, h + kh, w + kw) * Wt(m, c, kh, kw) }",
               dict(N=2, C=3, H=7, W=21, M=8, KH=3, KW=3)),
    "mlp_epilogue": ("def mlp(float(B,I) X, float(I,O) W, float(O) b) -> (Y) {\n"
                     " Y(n, o) +=! X(n, i) * W(i, o)\n Y(n, o) = fmax(Y(n, o) + b(o), 0) }",
                     dict(B=24, I=32, O=48)),
}


def scheduled(source, sizes, options=tc.Options(), target=AVX2):
    """The scheduled kernel, for row-major inputs (their strides are the code's)."""
    definition = check_source(source).definitions[0]
    layouts = []
    for tensor in definition.inputs:
        shape = [e.evaluate(sizes) for e in tensor.shape]
        layouts.append(layout_key(shape, row_major(shape)))
    return schedule_definition(definition, sizes, options, target, tuple(layouts))


def flat(node) -> list:
    """The nodes of nested blocks and conditions, in order (isl may leave a guard it could
    have dropped around some rows)."""
    if isinstance(node, L.Block):
        return [x for item in node.body for x in flat(item)]
    if isinstance(node, L.If):
        return flat(node.then) + (flat(node.other) if node.other is not None else [])
    return [node]


def updates(node) -> list[tuple[L.Run, int]]:
    """The updates in a loop body as the LLVM backend emits them: (run, lanes), a vector
    of lanes for each run of a lane loop, else 1; None if something else is there."""
    found = []
    for item in flat(node):
        if isinstance(item, L.For) and item.unrolled:
            found += [(run, lanes.lanes(item)) for run in flat(item.body)]
        elif isinstance(item, L.Run):
            found.append((item, 1))
        else:
            return None
    return found


def elements(node) -> int:
    return sum(width for _, width in updates(node))


def micro_kernels(kernel: L.Kernel, vectors: bool = True):
    """The loops whose bodies are straight runs of updates of one statement, with the
    accumulators the backend keeps in registers through them, in the backend's view of
    the kernel: the register tile's unrolled loops expanded, but for the vector lanes."""
    found = []

    def visit(node):
        match node:
            case L.For(body=body) if not node.unrolled:
                runs = updates(body)
                if runs and sum(w for _, w in runs) > 1 and \
                        len({r.statement for r, _ in runs}) == 1 and not node.parallel:
                    found.append((node, accumulators.plan(node, kernel)))
                visit(body)
            case L.If(then=t, other=o):
                visit(t)
                if o is not None:
                    visit(o)
            case L.Block(body=items):
                for item in items:
                    visit(item)
            case L.Scratch(body=b):
                visit(b)
    visit(lanes.expand_unrolled(kernel, vectors))
    return found


@pytest.mark.parametrize("name", sorted(CONTRACTIONS))
def test_contractions_get_a_register_tile_kept_in_registers(name):
    source, sizes = CONTRACTIONS[name]
    kernel = scheduled(source, sizes).kernel
    mr, nr = register_tiles.shape_for(AVX2, 4)
    assert (mr, nr) == (4, 16)
    tiles = micro_kernels(kernel)
    assert tiles, f"no register tile in\n{kernel.body}"
    # full tiles: mr x nr updates of distinct elements, carried through the reduction
    # loop, mr vectors of nr lanes; partial tiles whose loops have constant bounds are
    # unrolled too (fewer updates)
    assert any(elements(loop.body) == mr * nr for loop, _ in tiles)
    for loop, promotion in tiles:
        assert elements(loop.body) <= mr * nr
        assert promotion is not None
        assert sum(a.lanes for a in promotion.accumulators) == elements(loop.body)
        if elements(loop.body) == mr * nr:
            assert [a.lanes for a in promotion.accumulators] == [nr] * mr
        assert loop.reduction


@pytest.mark.parametrize("name", sorted(CONTRACTIONS))
def test_the_loop_ir_keeps_the_register_tile_as_loops(name):
    """The tile's points are loops of constant bounds marked `unrolled` (rows, then the
    lanes, marked vectorize: they carry nothing), not mr x nr statements; scalar
    expansion (the backend's, where the lanes cannot be vectors) gives every point."""
    source, sizes = CONTRACTIONS[name]
    kernel = scheduled(source, sizes).kernel
    mr, nr = register_tiles.shape_for(AVX2, 4)
    unrolled = [n for n in L.walk_nodes(kernel.body) if isinstance(n, L.For) and n.unrolled]
    lane_loops = [n for n in unrolled if n.vectorize and lanes.lanes(n) == nr]
    assert lane_loops and all(isinstance(n.lo, L.Int) and isinstance(n.hi, L.Int)
                              for n in unrolled)
    runs = sum(isinstance(n, L.Run) for n in L.walk_nodes(kernel.body))
    assert runs < mr * nr  # the whole kernel, every variant of the tile
    scalar = micro_kernels(kernel, vectors=False)
    assert any(elements(loop.body) == len(flat(loop.body)) == mr * nr for loop, _ in scalar)


@pytest.mark.parametrize("name", sorted(CONTRACTIONS))
def test_accumulators_stay_in_registers_through_every_reduction_loop(name):
    """conv has three reduction loops (c, kh, kw) around its register tile: the full-tile
    test isl puts inside the innermost one is hoisted out of all of them, so the
    accumulators are carried through the whole reduction, not loaded and stored again on
    every (c, kh) step (conv 3x3 ran at 8.7 GFLOP/s that way; 41 after)."""
    source, sizes = CONTRACTIONS[name]
    kernel = scheduled(source, sizes).kernel
    carried = 0
    body = lanes.expand_unrolled(kernel, True)
    for loop, promotion in micro_kernels(kernel):
        if elements(loop.body) != 16 * 4:
            continue  # a partial tile
        statement = updates(loop.body)[0][0].statement
        for chain, _ in enclosing_loops(body, statement):
            chain = [f for f in chain if not f.unrolled]
            if chain[-1] != loop:
                continue
            reductions = []
            for outer in reversed(chain):
                if not outer.reduction or outer.parallel:
                    break
                reductions.append(outer)
            plan = accumulators.plan(reductions[-1], kernel)
            assert plan is not None and sum(a.lanes for a in plan.accumulators) == 16 * 4, \
                [f.var for f in reductions]
            carried += 1
    assert carried


@pytest.mark.parametrize("name", sorted(CONTRACTIONS))
def test_register_tiles_run_every_instance_once(name):
    """Full tiles unrolled, partial ones as loops, the peeled first reduction step: the
    union is still exactly the domain, each instance once."""
    source, sizes = CONTRACTIONS[name]
    plain = executed_instances(scheduled(source, sizes, tc.Options(register_tile=False)).kernel)
    tiled = executed_instances(scheduled(source, sizes).kernel)
    for sid in plain:
        assert sorted(tiled[sid]) == sorted(plain[sid])
        assert len(set(tiled[sid])) == len(tiled[sid])


def test_the_model_sizes_the_tile_for_the_machine():
    # AVX2: two vectors of lanes, the rows filling the 16 registers
    assert register_tiles.shape_for(AVX2, 4) == (4, 16)
    assert register_tiles.shape_for(AVX2, 8) == (4, 8)
    # AVX-512: the fewest loads per FMA, fewer rows on a near tie: 4 x 6 vectors
    assert register_tiles.shape_for(AVX512, 4) == (4, 96)
    assert register_tiles.shape_for(AVX512, 8) == (4, 48)
    # short loops: no tile wider than the lanes, rows that divide the rows' loop
    assert register_tiles.shape_for(AVX512, 4, 1024, 1024) == (4, 96)
    assert register_tiles.shape_for(AVX512, 4, 128, 128) == (6, 64)
    assert register_tiles.shape_for(AVX512, 4, 56, 64) == (8, 32)  # not 10 rows: 64 = 6*10 + 4
    assert register_tiles.shape_for(AVX512, 4, 16, 16) == (16, 16)
    # a short reduction stores each tile after few steps: at most 8 x 2 vectors
    assert register_tiles.shape_for(AVX512, 4, 4096, 4096, 64) == (8, 32)
    assert register_tiles.shape_for(AVX512, 4, 4096, 4096, 256) == (4, 96)
    assert register_tiles.shape_for(AVX512, 4, 1024, 6, 64) == (6, 32)
    for lanes, rows in ((56, 64), (100, 7), (16, 3), (1000, 999)):
        mr, nr = register_tiles.shape_for(AVX512, 4, lanes, rows)
        assert nr <= max(16, lanes) and mr <= rows and mr * nr // 16 + nr // 16 <= 30
    source, sizes = CONTRACTIONS["matmul"]
    tiles = micro_kernels(scheduled(source, sizes, target=AVX512).kernel)
    assert tiles and max(elements(loop.body) for loop, _ in tiles) <= register_tiles.MAX_UNROLLED


def test_the_cache_tiles_fill_half_of_l2_with_32_registers():
    """A 4 x 96 tile reads its kc x nr sliver from L2: the sliver and the mc x kc block
    share half of L2 with kc about 2 mc, kc split evenly over the reduction."""
    from polyhedral.bands import Member
    band = [Member(k, {}, 1024, k != 2) for k in range(3)]
    tile = register_tiles.RegisterTile(0, 1, (2,), 4, 96, "S0", 4)
    znver4 = Target("cpu", "threads", cores=2, vector_bytes=64, l2_bytes=1 << 20)
    mc, nc, kc = register_tiles.cache_tiles(band, tile, znver4)
    assert (kc, mc % 4) == (512, 0)  # two even blocks of K = 1024 (the model's kc: 425)
    assert (mc * kc + kc * 96) * 4 <= (1 << 20) // 2 * 1.25
    half = register_tiles.cache_tiles(band, tile, AVX512)  # 512 KiB of L2: shorter blocks
    assert half[2] < kc and half[0] < mc
    short = [Member(0, {}, 4096, True), Member(1, {}, 4096, True), Member(2, {}, 64, False)]
    mc_short, _, kc_short = register_tiles.cache_tiles(short, tile, znver4)
    assert kc_short == 64 and mc_short > mc  # a short reduction: taller blocks


def test_manual_shape_and_off():
    source, sizes = CONTRACTIONS["matmul"]
    tiles = micro_kernels(scheduled(source, sizes, tc.Options(register_tile=(2, 8))).kernel)
    assert tiles and max(elements(loop.body) for loop, _ in tiles) == 16
    assert not micro_kernels(scheduled(source, sizes, tc.Options(register_tile=False)).kernel)
    for bad in ((0, 8), (4,), True, "6x16"):
        with pytest.raises(TCScheduleError, match="register_tile"):
            tc.Options(register_tile=bad)


MLP_T = ("def mlp(float(B,I) X, float(O,I) W) -> (Y) { Y(n, o) +=! X(n, i) * W(o, i) }",
         dict(B=32, I=96, O=64))


@pytest.mark.parametrize("pack", [None, False])
def test_lanes_that_would_gather_take_the_dot_product_form(pack):
    """x @ w.T reads W(o, i) across the lanes with a stride. Unless packing is forced, the
    tile's vectors run along the reduction instead (every operand contiguous there), a
    vector of partial sums per result, for the loop vectorizer; an outer-product tile is
    for the SLP vectorizer."""
    assert register_tiles.dot_shape_for(AVX2) == (2, 4)
    assert register_tiles.dot_shape_for(AVX512) == (4, 5)
    tiles = micro_kernels(scheduled(*MLP_T, tc.Options(pack=pack)).kernel)
    assert tiles
    for loop, promotion in tiles:
        assert len(promotion.accumulators) == 8 and promotion.contiguous
    for loop, promotion in micro_kernels(scheduled(*CONTRACTIONS["matmul"]).kernel):
        assert not promotion.contiguous  # B(k, n) moves a row per step of k


def test_lanes_that_would_gather_keep_the_outer_product_when_packing_is_forced():
    """With pack=True, W is packed lanes-first and the tile is matmul's: 4 x 16
    accumulators carried through the reduction, for the SLP vectorizer."""
    tiles = micro_kernels(scheduled(*MLP_T, tc.Options(pack=True)).kernel)
    assert tiles and any(elements(loop.body) == 4 * 16 for loop, _ in tiles)
    for loop, promotion in tiles:
        assert promotion is not None and not promotion.contiguous


def test_not_a_contraction():
    """A plain row sum has no operand to reuse across rows or lanes."""
    rowsum = ("def s(float(N,D) X) -> (Y) { Y(n) +=! X(n, d) }", dict(N=64, D=64))
    assert not micro_kernels(scheduled(*rowsum).kernel)


def test_updates_that_read_their_own_tensor_are_not_carried():
    """An accumulator is only carried where nothing in the loop reads its tensor."""
    kernel = scheduled(*CONTRACTIONS["matmul"]).kernel
    (loop, promotion), *_ = micro_kernels(kernel, vectors=False)
    assert promotion is not None
    other = kernel.statements[0]
    assert other.kind == "init"
    # the same loop, with one update swapped for an instance that reads C: not carried
    s = kernel.statement(flat(loop.body)[0].statement)
    reading = L.StatementDef(s.id + "r", "A", s.indices, ("m", "k"), "reduce", "+", s.value)
    runs = flat(loop.body)
    runs[1] = L.Run(reading.id, runs[1].indices)
    changed = L.For(loop.var, loop.lo, loop.hi, loop.step, L.Block(tuple(runs)),
                    reduction=True)
    import dataclasses
    k2 = dataclasses.replace(kernel, statements=kernel.statements + (reading,))
    assert accumulators.plan(changed, k2) is None  # A is read by the other updates


def test_enclosing_chain_of_the_micro_kernel_is_parallel_outside():
    source, sizes = CONTRACTIONS["matmul"]
    kernel = scheduled(source, sizes).kernel
    chains = [chain for chain, _ in enclosing_loops(kernel.body, "S0")]
    assert all(chain[0].parallel for chain in chains)


def test_cache_sizes_come_from_the_os(tmp_path):
    """The model's L1 and L2 are the machine's (Linux sysfs), instruction caches and L3
    ignored; nothing readable leaves the Target's defaults."""
    from tclang.target import cache_sizes
    for index, (level, kind, size) in enumerate([(1, "Data", "48K"), (1, "Instruction", "32K"),
                                                (2, "Unified", "2048K"), (3, "Unified", "32M")]):
        d = tmp_path / f"index{index}"
        d.mkdir()
        (d / "level").write_text(f"{level}\n")
        (d / "type").write_text(f"{kind}\n")
        (d / "size").write_text(f"{size}\n")
    assert cache_sizes(str(tmp_path)) == {"l1_bytes": 48 << 10, "l2_bytes": 2 << 20}
    assert cache_sizes(str(tmp_path / "missing")) == {}
    # a bigger L1 gives a longer reduction tile (kc) around the same register tile
    from polyhedral.bands import Member
    band = [Member(k, {}, None, k != 2) for k in range(3)]
    small = register_tiles.cache_tiles(
        band, register_tiles.RegisterTile(0, 1, (2,), 4, 16, "S0", 4), AVX2)
    big_target = Target("cpu", "threads", cores=2, vector_bytes=32, l1_bytes=64 << 10)
    big = register_tiles.cache_tiles(
        band, register_tiles.RegisterTile(0, 1, (2,), 4, 16, "S0", 4), big_target)
    assert big[2] == 2 * small[2]


def test_a_stride_one_index_of_8_to_15_values_gets_a_one_vector_tile():
    """With 16 registers a tile is two vectors wide, 16 float32 lanes: a permuted
    contraction whose result's stride-1 index has 8-15 values got no tile at all. Now one
    vector a row, 7 rows (7 accumulators, 7 broadcasts, one operand vector)."""
    assert register_tiles.shape_for(AVX2, 4, lane_extent=10) == (7, 8)
    assert register_tiles.shape_for(AVX2, 4, lane_extent=16) == (4, 16)
    assert register_tiles.shape_for(AVX2, 4) == (4, 16)
