"""Packing of the micro-kernel's lane operand (polyhedral/packing.py), asserted on the loop
IR: which operand is copied, into what, and that every read of it below the copy goes to
the packed buffer; never on timing."""

import pytest

import tclang as tc
from polyhedral import loop_ir as L
from polyhedral.pipeline import schedule_definition
from tclang.lang.frontend import check_source
from tclang.target import Target

from .loops import executed_instances
from .test_register_tiles import CONTRACTIONS

AVX2 = Target("cpu", "threads", cores=2, vector_bytes=32, l1_bytes=32 * 1024)
AVX512 = Target("cpu", "threads", cores=2, vector_bytes=64, l1_bytes=32 * 1024)


def scheduled(source, sizes, options=tc.Options(), target=AVX2):
    return schedule_definition(check_source(source).definitions[0], sizes, options,
                               target).kernel


def scratches(kernel: L.Kernel) -> list[L.Scratch]:
    return [n for n in L.walk_nodes(kernel.body) if isinstance(n, L.Scratch)]


def reads_of(kernel: L.Kernel, run: L.Run, tensor: str):
    statement = kernel.statement(run.statement)
    from tclang.lang.program import reads_of as program_reads
    return [r for r in program_reads(statement.value) if r.tensor == tensor]


#: sizes with enough rows per cache tile (4 register-tile steps) for packing to pay
ROWS = {"matmul": dict(M=128, K=24, N=48), "matmul_renamed": dict(P=131, Q=29, R=71),
        "batched": dict(B=2, N=64, M=16, K=40), "mlp_epilogue": dict(B=96, I=32, O=48)}


@pytest.mark.parametrize("name,tensor", [("matmul", "B"), ("matmul_renamed", "Y"),
                                         ("batched", "Y"), ("mlp_epilogue", "W")])
def test_the_operand_read_along_the_lanes_is_packed(name, tensor):
    source, _ = CONTRACTIONS[name]
    kernel = scheduled(source, ROWS[name])
    found = scratches(kernel)
    assert found, "nothing packed"
    for scratch in found:
        (buffer,) = scratch.buffers
        assert buffer.kind == "scratch" and buffer.name.startswith(f"{tensor}_packed")
        # a kc x nr sliver: nr = 16 float32 lanes (one cache line a row), the rows along
        # the reduction
        assert buffer.shape[-1] == L.Int(16)
        copies = [n for n in L.walk_nodes(scratch.body) if isinstance(n, L.Copy)]
        assert copies and all(c.tensor == tensor and c.buffer == buffer.name for c in copies)
        runs = [n for n in L.walk_nodes(scratch.body) if isinstance(n, L.Run)]
        reading = [r for r in runs if reads_of(kernel, r, tensor)]
        assert reading
        for run in reading:  # every read of the operand below the copy goes to the buffer
            refs = {r.ref for r in reads_of(kernel, run, tensor)}
            assert {p.ref for p in run.promoted if p.buffer == buffer.name} == refs
        for run in runs:  # and nothing else is redirected (an init reads nothing)
            if run not in reading:
                assert not run.promoted
    # and nowhere else is the operand read from its tensor in a register tile
    inside = {id(n) for s in found for n in L.walk_nodes(s)}
    outside = [n for n in L.walk_nodes(kernel.body) if isinstance(n, L.Run) and
               id(n) not in inside and reads_of(kernel, n, tensor)]
    assert not outside


