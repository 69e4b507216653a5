"""Dependence analysis: isl's exact dataflow analysis, and the memory-based dependences
that stand in for it where it blows up."""

import islpy as isl
import numpy as np
import pytest

import tclang as tc
from polyhedral import dependences
from polyhedral.scop import build_scop
from tclang.lang.frontend import check_source

MLP2 = ("def mlp2(float(B,I) X, float(H,I) W1, float(H) b1, float(O,H) W2, float(O) b2)"
        " -> (Y) {\n Hd(n, h) +=! X(n, i) * W1(h, i)\n Hd(n, h) = fmax(Hd(n, h) + b1(h), 0)"
        "\n Y(n, o) +=! Hd(n, h) * W2(o, h)\n Y(n, o) = fmax(Y(n, o) + b2(o), 0) }")

# S0 writes all of O, S1 only a part: S2's reads reach back to S0, the last statement that
# wrote all of them (its window), and memory-based dependences come from both writers
PARTIAL_WRITES = """def f(float(N) A) -> (O) {
    O(i) = A(i)
    O(i) = A(i) * 2.0 where i in 0:2
    O(i) = O(i) + 1.0
}"""

# found by `tclang fuzz` (seed 0, program 1437) with specialize=False: the exact analysis
# took 41 s and coalescing its result 16 s more (the whole compile 72 s; now about 2 s)
SYMBOLIC_DATAFLOW = """def kernel(float32(K, 3, N, N) A) -> (O0, O1) {
    O0(j, k, i, l) = (((A(K - 1 - i, j, l, k) <= 0.0) ? hypot(1.5, ((!(2*l - 1 < 0 || 2*l - 1 >= K) && l - l >= 0 && l - l < N) ? A(2*l - 1, j, l - l, 0) : 0)) : double(j)) * A(i, j, k, l))
    O1(m, j, l) min=! ((!(((!(n - k < 0 || n - k >= K) && !(2*m - 4 < 0 || 2*m - 4 >= N)) ? O0(j, k, n - k, 2*m - 4) : 0) < 1e30) || (j != N)) ? ((n - l >= 0 && n - l < N && !(K - i < 0 || K - i >= K)) ? O0(j, n - l, K - i, N - 1 - k) : 0.0) : (fma(min(((((!(N - m < 0 || N - m >= N) && j - 1 >= 0 && j - 1 < N) ? O0(j, N - m, n, j - 1) : 0) < 1e30) ? (1.5 * ((!(N - j < 0 || N - j >= N)) ? O0(3 - 1 - j, l, i, N - j) : 0.0)) : double(j)), (-(((!(n - k < 0 || n - k >= N) && N - l >= 0 && N - l < N) ? O0(j, n - k, i, N - l) : 0) * 0.5 + (-0.75)))), O0(j, m, n, m), 0.25) - A(i, j, k, l)))
}"""


@pytest.mark.parametrize("sizes", [None, dict(B=3, I=5, H=4, O=2)], ids=["symbolic", "fixed"])
def test_memory_based_dependences_contain_the_exact_ones(monkeypatch, sizes):
    scop = build_scop(check_source(MLP2).definitions[0], sizes)
    exact = dependences.compute_dependences(scop)
    monkeypatch.setattr(dependences, "FLOW_OPERATIONS_PER_STATEMENT", 1)
    coarse = dependences.compute_dependences(scop)
    assert exact.flow.is_subset(coarse.flow) and exact.false.is_subset(coarse.false)
    assert exact.validity.is_subset(coarse.validity)
    # every earlier writer, not just the last: back to the statements that overwrite all
    # of what a statement accesses (before them, nothing reaches it; MLP2 has one writer
    # of each element between such statements, so there both are the same)
    scop = build_scop(check_source(PARTIAL_WRITES).definitions[0],
                      None if sizes is None else dict(N=5))
    monkeypatch.setattr(dependences, "FLOW_OPERATIONS_PER_STATEMENT", 500_000)
    exact = dependences.compute_dependences(scop)
    monkeypatch.setattr(dependences, "FLOW_OPERATIONS_PER_STATEMENT", 1)
    coarse = dependences.compute_dependences(scop)
    assert exact.flow.is_subset(coarse.flow) and not coarse.flow.is_subset(exact.flow)
    into_last = isl.UnionSet("[N] -> { S2[i] }" if sizes is None else "{ S2[i] }",
                             context=scop.ctx)
    assert coarse.flow.intersect_range(into_last).domain().is_equal(
        scop.domain.intersect(isl.UnionSet("[N] -> { S0[i]; S1[i] }" if sizes is None
                                           else "{ S0[i]; S1[i] }", context=scop.ctx)))


