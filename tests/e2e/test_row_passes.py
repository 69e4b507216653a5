"""Row-wise kernels (one pass per row, contracted temporaries, stored terms) against NumPy.

Odd, prime and size-1 extents, on the CPU backend (automatic, bounds-checked, shape-generic,
one thread) and on the reference interpreter of the same loop IR. The loop-IR shape of these
schedules is tests/polyhedral/test_row_fusion.py's.
"""

from __future__ import annotations

import numpy as np
import pytest

import tclang as tc
from benchmarks import kernels as K

SHAPES = [(1, 1), (1, 17), (31, 1), (7, 13), (97, 131), (64, 1024)]
SMALL = [s for s in SHAPES if s[0] * s[1] <= 2000]
MODES = {
    "auto": tc.Options(),
    "check_bounds": tc.Options(check_bounds=True),
    "generic": tc.Options(specialize=False),
    "one_thread": tc.Options(parallel=False),
}
ATTENTION = """def attn(float(M,K) Q, float(N,K) Kt) -> (P) {
  S(i, j) +=! Q(i, k) * Kt(j, k)
  m(i) max=! S(i, j)
  e(i) +=! exp(S(i, j) - m(i))
  P(i, j) = exp(S(i, j) - m(i)) / e(i)
}"""
TWO_NESTS = """def twice(float(N,D) X) -> (Y, Z) {
  t(n) +=! X(n, d)
  Y(n, d) = X(n, d) / t(n)
  Z(d) +=! X(n, d) * t(n)
}"""


def softmax(x):
    e = np.exp(x - x.max(1, keepdims=True))
    return e / e.sum(1, keepdims=True)


def layernorm(x, g, b):
    mean = x.mean(1, keepdims=True)
    var = ((x - mean) ** 2).mean(1, keepdims=True)
    return (x - mean) / np.sqrt(var + 1e-5) * g + b


def rmsnorm(x, g):
    return x / np.sqrt((x * x).mean(1, keepdims=True) + 1e-5) * g


def bias_gelu(x, b):
    y = x + b
    return 0.5 * y * (1 + np.tanh(0.7978845608 * (y + 0.044715 * y ** 3)))


def cases(n, d, rng):
    x = rng.standard_normal((n, d)).astype(np.float32) * 3
    g, b = (rng.standard_normal(d).astype(np.float32) for _ in range(2))
    return [(K.SOFTMAX, "softmax", (x,), softmax),
            (K.LAYERNORM, "layernorm", (x, g, b), layernorm),
            (K.RMSNORM, "rmsnorm", (x, g), rmsnorm),
            (K.BIAS_GELU, "bias_gelu", (x, b), bias_gelu)]


def check(source, entry, args, expected, backend="cpu", options=None):
    kernel = tc.define(source, backend=backend, options=options)[entry]
    got = kernel(*(a.copy() for a in args))
    want = expected(*(a.astype(np.float64) for a in args))
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5, err_msg=entry)


@pytest.mark.parametrize("mode", sorted(MODES))
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_row_kernels_match_numpy_on_the_cpu(shape, mode):
    for source, entry, args, expected in cases(*shape, np.random.default_rng(sum(shape))):
        check(source, entry, args, expected, options=MODES[mode])


@pytest.mark.parametrize("shape", SMALL, ids=lambda s: f"{s[0]}x{s[1]}")
def test_row_kernels_match_numpy_in_the_reference_interpreter(shape):
    for source, entry, args, expected in cases(*shape, np.random.default_rng(sum(shape))):
        check(source, entry, args, expected, backend="reference")
        check(source, entry, args, expected, backend="reference",
              options=tc.Options(check_bounds=True))


@pytest.mark.parametrize("backend", ["cpu", "reference"])
@pytest.mark.parametrize("sizes", [(1, 1, 1), (13, 7, 29), (64, 32, 48)],
                         ids=lambda s: "x".join(map(str, s)))
