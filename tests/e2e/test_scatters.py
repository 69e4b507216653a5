"""Scatters (a gathered subscript on the left, tclang/lang/scatters.py) on every backend,
against NumPy's unbuffered `np.add.at` / `np.maximum.at` / `np.minimum.at`: odd, prime and
size-1 extents, repeated indices, out-of-range indices (a TCIndexError, nothing written)."""

from __future__ import annotations

import numpy as np
import pytest

import tclang as tc
from backends.cuda.emulation.build import available

BACKENDS = ["cpu", "reference",
            pytest.param("cuda-emulated", marks=pytest.mark.skipif(
                not available(), reason="the emulation needs g++"))]

SOURCE = """
def hist(int32(N) Ids, float(B) Prior) -> (float(B) H) {
  H(b) = Prior(b)
  H(Ids(i)) += 1.0
}
def embed_grad(int32(B, L) Ids, float(B, L, D) dO, float(E, D) Table) -> (float(E, D) G) {
  G(Ids(b, l), d) +=! dO(b, l, d)
}
def scatter_max(int32(N) Idx, float(N) X, float(M) Like) -> (float(M) O) {
  O(Idx(i)) max=! X(i)
}
def scatter_min(int32(N) Idx, int32(N) X, int32(M) Like) -> (int32(M) O) {
  O(Idx(i)) min=! X(i) * 2
}
def through_temp(int32(N) Ids, float(N, D) X, float(E, D) Like) -> (O) {
  T(e, d) = 0.0 where e in 0:E, d in 0:D
  T(Ids(i), d) += X(i, d)
  O(e, d) = T(e, d) + Like(e, d)
}
def two_sided(int32(N) Idx, float(N, D) X, float(M, D) Like) -> (float(M, D) O, float(M) S) {
  O(Idx(i), d) +=! X(i, d)
  S(m) +=! O(m, d)
}
"""

SHAPES = [(1, 1, 1), (7, 3, 5), (13, 11, 2), (31, 17, 3)]  # (lookups, table rows, width)


@pytest.fixture(scope="module", params=BACKENDS)
def module(request):
    return tc.define(SOURCE, backend=request.param)


@pytest.mark.parametrize("n,rows,width", SHAPES)
def test_histogram_matches_bincount(module, n, rows, width):
    rng = np.random.default_rng(n)
    ids = rng.integers(0, rows, n).astype(np.int32)
    prior = rng.standard_normal(rows).astype(np.float32)
    expected = prior + np.bincount(ids, minlength=rows)
    np.testing.assert_allclose(module.hist(ids, prior), expected, rtol=1e-5)


@pytest.mark.parametrize("n,rows,width", SHAPES)
def test_embedding_gradient_matches_add_at(module, n, rows, width):
    rng = np.random.default_rng(n + 1)
    ids = rng.integers(0, rows, (n, 2)).astype(np.int32)
    ids[0, :] = 0  # repeated
    grad = rng.standard_normal((n, 2, width)).astype(np.float32)
    expected = np.zeros((rows, width), np.float32)
    np.add.at(expected, ids, grad)
    out = module.embed_grad(ids, grad, np.zeros((rows, width), np.float32))
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("n,rows,width", SHAPES)
def test_scatter_max_and_min_match_numpy(module, n, rows, width):
    rng = np.random.default_rng(n + 2)
    idx = rng.integers(0, rows, n).astype(np.int32)
    x = rng.standard_normal(n).astype(np.float32)
    expected = np.full(rows, -np.inf, np.float32)
    np.maximum.at(expected, idx, x)  # untouched rows keep the identity, -inf
    np.testing.assert_array_equal(module.scatter_max(idx, x, np.zeros(rows, np.float32)),
                                  expected)
    xi = rng.integers(-50, 50, n).astype(np.int32)
    expected_i = np.full(rows, np.iinfo(np.int32).max, np.int32)
    np.minimum.at(expected_i, idx, xi * 2)
    np.testing.assert_array_equal(module.scatter_min(idx, xi, np.zeros(rows, np.int32)),
                                  expected_i)


