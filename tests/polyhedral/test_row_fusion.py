"""Row fusion, contraction of temporaries and stored terms, asserted on the loop IR.

Softmax, layernorm and RMS norm: the row reductions and their consumer run in one parallel
row loop; the per-row temporaries live in a `Scratch` inside it (one slice per iteration),
not in arrays the runtime allocates; softmax's exp is computed once per element. Where the
rows share a two-dimensional operand, or a temporary is used by two nests, nothing changes.
"""

from __future__ import annotations

import pytest

import tclang as tc
from benchmarks import kernels as K
from polyhedral import loop_ir as L
from polyhedral.contraction import contract_temporaries
from polyhedral.pipeline import schedule_definition
from tclang.lang import program as P
from tclang.lang.frontend import check_source
from tclang.lang.passes.rewrite import postorder
from tclang.target import Target

from .loops import enclosing_loops, top_level

CPU = Target("cpu", "threads", cores=4, vector_bytes=32)
ROWS = {  # source, sizes, the row temporaries, the consumer's statement target
    "softmax": (K.SOFTMAX, dict(N=61, D=47), {"m", "s"}),
    "layernorm": (K.LAYERNORM, dict(N=61, D=47), {"mean", "var"}),
    "rmsnorm": (K.RMSNORM, dict(N=61, D=47), {"ms"}),
}
ATTENTION = """def attn(float(M,K) Q, float(N,K) Kt) -> (P) {
  S(i, j) +=! Q(i, k) * Kt(j, k)
  m(i) max=! S(i, j)
  P(i, j) = exp(S(i, j) - m(i))
}"""
TWO_NESTS = """def twice(float(N,D) X) -> (Y, Z) {
  t(n) +=! X(n, d)
  Y(n, d) = X(n, d) / t(n)
  Z(d) +=! X(n, d) * t(n)
}"""


def schedule(source, sizes, options=tc.Options(), target=CPU):
    return schedule_definition(check_source(source).definitions[0], sizes, options, target)


def outer_loop_of(kernel: L.Kernel, statement: str) -> L.For:
    (chain, _), *rest = list(enclosing_loops(kernel.body, statement))
    assert all(c[0] is chain[0] for c, _ in rest)
    return chain[0]


def scratch_nodes(node):
    return [n for n in L.walk_nodes(node) if isinstance(n, L.Scratch)]


def statements_writing(kernel: L.Kernel, target: str) -> list[str]:
    return [s.id for s in kernel.statements if s.target == target]


@pytest.mark.parametrize("name", sorted(ROWS))
def test_row_reductions_and_their_consumer_run_in_one_parallel_row_loop(name):
    source, sizes, _ = ROWS[name]
    kernel = schedule(source, sizes).kernel
    (row,) = top_level(kernel)
    assert isinstance(row, L.For) and row.parallel
    for s in kernel.statements:  # every statement, the consumer Y included, in that loop
        assert outer_loop_of(kernel, s.id) is row, s.id
    (consumer,) = statements_writing(kernel, "Y")
    (chain, _), = list(enclosing_loops(kernel.body, consumer))
    assert len(chain) == 2 and chain[1].parallel  # the row loop, then one row's d loop


@pytest.mark.parametrize("name", sorted(ROWS))
def test_row_temporaries_are_contracted_to_one_slice_per_row(name):
    source, sizes, temporaries = ROWS[name]
    kernel = schedule(source, sizes).kernel
    assert not [b for b in kernel.buffers if b.kind == "temporary"]  # nothing allocated
    plans = {p.buffer.name: p for p in kernel.temporaries}
    assert temporaries <= set(plans)
    assert all(p.contracted for p in plans.values())
    (row,) = top_level(kernel)
    assert isinstance(row.body, L.Scratch)  # inside the row loop: per iteration, per thread
    declared = {b.name: b for b in row.body.buffers}
    for name in temporaries:
        assert declared[name].shape == (L.Int(1),), declared[name]
        assert plans[name].loop == row.var
    # every access to them goes to the slice
    for s in kernel.statements:
        touches = {s.target} | {r.tensor for r in P.reads_of(s.value)}
        for _, run in enclosing_loops(kernel.body, s.id):
            promoted = {p.buffer for p in run.promoted}
            assert touches & set(declared) <= promoted, (s.id, run.promoted)


