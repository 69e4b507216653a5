"""Issue 35 item 5: gradients of reductions the forward accepts beyond `+=!`: a product
(`*=!`, and `*=` onto a value written before), and max=/min=/*= without reset onto part
of a value or onto nothing (from zeros). A product's factor gets the product of the
others, counted so that a zero factor is exact (no 0 / 0); a max onto a value makes that
value one more candidate where the reduction writes and passes its gradient through
elsewhere. Checked against central differences on every backend, against the exclusive
products where factors are exactly zero, and through `tclang.torch` with gradcheck and
gradgradcheck (the backward is a product again)."""

from __future__ import annotations

import numpy as np
import pytest

import tclang as tc
from tests.e2e.central_differences import assert_gradients_match

SOURCES = {
    "row product": ("def f(double(N, K) X) -> (O) {\n  O(i) *=! X(i, k)\n}",
                    lambda n: [(n, 3)]),
    "triangle of a function": ("def f(double(N, N) X) -> (O) {\n  O(i) *=! 0.5 + 0.25 * "
                               "tanh(X(i, k)) where k in 0:i + 1\n}", lambda n: [(n, n)]),
    "onto a value": ("def f(double(N, K) X, double(N) Y) -> (O) {\n  O(i) = Y(i) * Y(i)\n"
                     "  O(i) *= X(i, k) * 2.0\n}", lambda n: [(n, 5), (n,)]),
    "two indices": ("def f(double(N, K) X, double(K) W) -> (O) {\n  O(i) *=! 1.0 + X(i, k) * "
                    "W(l) where l in 0:K\n}", lambda n: [(n, 3), (3,)]),
    # onto part of a value (its first index from 1), with or without reset
    "sum onto part, triangle": ("def f(double(N, K) X, double(N) Y) -> (O) {\n  O(i) = Y(i)\n"
                                "  O(i) +=! X(i, k) * 2.0 where i in 1:N, k in 0:i\n}",
                                lambda n: [(n, n), (n,)]),
    "max onto part": ("def f(double(N, K) X, double(N) Y) -> (O) {\n  O(i) = Y(i)\n"
                      "  O(i) max= X(i, k) where i in 1:N\n}", lambda n: [(n, 3), (n,)]),
    "min onto part, triangle": ("def f(double(N, K) X, double(N) Y) -> (O) {\n  O(i) = Y(i)\n"
                                "  O(i) min= X(i, k) * 2.0 where i in 1:N, k in 0:i\n}",
                                lambda n: [(n, n), (n,)]),
    "product onto part": ("def f(double(N, K) X, double(N) Y) -> (O) {\n  O(i) = Y(i)\n"
                          "  O(i) *= X(i, k) where i in 1:N\n}", lambda n: [(n, 3), (n,)]),
    # onto nothing: from zeros (the checker warns), 0 is one more candidate
    "max from zeros": ("def f(double(N, K) X) -> (O) {\n  O(i) max= X(i, k)\n}",
                       lambda n: [(n, 3)]),
    "min from zeros": ("def f(double(N, K) X) -> (O) {\n  O(i) min= tanh(X(i, k))\n}",
                       lambda n: [(n, 3)]),
}
BACKENDS = ["cpu", "reference", "cuda-emulated"]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", list(SOURCES))
def test_gradients_match_central_differences(backend, name):
    source, shapes = SOURCES[name]
    kernel = tc.define(source, backend=backend).f
    g = tc.grad(kernel)
    for n in ([1, 7] if backend == "cuda-emulated" else [1, 2, 7, 13]):
        rng = np.random.default_rng(n)
        inputs = [rng.uniform(0.5, 1.5, s) * rng.choice([-1, 1], s) for s in shapes(n)]
        if name.endswith("from zeros"):  # rows all below 0, all above, and mixed
            inputs[0][::3] = -np.abs(inputs[0][::3])
        assert_gradients_match(kernel, g, inputs, rng)


def _exclusive_products(x):
    out = np.empty_like(x)
    for i in range(x.shape[0]):
        for k in range(x.shape[1]):
            out[i, k] = np.prod(np.delete(x[i], k))
    return out


def test_a_product_from_zeros_has_a_zero_gradient():
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tc.TCWarning)
        g = tc.grad(tc.define("def f(double(N, K) X, double(N) Y) -> (O, P) {\n"
                              "  O(i) *= X(i, k)\n  P(i) = Y(i) * 2.0\n}").f)
    dx, dy = g(np.ones((3, 2)), np.ones(3), np.ones(3), np.ones(3))
    assert not dx.any() and (dy == 2).all()


@pytest.mark.parametrize("backend", BACKENDS)
def test_zero_factors_get_the_product_of_the_others(backend):
    """One zero in a row: its factor gets the product of the rest, the others 0; two zeros:
    every factor gets 0. T / e would give NaN (0 / 0) for both."""
    g = tc.grad(tc.define(SOURCES["row product"][0], backend=backend).f)
    x = np.array([[2.0, 0.0, 3.0, 0.5, 7.0], [0.0, 1.5, 0.0, 2.0, 1.0],
                  [1.0, 2.0, 3.0, 4.0, 5.0], [0.0, 0.0, 0.0, 1.0, 1.0]])
    d = np.array([1.0, 2.0, -1.0, 3.0])
    got = g(x, d)
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, d[:, None] * _exclusive_products(x), rtol=1e-12)


def test_second_order_through_torch():
    torch = pytest.importorskip("torch")
    import tclang.torch as tct
    for name in ("row product", "triangle of a function", "onto a value", "product onto part",
                 "sum onto part, triangle", "max onto part"):
        source, shapes = SOURCES[name]
        f = tct.function(source, "f")
        torch.manual_seed(3)
        inputs = tuple((torch.rand(s, dtype=torch.float64) + 0.5).requires_grad_()
                       for s in shapes(4))
        assert torch.autograd.gradcheck(f, inputs, eps=1e-6, atol=1e-5, rtol=1e-4)
        assert torch.autograd.gradgradcheck(f, inputs, eps=1e-6, atol=1e-5, rtol=1e-4)
