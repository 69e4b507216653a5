"""The scop: domains and access relations, compared with isl-string fixtures."""

import islpy as isl
import pytest

from polyhedral.bounds import check_bounds
from polyhedral.dependences import compute_dependences
from polyhedral.scop import build_scop
from tclang.errors import TCArgumentError
from tclang.lang.frontend import check_source


def scop_of(source, sizes=None):
    return build_scop(check_source(source).definitions[0], sizes)


def same(actual, expected: str) -> bool:
    kind = type(actual)
    return actual.is_equal(kind(expected, context=actual.get_ctx()))


MATMUL = "def mm(float(M,K) A, float(K,N) B) -> (C) { C(m, n) +=! A(m, k) * B(k, n) }"


def test_reduction_is_init_plus_update():
    s = scop_of(MATMUL)
    assert same(s.domain, "[K, M, N] -> { I0[m, n] : 0 <= m < M and 0 <= n < N and K >= 0; "
                          "S0[m, n, k] : 0 <= m < M and 0 <= n < N and 0 <= k < K }")
    assert same(s.writes, "[K, M, N] -> { I0[m, n] -> C[m, n] : 0 <= m < M and 0 <= n < N "
                          "and K >= 0; S0[m, n, k] -> C[m, n] : 0 <= m < M and 0 <= n < N "
                          "and 0 <= k < K }")
    reads = s.reads.intersect_range(isl.UnionSet("[K, M, N] -> { A[a, b] }", context=s.ctx))
    assert same(reads, "[K, M, N] -> { S0[m, n, k] -> A[m, k] : 0 <= m < M and 0 <= n < N "
                       "and 0 <= k < K }")


def test_specialized_scop_has_no_parameters():
    s = scop_of(MATMUL, dict(M=4, K=3, N=2))
    assert s.params == ()
    assert same(s.domain, "{ I0[m, n] : 0 <= m < 4 and 0 <= n < 2; "
                          "S0[m, n, k] : 0 <= m < 4 and 0 <= n < 2 and 0 <= k < 3 }")


def test_guarded_read_is_restricted_by_its_guard():
    s = scop_of("def pad(float(N) I) -> (O) { O(i) = (i >= 1 && i <= N) ? I(i - 1) : 0 "
                "where i in 0:N+2 }", dict(N=5))
    assert same(s.reads, "{ S0[i] -> I[i - 1] : 1 <= i <= 5 }")


def test_gather_is_a_may_access_over_the_whole_extent():
    s = scop_of("def lut(float(E, D) T, int32(B) I) -> (O) { O(b, d) = T(I(b), d) }",
                dict(E=7, D=3, B=2))
    table = s.reads.intersect_range(isl.UnionSet("{ T[a, b] }", context=s.ctx))
    assert same(table, "{ S0[b, d] -> T[e, d] : 0 <= b < 2 and 0 <= d < 3 and 0 <= e < 7 }")


def test_quasi_affine_subscripts():
    s = scop_of("def f(float(N) A, float(3) T) -> (O) { O(i) = A(i / 2) * T(i % 3) }",
                dict(N=4))
    assert same(s.reads, "{ S0[i] -> A[floor(i/2)] : 0 <= i < 8; "
                         "S0[i] -> T[i mod 3] : 0 <= i < 8 }")


def test_products_of_sizes_become_parameters():
    s = scop_of("def f(float(N,M) A) -> (O) { O(i) = 1.0 where i in 0:N*M }")
    assert "p__M__N" in s.params


def test_program_order_is_the_original_schedule():
    s = scop_of("def f(float(N) A) -> (B, C) { B(i) = A(i)  C(i) = B(i) }", dict(N=3))
    assert same(s.order, "{ S0[i] -> [0, i] : 0 <= i < 3; S1[i] -> [1, i] : 0 <= i < 3 }")


def test_concrete_out_of_bounds_read_is_refused_with_its_location():
    src = ("def f(float(N) A, float(M) B) -> (O) {\n"
           "  O(i) = A(i) + B(i) where i in 0:N\n}")
    s = scop_of(src, dict(N=5, M=3))
    with pytest.raises(TCArgumentError) as info:
        check_bounds(s)
    assert info.value.line == 2 and "B(3)" in info.value.message and "i = 3" in info.value.message
    check_bounds(scop_of(src, dict(N=3, M=5)))


def test_reduction_dependences_of_matmul():
    deps = compute_dependences(scop_of(MATMUL, dict(M=4, K=3, N=2)))
    # the updates' accesses to C are left to the fences and the order-free pairs
    assert deps.flow.is_empty()
    # every pair of updates of one element, not only neighbours: a loop over k is a
    # reduction wherever the schedule puts it
    assert same(deps.reduction, "{ S0[m, n, k] -> S0[m, n, k2] : 0 <= m < 4 and 0 <= n < 2 "
                                "and 0 <= k < k2 < 3 }")
    assert same(deps.fences, "{ I0[m, n] -> S0[m, n, k] : 0 <= m < 4 and 0 <= n < 2 "
                             "and 0 <= k < 3 }")
    assert deps.validity.intersect(deps.reduction).is_empty()
    assert deps.reduction.is_subset(deps.coincidence)


def test_fences_order_every_update_before_later_readers():
    src = "def f(float(N,M) A) -> (T) { R(i) +=! A(i, j)  T(i, j) = A(i, j) * R(i) }"
    deps = compute_dependences(scop_of(src, dict(N=2, M=3)))
    ctx = deps.flow.get_ctx()
    # the fences make every update come before every reader of the same element
    fences = deps.fences.intersect_range(isl.UnionSet("{ S1[i, j] }", context=ctx))
    assert same(fences, "{ S0[i, k] -> S1[i, j] : 0 <= i < 2 and 0 <= j < 3 and 0 <= k < 3 }")
    # and the init before every update
    inits = deps.fences.intersect_domain(isl.UnionSet("{ I0[i] }", context=ctx))
    assert same(inits, "{ I0[i] -> S0[i, k] : 0 <= i < 2 and 0 <= k < 3 }")
    # the reader still follows the init (implied by the fences, kept by the flow analysis)
    assert same(deps.flow.intersect_range(isl.UnionSet("{ S1[i, j] }", context=ctx)),
                "{ I0[i] -> S1[i, j] : 0 <= i < 2 and 0 <= j < 3 }")


def test_exact_reductions_are_not_relaxed():
    deps = compute_dependences(scop_of(MATMUL, dict(M=2, K=2, N=2)), reorder_reductions=False)
    assert deps.reduction.is_empty() and deps.fences.is_empty()
