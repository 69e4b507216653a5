"""float16 sums and products accumulate in float32 and round to half once per element, on
every backend and schedule (tclang/lang/half_accumulators.py). Accumulating in half storage gave 32
(sequential: 32 + 0.01 rounds back to 32) or 1055 (vectorized partial sums) for 100,000
additions of 0.01, and a relative error of 0.59 for a half matmul with K = 20,000."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import tclang
from backends.cuda.emulation import build

SOURCE = """
def total(float16(N) X) -> (Y) { Y +=! X(i) }
def rows(float16(M, N) X) -> (Y) { Y(m) +=! X(m, i) }
def onto(float16(N) X, float16(2) Z) -> (Y) {
    Y(j) = Z(j)
    Y(j) += X(i) where j in 0:2
}
def product(float16(N) X) -> (Y) { Y *=! X(i) }
def matmul(float16(M, K) A, float16(K, N) B) -> (C) { C(m, n) +=! A(m, k) * B(k, n) }
"""

CPU_OPTIONS = [None, tclang.Options(tile=(64,), unroll=4),
               tclang.Options(fusion="min", reorder_reductions=False),
               tclang.Options(specialize=False), tclang.Options(tile=(), vectorize=False)]

RTOL = 2e-3  # float32 accumulation of 100,000 terms, then one rounding to half


def kernels(backend: str, options=None):
    return tclang.define(SOURCE, backend=backend, options=options)


def assert_half_close(actual, truth, rtol=RTOL):
    assert actual.dtype == np.float16
    np.testing.assert_allclose(actual.astype(np.float64), truth, rtol=rtol)


@pytest.mark.parametrize("options", CPU_OPTIONS, ids=lambda o: o and o.describe() or "auto")
def test_long_half_sum_on_cpu(options):
    x = np.full(100_000, 0.01, np.float16)
    truth = x.astype(np.float64).sum()  # 1000.2 (half's 0.01 is 0.010002)
    assert_half_close(kernels("cpu", options).total(x), truth)
    rows = np.full((3, 50_000), 0.01, np.float16)
    assert_half_close(kernels("cpu", options).rows(rows), rows.astype(np.float64).sum(1))


@pytest.mark.parametrize("backend", ["cpu", "reference"])
def test_accumulating_into_a_written_half_tensor_starts_from_its_value(backend):
    x = np.full(20_000, 0.01, np.float16)
    z = np.array([1.0, -3.0], np.float16)
    truth = z.astype(np.float64) + x.astype(np.float64).sum()
    assert_half_close(kernels(backend).onto(x, z), truth)


def test_accumulating_into_the_callers_half_output():
    x = np.full(50_000, 0.01, np.float16)
    out = np.array(8.0, np.float16)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tclang.TCWarning)
        y = tclang.define("def acc(float16(N) X) -> (Y) { Y += X(i) }").acc(x, out=out)
    assert_half_close(np.asarray(y), 8.0 + x.astype(np.float64).sum())


def test_long_half_sum_on_the_reference():
    x = np.full(100_000, 0.01, np.float16)
    assert_half_close(kernels("reference").total(x), x.astype(np.float64).sum())


@pytest.mark.parametrize("backend", ["cpu", "reference"])
def test_half_product(backend):
    x = np.full(4_000, 1.001, np.float16)  # half's 1.001 is 1.0009766
    truth = np.prod(x.astype(np.float64))  # about 49.6; half products stall at 1.0009766^k
    assert_half_close(kernels(backend).product(x), truth)


def test_half_matmul_with_a_long_reduction():
    rng = np.random.default_rng(0)
    a = rng.random((3, 20_000)).astype(np.float16)
    b = rng.random((20_000, 2)).astype(np.float16)
    truth = a.astype(np.float64) @ b.astype(np.float64)
    for backend in ("cpu", "reference"):
        c = kernels(backend).matmul(a, b)
        assert c.dtype == np.float16
        assert np.max(np.abs(c - truth) / truth) < 1e-2


@pytest.mark.skipif(not build.available(), reason="no g++ on PATH")
def test_half_sum_on_the_emulated_gpu():
    x = np.full(6_000, 0.01, np.float16)  # a block reduction: 256 partial sums combined
    assert_half_close(kernels("cuda-emulated").total(x), x.astype(np.float64).sum())
    rows = np.full((128, 4_000), 0.01, np.float16)  # a thread per row: stalled at 32 in half
    assert_half_close(kernels("cuda-emulated").rows(rows), rows.astype(np.float64).sum(1))