def test_softmax_computes_each_exponential_once():
    kernel = schedule(K.SOFTMAX, dict(N=61, D=47)).kernel
    exps = [s.id for s in kernel.statements
            if any(type(x) is P.Call and x.name == "exp" for x in postorder([s.value]))]
    assert len(exps) == 1, exps
    (stored,) = [p for p in kernel.temporaries if p.buffer.name not in ("m", "s")]
    assert stored.contracted
    (row,) = top_level(kernel)
    (slice_,) = [b for b in row.body.buffers if b.name == stored.buffer.name]
    assert slice_.shape == (L.Int(1), L.Int(47))  # one row, on the thread's stack


def test_a_term_whose_row_is_too_big_for_a_slice_is_recomputed():
    kernel = schedule(K.SOFTMAX, dict(N=4, D=8192)).kernel  # 32 KiB a row
    exps = [s.id for s in kernel.statements
            if any(type(x) is P.Call and x.name == "exp" for x in postorder([s.value]))]
    assert len(exps) == 2
    assert {p.buffer.name for p in kernel.temporaries} == {"m", "s"}


@pytest.mark.parametrize("fusion", ["preserve_parallel", "min"])
def test_fusion_named_by_hand_is_isls_alone(fusion):
    kernel = schedule(K.SOFTMAX, dict(N=61, D=47), tc.Options(fusion=fusion)).kernel
    (consumer,) = statements_writing(kernel, "Y")
    (m_init,) = [s.id for s in kernel.statements if s.target == "m" and s.kind == "init"]
    assert outer_loop_of(kernel, consumer) is not outer_loop_of(kernel, m_init)


def test_fusion_max_fuses_rows_too():
    kernel = schedule(K.LAYERNORM, dict(N=61, D=47), tc.Options(fusion="max")).kernel
    assert len(top_level(kernel)) == 1


def test_rows_that_share_a_matrix_keep_its_nest():
    """Attention's product reads Kt in every row: it keeps its tiled nest (register tile and
    packing), and only the softmax part runs one pass per row."""
    kernel = schedule(ATTENTION, dict(M=64, K=32, N=48)).kernel
    (product,) = [s.id for s in kernel.statements if s.target == "S" and s.kind == "reduce"]
    (consumer,) = statements_writing(kernel, "P")
    (m_init,) = [s.id for s in kernel.statements if s.target == "m" and s.kind == "init"]
    assert outer_loop_of(kernel, product) is not outer_loop_of(kernel, consumer)
    assert outer_loop_of(kernel, m_init) is outer_loop_of(kernel, consumer)
    assert any(loop.unrolled for chain, _ in enclosing_loops(kernel.body, product)
               for loop in chain)
    plans = {p.buffer.name: p for p in kernel.temporaries}
    assert plans["m"].contracted and not plans["S"].contracted
    assert "more than one loop nest" in plans["S"].note
    assert kernel.buffer("S").kind == "temporary"


def test_a_temporary_two_nests_use_is_kept_and_says_why():
    kernel = schedule(TWO_NESTS, dict(N=37, D=29)).kernel
    (plan,) = kernel.temporaries
    assert not plan.contracted and "more than one loop nest" in plan.note
    assert kernel.buffer("t").kind == "temporary"


def test_loops_header_says_what_was_contracted_and_what_kept():
    from polyhedral.loop_format import format_kernel
    text = format_kernel(schedule(K.LAYERNORM, dict(N=61, D=47)).kernel)
    assert "// temporary float32 mean[61]: contracted to mean[1], one per iteration of c0" \
        in text
    text = format_kernel(schedule(TWO_NESTS, dict(N=37, D=29)).kernel)
    assert "// temporary float32 t[37]: kept: it is used in more than one loop nest" in text


