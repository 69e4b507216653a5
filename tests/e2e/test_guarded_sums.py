"""Sums of guarded terms run over the points where the guard holds (tclang/lang/guarded_sums.py),
and a weight gradient's sum keeps its long stride-1 reduction innermost, vectorized
(polyhedral/bands.py short_members_penalized, backends/llvm accumulators)."""

from __future__ import annotations

import re

import numpy as np
import pytest

import tclang as tc

TRIANGLE = """def prefix(float(N) A) -> (O) {
    O(i) +=! (j <= i) ? A(j) : 0.0 where i in 0:N, j in 0:N
}"""
BACKWARD_CONV = """def dx(float(M,C,KH,KW) W1, float(N,M,S0,S1) dO) -> (dI) {
    dI(n, c, y, x) +=! (y - kh >= 0 && y - kh < S0 && x - kw >= 0 && x - kw < S1)
        ? dO(n, m, y - kh, x - kw) * W1(m, c, kh, kw) : 0.0
        where y in 0:S0+KH-1, x in 0:S1+KW-1, n in 0:N, c in 0:C, m in 0:M, kh in 0:KH,
              kw in 0:KW
}"""
WEIGHT_GRADIENT = """def dw(float(N,C,H,W) I, float(N,M,S0,S1) dO) -> (float(M,C,3,3) dW1) {
    dW1(m, c, kh, kw) +=! dO(n, m, h, w) * I(n, c, h + kh, w + kw) where kh in 0:3, kw in 0:3
}"""


@pytest.mark.parametrize("n", [1, 2, 7, 13])
@pytest.mark.parametrize("specialize", [True, False])
def test_a_triangular_sum_runs_over_the_triangle(n, specialize):
    k = tc.define(TRIANGLE, options=tc.Options(specialize=specialize)).prefix
    a = np.random.default_rng(n).standard_normal(n).astype(np.float32)
    np.testing.assert_allclose(k(a), np.cumsum(a.astype(np.float64)), rtol=1e-5, atol=1e-5)
    loops = k.compile(a).loops
    assert "O[i] += A[j];" in loops  # the guard became the loop bounds
    off = tc.define(TRIANGLE, options=tc.Options(passes=False)).prefix.compile(a).loops
    assert "j <= i ?" in off  # passes=False (the fuzzer's oracle) keeps it as written


@pytest.mark.parametrize("shape", [dict(N=1, C=2, M=3, KH=3, KW=2, S0=5, S1=1),
                                   dict(N=2, C=1, M=1, KH=1, KW=3, S0=7, S1=4),
                                   dict(N=1, C=3, M=2, KH=2, KW=2, S0=11, S1=13)])
def test_the_transposed_convolution_matches_numpy(shape):
    rng = np.random.default_rng(0)
    W1 = rng.standard_normal((shape["M"], shape["C"], shape["KH"], shape["KW"]), np.float32)
    dO = rng.standard_normal((shape["N"], shape["M"], shape["S0"], shape["S1"]), np.float32)
    got = tc.define(BACKWARD_CONV).dx(W1, dO)
    want = np.zeros((shape["N"], shape["C"], shape["S0"] + shape["KH"] - 1,
                     shape["S1"] + shape["KW"] - 1))
    for kh in range(shape["KH"]):
        for kw in range(shape["KW"]):
            want[:, :, kh:kh + shape["S0"], kw:kw + shape["S1"]] += np.einsum(
                "nmhw,mc->nchw", dO.astype(np.float64), W1[:, :, kh, kw].astype(np.float64))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_a_weight_gradient_gets_a_dot_product_register_tile():
    """dW(m, c, kh, kw): kw is too short for the lanes, so the tile runs over m and c, each
    result a vector of partial sums along w (polyhedral/register_tiles.py _dot_across)."""
    rng = np.random.default_rng(0)
    I = rng.standard_normal((2, 16, 34, 34), np.float32)
    dO = rng.standard_normal((2, 16, 32, 32), np.float32)
    ck = tc.define(WEIGHT_GRADIENT).dw.compile(I, dO)
    text = ck.loops
    # an unrolled tile of results: printed one by one, or as unrolled loops around one
    # update (AVX2 machines: 2 x 4, its first reduction step peeled)
    tile = re.search(r"< (\d+); c\d+\+\+\) \{  // unrolled\n\s+for \(int c\d+ = 0; c\d+ < "
                     r"(\d+); c\d+\+\+\) \{  // unrolled, vectorize\n\s+dW1\[m\]\[c\]"
                     r"\[kh\]\[kw\] \+=", text)
    assert text.count("dW1[m][c][kh][kw] +=") >= 4 or \
        (tile and int(tile.group(1)) * int(tile.group(2)) >= 4), text
    # each result's partial sums stay one vector through the loops over n and h: a vector
    # phi, not a horizontal sum at the end of every 32-wide row (kernel_module._lane_split)
    # (in the IR tclang emits, before LLVM's own vectorizers run)
    assert re.search(r"phi +<(8|16) x float>", ck.stage_text("llvm"))
    exact = tc.define(WEIGHT_GRADIENT, options=tc.Options(reorder_reductions=False)).dw
    assert not re.search(r"phi +<(8|16) x float>", exact.compile(I, dO).stage_text("llvm"))
    want = np.einsum("nmhw,nchkwl->mckl", dO,
                     np.lib.stride_tricks.sliding_window_view(I, (3, 3), axis=(2, 3))
                     .transpose(0, 1, 2, 4, 3, 5)[:, :, :32, :, :32, :])
    np.testing.assert_allclose(ck(I, dO), want, rtol=1e-3, atol=1e-3)


def test_a_weight_gradient_keeps_its_row_innermost_and_vectorized():
    rng = np.random.default_rng(0)
    I = rng.standard_normal((2, 4, 34, 34), np.float32)
    dO = rng.standard_normal((2, 5, 32, 32), np.float32)
    ck = tc.define(WEIGHT_GRADIENT).dw.compile(I, dO)
    # (the register tile's points inside it are loops the backend unrolls)
    innermost = [line for line in ck.loops.splitlines()
                 if "for (" in line and "// unrolled" not in line][-1]
    assert re.search(r"< 32; \w+\+\+\) \{  // vectorize, reduction", innermost), innermost
    assert re.search(r"<(8|16) x float>", ck.stage_text("llvm-opt"))
    want = np.einsum("nmhw,nchkwl->mckl", dO,
                     np.lib.stride_tricks.sliding_window_view(I, (3, 3), axis=(2, 3))
                     .transpose(0, 1, 2, 4, 3, 5)[:, :, :32, :, :32, :])
    np.testing.assert_allclose(ck(I, dO), want, rtol=1e-3, atol=1e-3)