@pytest.mark.parametrize("source,sizes,tensor,lane_dim,dot_form", [
    # x @ w.T: W(o, i) moves its first subscript with the lanes o
    ("def mlp(float(B,I) X, float(O,I) W) -> (Y) { Y(n, o) +=! X(n, i) * W(o, i) }",
     dict(B=96, I=40, O=48), "W", 0, True),
    # attention's scores: K(t, d) across the lanes t
    ("def s(float(S,D) Q, float(T,D) K) -> (Sc) { Sc(s, t) +=! Q(s, d) * K(t, d) }",
     dict(S=64, D=24, T=37), "K", 0, True),
    # a 3-d operand, lanes in the middle; W is not contiguous along i: no dot form
    ("def c(float(N,I) X, float(I,O,J) W) -> (Y) { Y(n, o) +=! X(n, i) * W(i, o, 2) }",
     dict(N=64, I=20, O=33, J=3), "W", 1, False),
])
def test_an_operand_the_lanes_read_with_a_stride_is_packed_lanes_first(source, sizes, tensor,
                                                                     lane_dim, dot_form):
    """With pack=True, packed whatever the reuse (unpacked, the outer-product tile would
    gather), into a buffer whose dimension along the lanes is contiguous; the copy is not
    vectorized. With pack=False (the dot form), not packed; by default, packed with
    AVX-512 (the dot form's strided lanes ran 20x slower there), and with AVX2 only
    where no dot form exists (no reduction every operand is contiguous along: W(i, o, 2))."""
    kernel = scheduled(source, sizes, tc.Options(pack=True))
    found = scratches(kernel)
    assert found
    for scratch in found:
        (buffer,) = scratch.buffers
        assert buffer.name.startswith(f"{tensor}_packed")
        assert buffer.shape[lane_dim] == L.Int(16) and buffer.strides[lane_dim] == 1
        copies = [n for n in L.walk_nodes(scratch.body) if isinstance(n, L.For)
                  and n.var.startswith(buffer.name)]
        assert copies and not any(c.vectorize for c in copies)
    plain = executed_instances(scheduled(source, sizes, tc.Options(pack=False)))  # dot form
    packed = executed_instances(kernel)
    assert {s: sorted(v) for s, v in packed.items()} == {s: sorted(v) for s, v in plain.items()}
    assert all(len(set(v)) == len(v) for v in packed.values())
    assert not scratches(scheduled(source, sizes, tc.Options(pack=False)))
    assert bool(scratches(scheduled(source, sizes))) != dot_form
    assert scratches(scheduled(source, sizes, target=AVX512))
    assert not scratches(scheduled(source, sizes, tc.Options(pack=False), target=AVX512))


@pytest.mark.parametrize("name", sorted(CONTRACTIONS))
def test_packing_changes_no_instance(name):
    source, sizes = CONTRACTIONS[name]
    plain = executed_instances(scheduled(source, sizes, tc.Options(pack=False)))
    packed = executed_instances(scheduled(source, sizes, tc.Options(pack=True)))
    assert plain == packed


def test_packing_needs_enough_rows_unless_forced():
    source, _ = CONTRACTIONS["matmul"]
    few = dict(M=8, K=24, N=48)  # two register-tile steps of 4 rows: the copy does not pay
    assert not scratches(scheduled(source, few))
    assert scratches(scheduled(source, few, tc.Options(pack=True)))
    assert scratches(scheduled(source, ROWS["matmul"]))
    assert not scratches(scheduled(source, ROWS["matmul"], tc.Options(pack=False)))
    assert not scratches(scheduled(source, ROWS["matmul"], tc.Options(register_tile=False)))


def test_an_operand_written_by_the_kernel_is_not_packed():
    source = ("def two(float(M,K) A, float(K,N) B) -> (T, C) {\n"
              " T(k, n) = B(k, n) * 2\n C(m, n) +=! A(m, k) * T(k, n) }")
    kernel = scheduled(source, dict(M=64, K=24, N=48), tc.Options(pack=True))
    assert all(not b.name.startswith("T_") for s in scratches(kernel) for b in s.buffers)


def test_the_sliver_fits_half_of_l1():
    source, _ = CONTRACTIONS["matmul"]
    small = Target("cpu", "threads", cores=2, vector_bytes=32, l1_bytes=2048)
    found = scratches(scheduled(source, dict(M=64, K=300, N=48), target=small))
    assert found
    for scratch in found:
        for b in scratch.buffers:
            volume = 4
            for d in b.shape:
                volume *= d.value
            assert volume <= 1024


