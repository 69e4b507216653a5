"""A cast of a double to half rounds once, to nearest even, on every backend: as NumPy's
`astype(np.float16)` and CUDA's `__double2half` do. The CPU rounded to float first and
then to half (4,001 of 17,012 values below differed from NumPy: each a half midpoint
nudged by 2^-40, which float's rounding put exactly on the midpoint), and LLVM could fold
those two truncations into one double-to-half truncation lowered to a call of
`__truncdfhf2`, a function this process does not have: the kernel died with SIGSEGV
(fuzz seed 2030, program 323; tests/fuzzing/test_fuzz_features.py has that program)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import tclang as tc
from backends.cuda.emulation import build

BACKENDS = ["cpu", "reference"] + (["cuda-emulated"] if build.available() else [])
SOURCE = """
def cast(double(N) A) -> (half(N) O) { O(i) = half(A(i)) }
def scaled(double(N) A, half(N) H) -> (half(N) O) { O(i) = half(A(i) * double(H(i))) }
"""


def hard_values(rng: np.random.Generator) -> np.ndarray:
    """Every kind of double a half cast can get wrong: midpoints between neighbouring
    halves (ties: to even), the same a hair above and below (float's rounding lands on
    the midpoint), subnormal halves, the edge of overflow, infinities, NaN, signed zeros."""
    halves = rng.integers(0, 0x7C00, 600).astype(np.uint16).view(np.float16)
    low = halves.astype(np.float64)
    high = np.nextafter(halves, np.float16(np.inf)).astype(np.float64)
    middle = (low + high) / 2
    nudge = np.abs(middle) * 2.0 ** -40
    special = [np.inf, -np.inf, np.nan, 0.0, -0.0, 1e300, -1e300, 65504.0, 65519.99, 65520.0,
               2.0 ** -25, 2.0 ** -25 + 2.0 ** -60, 2.0 ** -24, 1e-300]
    return np.concatenate([middle, middle + nudge, middle - nudge, -(middle + nudge),
                           special, rng.standard_normal(200) * 3000])


def assert_same_halves(actual: np.ndarray, expected: np.ndarray) -> None:
    same = (actual.view(np.uint16) == expected.view(np.uint16)) | \
        (np.isnan(actual) & np.isnan(expected))
    assert same.all(), (np.flatnonzero(~same)[:5], actual[~same][:5], expected[~same][:5])


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_double_rounds_to_half_once(backend):
    values = hard_values(np.random.default_rng(7))
    with np.errstate(over="ignore"):
        expected = values.astype(np.float16)
    assert_same_halves(tc.define(SOURCE, backend=backend).cast(values), expected)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("n", [1, 2, 13, 1031])
def test_a_computed_double_rounds_to_half_once(backend, n):
    rng = np.random.default_rng(n)
    a = hard_values(rng)[:n]
    h = rng.choice(np.array([1.0, -1.0, 0.5, 2.0], np.float16), n)
    with np.errstate(over="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        expected = (a * h.astype(np.float64)).astype(np.float16)
    assert_same_halves(tc.define(SOURCE, backend=backend).scaled(a, h), expected)