@pytest.mark.filterwarnings("ignore::tclang.errors.TCWarning")
def test_a_dataflow_blowup_gives_way_to_memory_based_dependences():
    """Before, the exact dependences of this program were so large that the scheduler ran
    past its time limit under every strategy too (program order, after about a minute)."""
    from polyhedral.pipeline import schedule_definition
    from tclang.target import reference_target
    defn = check_source(SYMBOLIC_DATAFLOW).definitions[0]
    result = schedule_definition(defn, None, tc.Options(), reference_target())
    assert result.strategy == "preserve_parallel" and result.fallback is None


@pytest.mark.filterwarnings("ignore::tclang.errors.TCWarning")
def test_memory_based_dependences_give_the_same_results(monkeypatch, fresh_middle_end):
    """Forced everywhere (the middle end's process, forked after the patch, too), the
    coarser dependences still schedule correct code."""
    monkeypatch.setattr(dependences, "FLOW_OPERATIONS_PER_STATEMENT", 1)
    rng = np.random.default_rng(0)
    X, W1, b1 = (rng.standard_normal(s).astype(np.float32) for s in ((3, 5), (4, 5), (4,)))
    W2, b2 = rng.standard_normal((2, 4)).astype(np.float32), np.ones(2, np.float32)
    for options in (tc.Options(), tc.Options(specialize=False)):
        got = tc.define(MLP2, options=options).mlp2(X, W1, b1, W2, b2)
        hidden = np.maximum(X @ W1.T + b1, 0)
        np.testing.assert_allclose(got, np.maximum(hidden @ W2.T + b2, 0), rtol=1e-5)


def test_fragmented_exact_dependences_give_way_to_memory_based(monkeypatch):
    """With K = N = 3 (`tclang fuzz`, seed 0, program 1437) the exact analysis of that
    program splits its flow into 109 basic maps (memory-based: 6), and PPCG's options took
    2.9 s on them (0.3 s on the memory-based ones): those stand in, and contain the exact
    ones (here they are the same relation: each element of O0 has one writer)."""
    scop = build_scop(check_source(SYMBOLIC_DATAFLOW).definitions[0], dict(K=3, N=3))
    chosen = dependences.compute_dependences(scop)
    monkeypatch.setattr(dependences, "FRAGMENTED_BASIC_MAPS", 10**9)
    exact = dependences.compute_dependences(scop)
    assert exact.flow.is_subset(chosen.flow) and exact.validity.is_subset(chosen.validity)
    pieces = dependences._pieces
    assert dependences.FRAGMENTATION * pieces(chosen.validity) <= pieces(exact.validity)


@pytest.mark.filterwarnings("ignore::tclang.errors.TCWarning")
def test_fragmented_program_schedules_at_once_and_computes_the_same():
    """The memory-based dependences of the program above keep PPCG's options (no fallback)
    and its result matches the program run as written (no fusion, reductions in order)."""
    from polyhedral.pipeline import schedule_definition
    from tclang.target import reference_target
    defn = check_source(SYMBOLIC_DATAFLOW).definitions[0]
    result = schedule_definition(defn, dict(K=3, N=3), tc.Options(), reference_target())
    assert result.strategy == "preserve_parallel" and result.fallback is None
    A = np.random.default_rng(0).standard_normal((3, 3, 3, 3)).astype(np.float32)
    as_written = tc.Options(fusion="min", tile=(), reorder_reductions=False, passes=False)
    reference = tc.define(SYMBOLIC_DATAFLOW, backend="reference", options=as_written)
    expected = reference.kernel(A)
    for got, want in zip(tc.define(SYMBOLIC_DATAFLOW).kernel(A), expected):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