# issue 33 item 1: contractions of any layout
REGRESSION = "def c3(float(A,K,C) X, float(K,B) W) -> (O) { O(a,b,c) +=! X(a,k,c) * W(k,b) }"


def packed_buffers(kernel: L.Kernel) -> dict[str, L.Buffer]:
    return {b.name.split("_packed")[0]: b for s in scratches(kernel) for b in s.buffers}


def test_the_rows_operand_read_a_row_apart_is_packed_reduction_innermost_with_avx2():
    """W(k, b) of O(a, b, c) +=! X(a, k, c) * W(k, b): each reduction step of the tile read
    a new line of W a row apart; its block (256 x 256, a model-sized one) once had the
    sliver's budget, half of L1, and was never packed with AVX2. Now it is, k innermost
    (strides (1, 272): a row of the block per b, padded off 1 KiB)."""
    sizes = dict(A=64, K=256, C=64, B=256)
    w = packed_buffers(scheduled(REGRESSION, sizes))["W"]
    assert [d.value for d in w.shape] == [256, 256] and w.strides == (1, 256 + 16)


@pytest.mark.parametrize("c,packed", [(16, False), (64, True)])
def test_a_lane_sliver_already_contiguous_is_not_copied(c, packed):
    """X(a, k, c) with C = 16 (the tile's nr): the sliver X[a][0:kc][0:16] is one run of
    memory already, a copy would only duplicate it; with C = 64 its rows are 256 B apart
    and it is packed."""
    kernel = scheduled(REGRESSION, dict(A=8, K=64, C=c, B=64))
    assert ("X" in packed_buffers(kernel)) == packed


def test_in_layout_boxes():
    """Ones, then one partial dimension, then whole ones: one run of memory."""
    from polyhedral.packing import in_layout
    from polyhedral.scop import build_scop
    scop = build_scop(check_source(REGRESSION).definitions[0], dict(A=8, K=64, C=64, B=64))
    assert in_layout(scop, "X", (1, 64, 64)) and in_layout(scop, "X", (1, 4, 64))
    assert in_layout(scop, "X", (1, 1, 16)) and in_layout(scop, "X", (8, 64, 64))
    assert not in_layout(scop, "X", (1, 64, 16)) and not in_layout(scop, "X", (2, 1, 64))


def test_a_result_stride_one_index_no_operand_is_contiguous_along_gets_a_packed_tile():
    """O(a, d, c, b) +=! P(f, c, e, b, a) * Q(f, d, e): the lanes b are read a stride apart
    in P and no reduction is contiguous in both operands (no dot form). Before, no register
    tile at all (scalar loops, the init's guard in the innermost one: 0.02x of np.einsum);
    now the outer-product tile, P packed lanes-first, as with AVX-512."""
    source = ("def f(float(F,C,E,B,A) P, float(F,D,E) Q) -> (O) { O(a,d,c,b) +=! "
              "P(f,c,e,b,a) * Q(f,d,e) }")
    sizes = dict(F=9, C=4, E=13, B=20, A=3, D=18)
    # without the passes: the copies into a matrix product's layout would copy P whole
    # first (its depth f, e is no run in it: tclang/lang/passes/contraction_layouts.py)
    kernel = scheduled(source, sizes, tc.Options(passes=False))
    p = packed_buffers(kernel)["P"]
    assert p.shape[3] == L.Int(16) and p.strides[3] == 1
    assert any(isinstance(n, L.For) and n.unrolled for n in L.walk_nodes(kernel.body))
    plain = executed_instances(scheduled(source, sizes,
                                         tc.Options(register_tile=False, passes=False)))
    assert {s: sorted(v) for s, v in executed_instances(kernel).items()} == \
        {s: sorted(v) for s, v in plain.items()}
