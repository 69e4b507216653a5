"""Issue 35 items 1 and 4: range inference through guarded reads, and `where` ranges whose
bounds use other indices (triangles, bands), on every backend against NumPy."""

from __future__ import annotations

import numpy as np
import pytest

import tclang as tc

BACKENDS = ["cpu", "reference", "cuda-emulated"]
EXTENTS = [1, 2, 5, 7, 13]  # size 1, even, odd and prime

GUARDED = """
def concat(float(M, N) A, float(M, N) B) -> (O1) {
    O1(n, i, m) = i == 0 ? A(m, n) : B(m, n) where i in 0:2
}
def pad(float(B, C, H, W) I) -> (O) {
    O(n, c, h, w) = (h >= 1 && h <= H && w >= 1 && w <= W) ? I(n, c, h - 1, w - 1) : 0
        where h in 0:H + 2, w in 0:W + 2
}
def conv(float(B, C, H, W) I, float(F, C, KH, KW) Wt) -> (O) {
    O(n, f, h, w) +=! (h + kh - 1 >= 0 && h + kh - 1 < H && w + kw - 1 >= 0 && w + kw - 1 < W)
        ? I(n, c, h + kh - 1, w + kw - 1) * Wt(f, c, kh, kw) : 0
        where h in 0:H, w in 0:W, kh in 0:KH, kw in 0:KW
}
def pool(float(B, C, H, W) I) -> (O) {
    O(n, c, h, w) +=! (2*h + kh - 1 >= 0 && 2*h + kh - 1 < H && 2*w + kw - 1 >= 0 &&
                       2*w + kw - 1 < W) ? I(n, c, 2*h + kh - 1, 2*w + kw - 1) : 0
        where h in 0:(H + 1) / 2, w in 0:(W + 1) / 2, kh in 0:3, kw in 0:3
}
def mask(float(N, M) X, float(N) L) -> (Y) {
    Y(b, t) = (t < 3) ? X(b, t) * L(b) : -1.0 where t in 0:M
}
"""

TRIANGULAR = """
def trisum(float(N, M) A) -> (S) { S(i) +=! A(i, j) where j in 0:i + 1 }
def trimm(float(N, N) L, float(N, K) B) -> (C) { C(i, k) +=! L(i, j) * B(j, k) where j in 0:i + 1 }
def upper(float(N, N) U, float(N) x) -> (y) { y(i) +=! U(i, j) * x(j) where j in i:N }
def causal(float(N, D) Q, float(N, D) K) -> (Mx) {
    Mx(i) max=! Q(i, d) * K(j, d) where j in 0:i + 1
}
def lower(float(N, N) A) -> (T) { T(i, j) = A(i, j) where j in 0:i + 1 }
def band(float(N) X) -> (Y) { Y(i) +=! X(j) where i in 1:N - 1, j in i - 1:i + 2 }
def strided(float(N) X) -> (Y) { Y(i) +=! X(j) where i in 0:(N + 1) / 2, j in 2 * i:N }
"""


def _rng(*key):
    return np.random.default_rng(abs(hash(key)) % 2**32)


@pytest.fixture(scope="module", params=BACKENDS)
def guarded(request):
    return tc.define(GUARDED, backend=request.param)


@pytest.fixture(scope="module", params=BACKENDS)
def triangular(request):
    return tc.define(TRIANGULAR, backend=request.param)


# ---- item 1: guarded reads bound the indices their guard leaves free ----------------------

@pytest.mark.parametrize("m,n", [(1, 1), (2, 5), (7, 3), (13, 1)])
def test_concat_from_tc(guarded, m, n):
    r = _rng(m, n)
    A, B = r.random((m, n), np.float32), r.random((m, n), np.float32)
    got = guarded.concat(A, B)
    np.testing.assert_array_equal(got, np.stack([A.T, B.T], axis=1))


@pytest.mark.parametrize("shape", [(1, 1, 1, 1), (2, 3, 5, 7), (1, 2, 13, 2)])
def test_padding_infers_the_batch_and_channel_ranges(guarded, shape):
    I = _rng(shape).random(shape, np.float32)
    np.testing.assert_array_equal(guarded.pad(I), np.pad(I, ((0, 0), (0, 0), (1, 1), (1, 1))))


