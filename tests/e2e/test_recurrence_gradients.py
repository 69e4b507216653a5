"""Issue 35 items 2 and 5: the gradient of a recurrence is a reverse scan
(tclang/autodiff/scans.py), checked against central differences in float64 on every
backend and through `tclang.torch` with gradcheck; the forms it does not handle yet are a
located TCGradError, never a silently wrong gradient."""

from __future__ import annotations

import numpy as np
import pytest

import tclang as tc

SOURCES = {
    "cumsum": ("def f(double(N) X) -> (O) { O(i) = (i == 0) ? X(0) : O(i - 1) + X(i) }",
               lambda n: [(n,)]),
    "running max": ("def f(double(N) X) -> (O) { O(i) = (i == 0) ? X(0) : "
                    "fmax(O(i - 1), X(i)) }", lambda n: [(n,)]),
    "damped two back": ("def f(double(N) X) -> (O) { O(i) = (i < 2) ? X(i) : "
                        "0.5 * O(i - 1) + 0.25 * tanh(O(i - 2)) * X(i) where i in 0:N }",
                        lambda n: [(n,)]),
    "row scan and use": ("def f(double(R, N) X, double(N) W) -> (Y) {\n"
                         "  S(r, i) = (i == 0) ? X(r, 0) : tanh(S(r, i - 1) * W(i) + X(r, i))\n"
                         "  Y(r) +=! S(r, i) * S(r, i)\n}", lambda n: [(3, n), (n,)]),
    "anti-diagonal": ("def f(double(N, M) X) -> (O) { O(i, j) = (i >= 1 && j < M - 1) ? "
                      "0.5 * O(i - 1, j + 1) * X(i, j) + X(i, j) : X(i, j) }",
                      lambda n: [(n, 4)]),
}
BACKENDS = ["cpu", "reference", "cuda-emulated"]


def _loss_and_grad(kernel, g, inputs, weights):
    out = kernel(*inputs)
    grads = g(*inputs, weights)
    return float(np.sum(out * weights)), grads if isinstance(grads, tuple) else (grads,)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", list(SOURCES))
def test_gradients_match_central_differences(backend, name):
    source, shapes = SOURCES[name]
    kernel = tc.define(source, backend=backend).f
    g = tc.grad(kernel)
    for n in ([1, 7] if backend == "cuda-emulated" else [1, 2, 7, 13]):
        rng = np.random.default_rng(n)
        inputs = [rng.uniform(-1, 1, s) for s in shapes(n)]
        weights = rng.uniform(-1, 1, kernel(*inputs).shape)
        _, grads = _loss_and_grad(kernel, g, inputs, weights)
        for x, dx in zip(inputs, grads):
            direction = rng.uniform(-1, 1, x.shape)
            eps = 1e-6
            x += eps * direction
            up = float(np.sum(kernel(*inputs) * weights))
            x -= 2 * eps * direction
            down = float(np.sum(kernel(*inputs) * weights))
            x += eps * direction
            numeric = (up - down) / (2 * eps)
            assert abs(numeric - float(np.sum(dx * direction))) <= 1e-6 + 1e-6 * abs(numeric)


def test_the_backward_is_a_reverse_scan():
    g = tc.grad(tc.define(SOURCES["cumsum"][0]).f)
    assert "dOrev(u0 - 1)" in g.source and "dOrev(N - 1 - i)" in g.source
    x, d = np.arange(5.0), np.array([1.0, 2.0, 3.0, 4.0, 5.0])
    np.testing.assert_allclose(g(x, d), np.cumsum(d[::-1])[::-1])


def test_gradcheck_through_torch():
    torch = pytest.importorskip("torch")
    import tclang.torch as tct
    for name in ("cumsum", "row scan and use"):
        source, shapes = SOURCES[name]
        f = tct.function(source, "f")
        torch.manual_seed(1)
        inputs = tuple(torch.randn(s, dtype=torch.float64, requires_grad=True)
                       for s in shapes(6))
        assert torch.autograd.gradcheck(f, inputs, eps=1e-6, atol=1e-5, rtol=1e-4)


REFUSED = [
    ("def f(double(T, H) X, double(H, H) W) -> (S) {\n  S(t, h) = (t == 0) ? X(0, h) : "
     "S(t - 1, 0) * W(h, 0) + X(t, h)\n}", 2, 34, "not a constant shift"),
    ("def f(double(N) X) -> (O) {\n  O(i) = X(i)\n  O(i) = O(i - 1) * X(i) where i in 1:N\n}",
     3, 10, "after another statement wrote"),
]


@pytest.mark.parametrize("source,line,column,words", REFUSED)
def test_recurrences_without_a_gradient_rule_are_refused(source, line, column, words):
    with pytest.raises(tc.TCGradError) as info:
        tc.grad(tc.define(source).f)
    assert (info.value.line, info.value.column) == (line, column), str(info.value)
    assert words in info.value.message