@pytest.mark.parametrize("n,rows,width", SHAPES)
def test_a_statement_after_a_scatter_reads_all_of_it(module, n, rows, width):
    rng = np.random.default_rng(n + 3)
    idx = rng.integers(0, rows, n).astype(np.int32)
    x = rng.standard_normal((n, width)).astype(np.float32)
    expected = np.zeros((rows, width), np.float32)
    np.add.at(expected, idx, x)
    o, s = module.two_sided(idx, x, np.zeros((rows, width), np.float32))
    np.testing.assert_allclose(o, expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(s, expected.sum(axis=1), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("n,rows,width", SHAPES)
def test_a_temporary_as_scatter_target(module, n, rows, width):
    rng = np.random.default_rng(n + 4)
    idx = rng.integers(0, rows, n).astype(np.int32)
    x = rng.standard_normal((n, width)).astype(np.float32)
    like = rng.standard_normal((rows, width)).astype(np.float32)
    expected = like.copy()
    np.add.at(expected, idx, x)
    np.testing.assert_allclose(module.through_temp(idx, x, like), expected, rtol=1e-5,
                               atol=1e-5)


@pytest.mark.parametrize("bad", [-1, 5])
def test_an_index_out_of_range_is_a_tc_index_error_and_writes_nothing(module, bad):
    ids = np.array([0, 1, bad, 2], np.int32)
    prior = np.zeros(5, np.float32)
    with pytest.raises(tc.TCIndexError, match=r"H\(Ids\(i\)\) \+= 1\.0"):
        module.hist(ids, prior)
    out = np.full((5, 2), 7.0, np.float32)
    grad = np.ones((2, 2, 2), np.float32)
    with pytest.raises(tc.TCIndexError, match="out of bounds for dimension 0 of G"):
        module.embed_grad(ids.reshape(2, 2), grad, np.zeros((5, 2), np.float32), out=out)


def test_a_scatter_is_deterministic_without_reordering():
    """Colliding float updates happen in one order: the same bits on every run."""
    m = tc.define(SOURCE, options=tc.Options(reorder_reductions=False))
    rng = np.random.default_rng(5)
    ids = np.zeros((40, 3), np.int32)
    grad = (rng.standard_normal((40, 3, 4)) * 1e4).astype(np.float32)
    first = m.embed_grad(ids, grad, np.zeros((3, 4), np.float32))
    expected = np.zeros((3, 4), np.float32)
    np.add.at(expected, ids, grad)  # sequential, in index order: what the loops do
    np.testing.assert_array_equal(first, expected)
    for _ in range(3):
        np.testing.assert_array_equal(m.embed_grad(ids, grad, np.zeros((3, 4), np.float32)),
                                      first)


def test_a_shape_generic_scatter():
    m = tc.define(SOURCE, options=tc.Options(specialize=False))
    for n, rows in ((3, 2), (17, 5)):
        ids = np.arange(n, dtype=np.int32) % rows
        expected = np.bincount(ids, minlength=rows).astype(np.float32)
        np.testing.assert_allclose(m.hist(ids, np.zeros(rows, np.float32)), expected)


@pytest.mark.skipif(not available(), reason="the emulation needs g++")
@pytest.mark.parametrize("reorder", [None, False])
def test_a_gpu_scatter_of_many_blocks(reorder):
    """A thread per update with atomic updates (several blocks, colliding ids), or with
    reorder_reductions=False one thread in index order: both match NumPy."""
    m = tc.define(SOURCE, backend="cuda-emulated",
                  options=tc.Options(reorder_reductions=reorder))
    rng = np.random.default_rng(7)
    idx = rng.integers(0, 3, 601).astype(np.int32)
    x = rng.integers(-50, 50, 601).astype(np.int32)
    expected = np.full(3, np.iinfo(np.int32).max, np.int32)
    np.minimum.at(expected, idx, x * 2)
    np.testing.assert_array_equal(m.scatter_min(idx, x, np.zeros(3, np.int32)), expected)
    ids = rng.integers(0, 5, (301, 2)).astype(np.int32)
    grad = rng.standard_normal((301, 2, 3)).astype(np.float32)
    added = np.zeros((5, 3), np.float32)
    np.add.at(added, ids, grad)
    out = m.embed_grad(ids, grad, np.zeros((5, 3), np.float32))
    np.testing.assert_allclose(out, added, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("backend", ["cpu", "reference"])
@pytest.mark.parametrize("k", [1, 3, 7])
def test_a_half_scatter_add_compiles_and_runs(backend, k):
    """A scatter-add into a half tensor went through the float32-accumulator rewrite,
    which wrote the copy and the rounding at a point the scatter does not have: isl
    refused the scop ("incompatible spaces"; fuzz seed 2030, program 724, through the
    gradient of a gather in the program's own types). It now rounds after every update
    (docs/language.md)."""
    source = ("def g(int32(K, K) G, float(K, K) X) -> (H) {\n"
              "    H(a, b) = half(0.0) where a in 0:K, b in 0:K\n"
              "    H(j, G(m, m)) += half(X(j, m))\n}\n")
    rng = np.random.default_rng(k)
    g = rng.integers(0, k, (k, k)).astype(np.int32)
    x = rng.integers(-3, 4, (k, k)).astype(np.float32)  # small integers: exact in half
    want = np.zeros((k, k), np.float32)
    for j in range(k):
        for m in range(k):
            want[j, g[m, m]] += x[j, m]
    got = tc.define(source, backend=backend)["g"](g, x)
    assert got.dtype == np.float16
    np.testing.assert_array_equal(got.astype(np.float32), want)