@pytest.mark.parametrize("b,c,h,w,f,k", [(1, 1, 1, 1, 1, 1), (2, 3, 5, 7, 2, 3),
                                         (1, 2, 13, 2, 3, 2)])
def test_padded_convolution_needs_no_where_for_n_c_f(guarded, b, c, h, w, f, k):
    r = _rng(b, c, h, w, f, k)
    I, Wt = r.random((b, c, h, w), np.float32), r.random((f, c, k, k), np.float32)
    P = np.pad(I.astype(np.float64), ((0, 0), (0, 0), (1, k), (1, k)))
    want = np.zeros((b, f, h, w))
    for kh in range(k):
        for kw in range(k):
            want += np.einsum("nchw,fc->nfhw", P[:, :, kh:kh + h, kw:kw + w], Wt[:, :, kh, kw])
    np.testing.assert_allclose(guarded.conv(I, Wt), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shape", [(1, 1, 1, 1), (2, 3, 5, 7), (1, 2, 13, 4)])
def test_the_strided_padded_sum_of_the_issue(guarded, shape):
    """Issue 35's case: `2*h + kh - 1` under the padding guard; n and c from I alone."""
    I = _rng("pool", shape).random(shape, np.float32)
    B, C, H, W = shape
    P = np.pad(I.astype(np.float64), ((0, 0), (0, 0), (1, 2), (1, 2)))
    OH, OW = (H + 1) // 2, (W + 1) // 2
    want = sum(P[:, :, kh:kh + 2 * OH:2, kw:kw + 2 * OW:2] for kh in range(3) for kw in range(3))
    np.testing.assert_allclose(guarded.pool(I), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("n,m", [(1, 1), (5, 7), (13, 2)])
def test_a_masked_read_bounds_the_row_index(guarded, n, m):
    r = _rng(n, m)
    X, L = r.random((n, m), np.float32), r.random(n, np.float32)
    want = np.where(np.arange(m) < 3, X * L[:, None], -1.0)
    np.testing.assert_allclose(guarded.mask(X, L), want, rtol=1e-6)


def test_unguarded_reads_and_the_target_come_first():
    """A program TC accepted keeps its ranges: a guarded read bounds an index only when
    no unguarded read (nor the target's extent) does."""
    k = tc.define("def f(float(N) A, float(M) B) -> (O) { O(i) = (i < 2) ? B(i) : A(i) }").f
    A, B = np.arange(7, dtype=np.float32), np.arange(3, dtype=np.float32) + 10
    np.testing.assert_array_equal(k(A, B), np.concatenate([B[:2], A[2:]]))


def _error(source):
    with pytest.raises(tc.TCSemanticError) as info:
        tc.define(source)
    return info.value


def test_a_guard_that_constrains_the_index_is_named():
    e = _error("def f(float(N) I) -> (O) { O(h) = (h >= 1 && h <= N) ? I(h - 1) : 0 }")
    text = str(e)
    assert "cannot infer the range of index h" in text
    assert "I(...) (line 1, column 56)" in text and "`h >= 1 && h <= N`" in text
    assert "so that `h - 1` stays in 0:N (I's dimension 0)" in text
    assert (e.line, e.column) == (1, 30)


def test_the_hint_names_the_dimension_actually_read():
    e = _error("def f(float(K, M) A) -> (O) { O(c, i) = (c < 2 && i > 0) ? A(i, c) : 0 }")
    assert "hint: add a where clause giving its range, e.g. `where c in 0:M` (A's dimension 1)" \
        in str(e)


# ---- item 4: ranges bounded by other indices ---------------------------------------------

@pytest.mark.parametrize("n", EXTENTS)
def test_triangular_sums_and_products(triangular, n):
    r = _rng("tri", n)
    A = r.random((n, n + 2), np.float32)
    L, B = r.random((n, n), np.float32), r.random((n, 3), np.float32)
    x = r.random(n, np.float32)
    np.testing.assert_allclose(triangular.trisum(A), [A[i, :i + 1].sum() for i in range(n)],
                               rtol=1e-5)
    np.testing.assert_allclose(triangular.trimm(L, B), np.tril(L) @ B, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(triangular.upper(L, x), np.triu(L) @ x, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(triangular.lower(L), np.tril(L))


@pytest.mark.parametrize("n,d", [(1, 1), (5, 3), (7, 2), (13, 1)])
def test_a_causal_max(triangular, n, d):
    r = _rng("causal", n, d)
    Q, K = r.standard_normal((n, d), np.float32), r.standard_normal((n, d), np.float32)
    got = triangular.causal(Q, K)
    want = [(Q[i][None, :] * K[:i + 1]).max() for i in range(n)]
    np.testing.assert_allclose(got, want, rtol=1e-6)


@pytest.mark.parametrize("n", [2, 3, 7, 13])
def test_bands_and_strided_starts(triangular, n):
    X = _rng("band", n).random(n, np.float32)
    want = np.zeros(n - 1)
    want[1:] = X[:-2] + X[1:-1] + X[2:]
    np.testing.assert_allclose(triangular.band(X), want, rtol=1e-6)
    got = triangular.strided(X)
    np.testing.assert_allclose(got, [X[2 * i:].sum() for i in range((n + 1) // 2)], rtol=1e-5)


def test_a_triangle_written_by_assignment_keeps_the_other_points():
    k = tc.define(TRIANGULAR).lower
    A = np.arange(16, dtype=np.float32).reshape(4, 4)
    out = np.full((4, 4), -7, np.float32)
    k(A, out=out)
    np.testing.assert_array_equal(out, np.where(np.tri(4, dtype=bool), A, -7))


@pytest.mark.parametrize("options", [tc.Options(passes=False),
                                     tc.Options(reorder_reductions=False),
                                     tc.Options(specialize=False), tc.Options(tile=2)])
def test_triangles_under_every_option(options):
    k = tc.define(TRIANGULAR, options=options).trimm
    r = _rng("options", str(options))
    for n in (1, 6, 11):
        L, B = r.random((n, n), np.float32), r.random((n, 4), np.float32)
        np.testing.assert_allclose(k(L, B), np.tril(L) @ B, rtol=1e-5, atol=1e-5)


def test_the_loops_walk_only_the_triangle():
    A = np.ones((9, 9), np.float32)
    loops = tc.define(TRIANGULAR).trisum.compile(A).loops
    assert "?" not in loops.split("S[i] +=")[-1].split(";")[0]  # no test in the body


@pytest.mark.parametrize("source,message,column", [
    ("def f(float(N, N) A) -> (T) { T(i, j) +=! A(i, j) where j in 0:i + 1 }",
     "j is a left-side index of a reduction", 57),
    ("def f(float(N, N) A) -> (T) { T(i) +=! A(i, j) where j in 0:q + 1 }",
     "the range of j uses q, which is not an index of this statement", 61),
    ("def f(float(N, N) A) -> (T) { T(i) +=! A(i, j) where j in 0:j + 1 }",
     "the range of j uses j itself", 61),
    ("def f(float(N, N) A) -> (T) { T(i) +=! A(i, j) where j in 0:i * i }",
     "a range bound must be affine", 61),
    ("def f(float(N, N) A) -> (T) { T(i) +=! A(i, j) + A(i, k) where j in 0:k + 1, k in 0:j + 1 }",
     "cannot infer the range of index j: its bounds 0:k + 1 use k", 64),
])
def test_bad_affine_ranges_are_located_errors(source, message, column):
    e = _error(source)
    assert message in str(e) and (e.line, e.column) == (1, column), str(e)


def test_a_triangle_that_leaves_its_tensor_is_an_argument_error():
    k = tc.define("def f(float(N, N) A) -> (T) { T(i) +=! A(i, j) where j in 0:i + 2 }").f
    with pytest.raises(tc.TCArgumentError, match="element A\\(2, 3\\)"):
        k(np.ones((3, 3), np.float32))


def test_grad_of_a_triangle():
    """tc.grad refused it ("range bounded by other indices"); the gradient is the
    output's gradient on the triangle, 0 elsewhere (tests/e2e/test_autodiff_where.py
    checks the rest against central differences)."""
    dA = tc.grad(tc.define(TRIANGULAR).trisum)(np.ones((3, 4), np.float32),
                                               np.array([1, 2, 3], np.float32))
    np.testing.assert_array_equal(dA, np.tril(np.ones((3, 4))) * [[1], [2], [3]])


@pytest.mark.parametrize("m,n,k", [(1, 1, 1), (3, 5, 2), (7, 1, 13)])
def test_a_concatenation_along_the_guarded_index(m, n, k):
    """Each branch bounds i within its condition: i ranges over the hull of both."""
    for backend in BACKENDS:
        cat = tc.define("def cat(float(M, K) A, float(N, K) B) -> (O) {\n"
                        "  O(i, k) = (i < M) ? A(i, k) : B(i - M, k)\n}", backend=backend).cat
        r = _rng(m, n, k)
        A, B = r.random((m, k), np.float32), r.random((n, k), np.float32)
        np.testing.assert_array_equal(cat(A, B), np.concatenate([A, B]))


def test_the_scop_domain_is_the_triangle():
    import islpy as isl
    from polyhedral.scop import build_scop
    from tclang.lang.frontend import check_source
    defn = check_source(TRIANGULAR)["trisum"]
    scop = build_scop(defn, None)
    want = isl.UnionSet("[M, N] -> { I0[i] : 0 <= i < N; S0[i, j] : 0 <= j <= i < N }",
                        context=scop.ctx)
    assert scop.domain.gist_params(scop.context).is_equal(want.gist_params(scop.context)), \
        scop.domain
    lower = build_scop(check_source(TRIANGULAR)["lower"], {"N": 4})
    assert lower.domain.is_equal(isl.UnionSet("{ S0[i, j] : 0 <= j <= i < 4 }",
                                              context=lower.ctx))


def test_check_shows_the_range_and_its_hull():
    from tclang.cli import describe_definition
    from tclang.lang.frontend import check_source
    text = describe_definition(check_source(TRIANGULAR)["trimm"])
    assert "reducing over j in 0:i + 1 (within 0:N)" in text


def test_a_triangle_wider_than_its_tensor_is_refused_per_shape():
    """`j in 0:i + 1` reads A(i, j) up to j = N - 1: an A with fewer columns is an error
    for those sizes only (shape-generic code checks each call)."""
    for options in (None, tc.Options(specialize=False)):
        k = tc.define(TRIANGULAR, options=options).trisum
        np.testing.assert_allclose(k(np.ones((3, 3), np.float32)), [1, 2, 3])
        with pytest.raises(tc.TCArgumentError, match="out of bounds"):
            k(np.ones((3, 2), np.float32))


CAUSAL_SOFTMAX = """def causal_softmax(float(T, T) S) -> (P) {
    Mx(i) max=! S(i, j) where j in 0:i + 1
    E(i, j) = exp(S(i, j) - Mx(i)) where j in 0:i + 1
    Sm(i) +=! E(i, j) where j in 0:i + 1
    P(i, j) = E(i, j) / Sm(i) where j in 0:i + 1
}"""


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("specialize", [True, False])
def test_a_causal_softmax_written_with_ranges(backend, specialize):
    """Every statement over the triangle: reductions, and assignments that write only it
    (the points above the diagonal stay 0), through the GPU's row reductions too."""
    k = tc.define(CAUSAL_SOFTMAX, backend=backend,
                  options=tc.Options(specialize=specialize)).causal_softmax
    for t in (1, 2, 7, 13) + ((33,) if backend != "reference" else ()):
        S = _rng("softmax", t).standard_normal((t, t)).astype(np.float32)
        want = np.zeros((t, t))
        for i in range(t):
            e = np.exp(S[i, :i + 1].astype(np.float64) - S[i, :i + 1].max())
            want[i, :i + 1] = e / e.sum()
        np.testing.assert_allclose(k(S), want, rtol=1e-5, atol=1e-6)
