"""Row reductions on the GPU (softmax's max and sum, layernorm's moments, a matrix-vector
product) run a block per left-side point, several reductions one after another, through
the generated CUDA and its CPU emulation; contractions keep one thread per point."""

from __future__ import annotations

import numpy as np
import pytest

import tclang as tc
from backends.cuda.emulation.build import available
from benchmarks import kernels as K

pytestmark = pytest.mark.skipif(not available(), reason="the emulation needs g++")

GEMV = "def gemv(float(M,K) A, float(K) x) -> (y) { y(m) +=! A(m,k) * x(k) }"
# the second reduction reads the first at its own point: one block runs both
CHAINED = """def chained(float(N,D) X) -> (m, s) {
    m(n) max=! X(n, d)
    s(n) +=! X(n, d) * m(n)
}"""
# ... and here at another point: not point by point (two launches, each its own reduction)
ACROSS = """def across(float(N,D) X) -> (m, s) {
    m(n) max=! X(n, d)
    s(n) +=! X(n, d) * m(0)
}"""
SHAPES = [(1, 1), (3, 37), (130, 33), (7, 1024), (200, 97), (2, 4099), (1, 300)]


def _softmax(x):
    e = np.exp(x - x.max(1, keepdims=True))
    return e / e.sum(1, keepdims=True)


def _layernorm(x, g, b):
    m = x.mean(1, keepdims=True)
    return (x - m) / np.sqrt(((x - m) ** 2).mean(1, keepdims=True) + 1e-5) * g + b


def _block_reduced(kernel) -> bool:
    return "_partial[t0]" in kernel.loops


@pytest.mark.parametrize("n,d", SHAPES)
def test_row_reductions_match_numpy(n, d):
    rng = np.random.default_rng(n * 7919 + d)
    x = rng.standard_normal((n, d)).astype(np.float32)
    g, b = rng.standard_normal(d).astype(np.float32), rng.standard_normal(d).astype(np.float32)
    softmax = tc.define(K.SOFTMAX, backend="cuda-emulated").softmax
    layernorm = tc.define(K.LAYERNORM, backend="cuda-emulated").layernorm
    gemv = tc.define(GEMV, backend="cuda-emulated").gemv
    np.testing.assert_allclose(softmax(x), _softmax(x), rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(layernorm(x, g, b), _layernorm(x, g, b), rtol=1e-3, atol=1e-3)
    np.testing.assert_allclose(gemv(x, g), x @ g, rtol=1e-4, atol=1e-3)
    for source, other in ((CHAINED, x.max(1, keepdims=True)), (ACROSS, x.max(1)[0])):
        kernel = tc.define(source, backend="cuda-emulated")
        m, s = kernel[kernel.names[0]](x)
        np.testing.assert_allclose(m, x.max(1))
        np.testing.assert_allclose(s, (x * other).sum(1), rtol=1e-4, atol=1e-3)


def test_which_kernels_reduce_across_a_block():
    x = np.ones((256, 512), np.float32)
    v = np.ones(512, np.float32)
    cuda = "cuda-emulated"
    assert _block_reduced(tc.define(K.SOFTMAX, backend=cuda).softmax.compile(x))
    assert _block_reduced(tc.define(K.LAYERNORM, backend=cuda).layernorm.compile(x, v, v))
    assert _block_reduced(tc.define(GEMV, backend=cuda).gemv.compile(x, v))
    assert _block_reduced(tc.define(CHAINED, backend=cuda).chained.compile(x))
    scaled = tc.define("def f(float(N,D) X, float S) -> (Y) { Y(n) +=! X(n, d) * S }",
                       backend=cuda).f
    assert _block_reduced(scaled.compile(x, np.float32(2)))  # a scalar is every row's
    np.testing.assert_allclose(scaled(x, np.float32(2)), x.sum(1) * 2)
    across = tc.define(ACROSS, backend=cuda).across.compile(x).loops
    assert across.count("launch kernel") == 2  # m wholly computed before s starts
    # each point reuses data other points read, or the left side walks the stride-1
    # subscript: one thread per point, coalesced across threads
    square = np.ones((256, 256), np.float32)
    assert not _block_reduced(tc.define(K.MATMUL, backend=cuda).matmul.compile(square, square))
    assert not _block_reduced(tc.define(K.MLP_LAYER, backend=cuda).mlp_layer.compile(
        square, square, np.ones(256, np.float32)))
    # a row shorter than a warp stays on one thread
    assert not _block_reduced(tc.define(K.SOFTMAX, backend=cuda).softmax.compile(
        np.ones((256, 16), np.float32)))


def test_two_reductions_into_one_tensor():
    source = """def twice(float(N,D) X) -> (m) {
    m(n) +=! X(n, d)
    m(n) max= X(n, d)
}"""
    x = np.random.default_rng(3).standard_normal((37, 129)).astype(np.float32)
    kernel = tc.define(source, backend="cuda-emulated").twice
    assert _block_reduced(kernel.compile(x))
    total = x.sum(1)
    np.testing.assert_allclose(kernel(x), np.maximum(total, x.max(1)),
                               rtol=1e-4, atol=1e-4)


def test_elementwise_consumers_of_a_row_join_its_launch():
    """Softmax's division and layernorm's normalization run in the block that reduced
    their row, right after it: one launch reads each row once from memory."""
    x = np.ones((256, 512), np.float32)
    v = np.ones(512, np.float32)
    for source, entry, args in ((K.SOFTMAX, "softmax", (x,)),
                                (K.LAYERNORM, "layernorm", (x, v, v))):
        loops = tc.compile(source, entry, *args, backend="cuda-emulated").loops
        assert loops.count("launch kernel") == 1, loops
    # a consumer reading another row's result, or its own output elsewhere, stays apart
    other_row = """def f(float(N,D) X) -> (Y) {
    m(n) max=! X(n, d)
    Y(n, d) = X(n, d) - m(0)
}"""
    y = tc.define(other_row, backend="cuda-emulated").f
    assert y.compile(x).loops.count("launch kernel") == 2
    data = np.random.default_rng(5).standard_normal((67, 45)).astype(np.float32)
    np.testing.assert_allclose(y(data), data - data[0].max())
