"""Size expressions simplify min/max terms that are redundant for every size >= 1."""

from __future__ import annotations

import itertools

import pytest

from tclang.lang import sizes as Z

N, M = Z.size("N"), Z.size("M")


@pytest.mark.parametrize("expr, want", [
    # intervals alone bound N - 1 - min(1, N - 1) below by -1 and kept the max
    (lambda: Z.maximum(N - 1, Z.minimum(1, N - 1)) + 1, "N"),
    (lambda: Z.minimum(N, Z.maximum(3, N)), "N"),
    (lambda: Z.maximum(Z.minimum(N, 2), 5), "5"),
    (lambda: Z.minimum(Z.maximum(N, M), N), "N"),
    (lambda: Z.maximum(0, N - 2) + 1, "max(0, N - 2) + 1"),  # not redundant: kept
    (lambda: Z.minimum(N, M), "min(M, N)"),
])
def test_redundant_min_max_terms_are_dropped(expr, want):
    assert str(expr()) == want


def test_simplified_forms_evaluate_as_the_unsimplified_ones():
    """Every simplification keeps the value at every size >= 1 (checked exhaustively on a
    small grid, against the definition of min and max)."""
    for n, m in itertools.product(range(1, 9), repeat=2):
        env = {"N": n, "M": m}
        assert Z.maximum(N - 1, Z.minimum(1, N - 1)).evaluate(env) == max(n - 1, min(1, n - 1))
        assert Z.minimum(Z.maximum(N, M), N).evaluate(env) == min(max(n, m), n)
        assert Z.maximum(Z.minimum(N, 2), 5).evaluate(env) == max(min(n, 2), 5)
        assert Z.minimum(Z.maximum(N - 3, M), Z.maximum(N, M)).evaluate(env) == \
            min(max(n - 3, m), max(n, m))


def test_a_bound_with_a_min_or_max_splits_into_affine_pieces():
    K, W, A, B = (Z.size(x) for x in "KWAB")
    assert [str(p) for p in Z.pieces(Z.minimum(K - 1, W) + 1, "min")] == ["K", "W + 1"]
    assert [str(p) for p in Z.pieces(N - Z.maximum(A, B), "min")] == ["N - A", "N - B"]
    assert [str(p) for p in Z.pieces(Z.maximum(A, B) + 2, "max")] == ["A + 2", "B + 2"]
    assert [str(p) for p in Z.pieces(Z.maximum(A, B) + 2, "min")] == ["max(A, B) + 2"]
    for n, a, b, k, w in [(1, 1, 1, 1, 1), (5, 2, 9, 4, 3), (9, 7, 2, 1, 8)]:
        env = dict(N=n, A=a, B=b, K=k, W=w)
        e = Z.minimum(Z.maximum(A, B), N) + 1
        assert min(p.evaluate(env) for p in Z.pieces(e, "min")) == e.evaluate(env)