def test_attention_keeps_its_product_and_fuses_its_softmax(sizes, backend):
    m, k, n = sizes
    rng = np.random.default_rng(m)
    q, kt = (rng.standard_normal((r, k)).astype(np.float32) for r in (m, n))
    check(ATTENTION, "attn", (q, kt), lambda q, kt: softmax(q @ kt.T), backend=backend)


@pytest.mark.parametrize("backend", ["cpu", "reference"])
def test_a_temporary_two_nests_use_still_computes(backend):
    x = np.random.default_rng(3).random((37, 29)).astype(np.float32) + 0.5
    kernel = tc.define(TWO_NESTS, backend=backend).twice
    y, z = kernel(x)
    t = x.astype(np.float64).sum(1, keepdims=True)
    np.testing.assert_allclose(y, x / t, rtol=2e-5)
    np.testing.assert_allclose(z, (x * t).sum(0), rtol=2e-5)


def test_repeated_calls_reuse_no_stale_row_state():
    """A slice lives per iteration: a call after a call with other values, and rows of
    very different scales within one call, give each row its own result."""
    kernel = tc.define(K.LAYERNORM).layernorm
    rng = np.random.default_rng(9)
    g, b = np.ones(64, np.float32), np.zeros(64, np.float32)
    for scale in (1e3, 1e-3, 1.0):
        x = (rng.standard_normal((33, 64)) * scale * np.arange(1, 34)[:, None]).astype(np.float32)
        np.testing.assert_allclose(kernel(x, g, b), layernorm(x.astype(np.float64), g, b),
                                   rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("source, entry", [(K.SOFTMAX, "softmax"), (K.LAYERNORM, "layernorm"),
                                           (K.BIAS_GELU, "bias_gelu")])
def test_contracted_temporaries_are_registers_and_the_math_is_vectors(source, entry):
    """In the optimized LLVM IR no float array is left on the stack for a one-element slice
    (SROA made it a register; softmax keeps its one row of stored exponentials), and
    exp, tanh and the row arithmetic run on vectors, with no call to a scalar libm."""
    import re
    x = np.random.default_rng(1).standard_normal((64, 1024)).astype(np.float32)
    v = np.ones(1024, np.float32)
    args = {"softmax": (x,), "layernorm": (x, v, v), "bias_gelu": (x, v)}[entry]
    ir = tc.define(source)[entry].compile(*args).stages["llvm-opt"]
    stack = re.findall(r"alloca \[(\d+) x float\]", ir)
    assert stack == (["1024"] if entry == "softmax" else []), stack
    assert max(int(n) for n in re.findall(r"<(\d+) x float>", ir)) >= 4
    assert not re.search(r"call [^@]*@(expf|tanhf|exp|tanh)\(", ir)


def test_softmax_multiplies_by_the_reciprocal_of_the_row_sum_unless_bitwise():
    """`arcp` on the division by s(n), which the Y loop does not change: the optimized code
    computes 1/s once a row and multiplies (vdivps costs ~10 vmulps); with
    reorder_reductions=False every element is divided (correctly rounded), and the results
    of both stay within float32 rounding of NumPy's."""
    import re
    x = np.random.default_rng(2).standard_normal((37, 1024)).astype(np.float32)
    fast = tc.define(K.SOFTMAX).softmax.compile(x)
    exact = tc.define(K.SOFTMAX, options=tc.Options(reorder_reductions=False)).softmax.compile(x)
    assert re.search(r"fdiv[^\n]*arcp", fast.stages["llvm"])
    assert not re.search(r"fdiv[^\n]*arcp", exact.stages["llvm"])
    assert not re.search(r"fdiv[^\n]*<\d+ x float>", fast.stages["llvm-opt"])  # no vector div
    assert re.search(r"fdiv[^\n]*<\d+ x float>", exact.stages["llvm-opt"])
    want = softmax(x.astype(np.float64))
    for kernel in (fast, exact):
        np.testing.assert_allclose(kernel(x), want, rtol=3e-6, atol=1e-9)
