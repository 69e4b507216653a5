"""Guarded and windowed reductions with their guards split out of the vector loops
(polyhedral/guard_splitting.py), against NumPy on every backend, at odd, prime and size-1
extents: padded and strided depthwise convolution and pooling, a transposed convolution,
a triangular sum, a batched trace, causal attention scores."""

from __future__ import annotations

import numpy as np
import pytest

import tclang as tc
from benchmarks.guarded_families import CAUSAL, PREFIX, TRACE, TRANSPOSED, avg_pool, \
    depthwise, max_pool

BACKENDS = ("cpu", "cuda-emulated", "reference")


def windows(x: np.ndarray, k: int, stride: int, pad: int, fill: float) -> np.ndarray:
    """x's k x k windows (N, C, OH, OW, k, k), the padding filled with `fill`."""
    padded = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pad, pad), (pad, pad)),
                    constant_values=fill)
    win = np.lib.stride_tricks.sliding_window_view(padded, (k, k), axis=(2, 3))
    return win[:, :, ::stride, ::stride]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("stride, pad, shape", [(2, 1, (1, 3, 13, 37)), (1, 1, (2, 1, 1, 5)),
                                                 (2, 0, (1, 2, 7, 31)), (1, 2, (1, 1, 3, 1))])
def test_depthwise_convolution(backend, stride, pad, shape):
    rng = np.random.default_rng(1)
    x = rng.standard_normal(shape).astype(np.float32)
    w = rng.standard_normal((shape[1], 3, 3)).astype(np.float32)
    got = tc.define(depthwise(stride, pad), backend=backend).depthwise(x, w)
    want = np.einsum("nchwij,cij->nchw", windows(x, 3, stride, pad, 0.0), w)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("k, stride, pad, shape", [(3, 2, 1, (1, 2, 11, 37)),
                                                    (2, 2, 0, (1, 1, 2, 7)),
                                                    (3, 1, 1, (1, 3, 1, 13))])
def test_max_and_average_pooling(backend, k, stride, pad, shape):
    x = np.random.default_rng(2).standard_normal(shape).astype(np.float32)
    module = tc.define(max_pool(stride, pad, k) + "\n" + avg_pool(stride, pad, k),
                       backend=backend)
    np.testing.assert_allclose(module.max_pool(x),
                               windows(x, k, stride, pad, -np.inf).max(axis=(4, 5)),
                               rtol=1e-5)
    np.testing.assert_allclose(module.avg_pool(x),
                               windows(x, k, stride, pad, 0.0).sum(axis=(4, 5)) / (k * k),
                               rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("stride, shape", [(2, (1, 3, 5, 7)), (3, (2, 1, 1, 2))])
def test_transposed_convolution(backend, stride, shape):
    rng = np.random.default_rng(3)
    x = rng.standard_normal(shape).astype(np.float32)
    w = rng.standard_normal((shape[1], 2, 3, 3)).astype(np.float32)
    got = tc.define(TRANSPOSED.replace("S", str(stride)), backend=backend).transposed(x, w)
    n, c, h, wd = shape
    want = np.zeros((n, 2, stride * (h - 1) + 3, stride * (wd - 1) + 3))
    for kh in range(3):
        for kw in range(3):
            want[:, :, kh:kh + stride * (h - 1) + 1:stride,
                 kw:kw + stride * (wd - 1) + 1:stride] += np.einsum(
                "nchw,cm->nmhw", x.astype(np.float64), w[:, :, kh, kw])
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("shape", [(17, 131), (1, 1), (3, 67)])
def test_triangular_prefix_sum(backend, shape):
    a = np.random.default_rng(4).standard_normal(shape).astype(np.float32)
    got = tc.define(PREFIX, backend=backend).prefix(a)
    np.testing.assert_allclose(got, np.cumsum(a.astype(np.float64), axis=1),
                               rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("shape", [(37, 5, 5), (1, 1, 1), (13, 2, 2)])
def test_batched_trace(backend, shape):
    a = np.random.default_rng(5).standard_normal(shape).astype(np.float32)
    got = tc.define(TRACE, backend=backend).trace(a)
    np.testing.assert_allclose(got, np.trace(a.astype(np.float64), axis1=1, axis2=2),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("s, d", [(7, 3), (1, 1), (37, 8)])
def test_causal_attention(backend, s, d):
    rng = np.random.default_rng(6)
    q, k, v = (rng.standard_normal((s, d)).astype(np.float32) for _ in range(3))
    got = tc.define(CAUSAL, backend=backend).causal(q, k, v)
    scores = q.astype(np.float64) @ k.T.astype(np.float64)
    scores[np.triu_indices(s, 1)] = -np.inf
    p = np.exp(scores - scores.max(axis=1, keepdims=True))
    np.testing.assert_allclose(got, (p / p.sum(axis=1, keepdims=True)) @ v,
                               rtol=1e-4, atol=1e-4)


def test_the_cpu_loops_of_a_strided_depthwise_convolution_have_no_guard_in_a_vector_loop():
    from polyhedral import loop_ir as L
    from tests.polyhedral.test_guard_splitting import guards_in_vector_loops
    x = np.zeros((1, 8, 33, 65), np.float32)
    kernel = tc.define(depthwise(2, 1)).depthwise
    loops = kernel.compile(x, np.zeros((8, 3, 3), np.float32)).loop_ir
    vector = [n for n in _loops(loops.body) if n.vectorize]
    assert vector and guards_in_vector_loops(loops.body) == []
    assert all(isinstance(n, L.For) for n in vector)


def _loops(node):
    from polyhedral import loop_ir as L
    match node:
        case L.For(body=b):
            return [node] + _loops(b)
        case L.If(then=t, other=o):
            return _loops(t) + (_loops(o) if o is not None else [])
        case L.Block(body=items) :
            return [f for i in items for f in _loops(i)]
        case L.Scratch(body=b):
            return _loops(b)
    return []