def test_shape_generic_rows_fuse_and_contract_scalars():
    kernel = schedule(K.LAYERNORM, None).kernel
    (row,) = top_level(kernel)
    assert isinstance(row, L.For) and row.parallel
    assert all(p.contracted for p in kernel.temporaries)


def test_the_gpu_keeps_its_block_reductions():
    gpu = Target("cuda", "grid")
    kernel = schedule(K.SOFTMAX, dict(N=61, D=47), target=gpu).kernel
    assert not kernel.temporaries and {b.name for b in kernel.buffers} >= {"m", "s"}


def test_contraction_leaves_a_zero_filled_temporary():
    source = """def f(float(N,D) X) -> (Y) {
      t(n) += X(n, d)
      Y(n, d) = X(n, d) * t(n)
    }"""
    with pytest.warns(tc.TCWarning):
        kernel = schedule(source, dict(N=5, D=3)).kernel
    (plan,) = kernel.temporaries
    assert not plan.contracted and "zeros" in plan.note


def test_contraction_is_idempotent_and_pure():
    kernel = schedule(K.SOFTMAX, dict(N=61, D=47)).kernel
    assert contract_temporaries(kernel).buffers == kernel.buffers


def test_a_pointwise_temporary_becomes_a_scalar_of_its_innermost_loop():
    source = """def f(float(N,D) X, float(D) b) -> (Y) {
      t(n, d) = X(n, d) + b(d)
      Y(n, d) = t(n, d) * t(n, d)
    }"""
    kernel = schedule(source, dict(N=37, D=29)).kernel
    (plan,) = kernel.temporaries
    assert plan.contracted and plan.note == "t[1][1]"
    (scratch,) = scratch_nodes(kernel.body)
    (chain, _), = list(enclosing_loops(kernel.body, kernel.statements[0].id))
    assert chain[-1].body is scratch and plan.loop == chain[-1].var
    assert scratch.buffers[0].shape == (L.Int(1), L.Int(1))


def test_a_temporary_accumulated_across_iterations_is_kept():
    """t(d) sums over n in the loop around it: every iteration of that loop touches the
    same elements, so no slice per iteration can hold it."""
    source = """def f(float(N,D) X) -> (Y) {
      t(d) +=! X(n, d)
      Y(n, d) = X(n, d) - t(d)
    }"""
    kernel = schedule(source, dict(N=37, D=29)).kernel
    plans = {p.buffer.name: p for p in kernel.temporaries}
    assert not plans["t"].contracted
    assert kernel.buffer("t").kind == "temporary"


def test_the_passes_of_a_row_are_transformed_as_nests():
    """Below the row loop, a pass over a two-dimensional slab is a nest of its own for the
    CPU passes (tiling where it pays, the stride-1 loop innermost): the band reports list
    the row band and each pass's band."""
    source = """def f(float(B, I, J) X) -> (Y) {
      s(b) +=! X(b, i, j)
      Y(b, i, j) = X(b, i, j) / s(b)
    }"""
    scheduled = schedule(source, dict(B=8, I=64, J=256))
    kernel = scheduled.kernel
    (row,) = top_level(kernel)
    assert isinstance(row, L.For) and row.parallel
    assert len(scheduled.bands) == 3  # the row band, then each pass's band
    (consumer,) = statements_writing(kernel, "Y")
    for chain, run in enclosing_loops(kernel.body, consumer):
        j = dict(zip(kernel.statement(consumer).indices, run.indices))["j"]
        assert chain[-1].var in L.variables(j)


def test_the_strategy_says_rows_were_fused():
    assert schedule(K.SOFTMAX, dict(N=61, D=47)).strategy == "preserve_parallel + rows"
    assert schedule(K.BIAS_GELU, dict(N=61, D=47)).strategy == "preserve_parallel"
    assert schedule(K.SOFTMAX, dict(N=61, D=47),
                    tc.Options(fusion="min")).strategy == "min"
