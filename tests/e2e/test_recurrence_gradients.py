"""Issue 35 items 2 and 5: the gradient of a recurrence is a reverse scan
(tclang/autodiff/scans.py), checked against central differences in float64 on every
backend and through `tclang.torch` with gradcheck and gradgradcheck: every recurrence the
language accepts (`=`, sums, max, min and products, with or without reset, after a first
write, over triangles, through quotients)."""

from __future__ import annotations

import numpy as np
import pytest

import tclang as tc
from tests.e2e.central_differences import assert_gradients_match

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
    # reads that are not constant shifts: a sum inside the reverse scan
    "cell reading unit 0": ("def f(double(T, H) X, double(H, H) W) -> (S) {\n"
                            "  S(t, h) = (t == 0) ? X(0, h) : "
                            "tanh(S(t - 1, 0) * W(h, 0) + X(t, h))\n}",
                            lambda n: [(n, 3), (3, 3)]),
    "forward substitution": ("def f(double(N, N) L, double(N) b) -> (x) {\n"
                             "  P(i, j) = (j == 0) ? b(i) : P(i, j - 1) - L(i, j - 1) * "
                             "P(j - 1, j - 1) / L(j - 1, j - 1) where j in 0:i + 1\n"
                             "  x(i) = P(i, i) / L(i, i)\n}", lambda n: [(n, n), (n,)]),
    "substitution as a sum": ("def f(double(N, N) L, double(N) b) -> (x) {\n"
                              "  x(i) +=! (k == i) ? b(i) / L(i, i) : -L(i, k) / L(i, i) * x(k)"
                              " where k in 0:i + 1\n}", lambda n: [(n, n), (n,)]),
    "mirror read": ("def f(double(N, N) X) -> (O) { O(i, j) = (i >= 1) ? "
                    "0.5 * O(i - 1, N - 1 - j) * X(i, j) + X(i, j) : X(i, j) }",
                    lambda n: [(n, n)]),
    # a domain other than the whole box: only the forward points in it send anything back
    "triangle read whole": ("def f(double(N, N) X) -> (Y) {\n"
                            "  P(i, j) = (j == 0) ? X(i, 0) : P(i, j - 1) * 0.5 + X(i, j) "
                            "where j in 0:i + 1\n  Y(i) +=! P(i, j) where j in 0:N\n}",
                            lambda n: [(n, n)]),
    "after a first write": ("def f(double(N) X) -> (O) {\n  O(i) = X(i) * X(i)\n"
                            "  O(i) = O(i - 1) * X(i) + X(i) where i in 1:N\n}",
                            lambda n: [(n,)]),
    "two back after a first write": ("def f(double(R, N) X) -> (O) {\n  O(r, i) = tanh(X(r, i))\n"
                                     "  O(r, i) = 0.5 * O(r, i - 2) * X(r, i) + O(r, i - 1) "
                                     "where r in 0:R, i in 2:N\n}", lambda n: [(3, n)]),
    # reads through a quotient or remainder (a tree in an array): a sum in the reverse scan
    "heap parent": ("def f(double(R, N) X) -> (O) { O(r, i) = (i >= 1) ? "
                    "0.5 * tanh(O(r, (i - 1) / 2)) + X(r, i) : X(r, i) }", lambda n: [(3, n)]),
    "half and remainder": ("def f(double(N) X) -> (O) { O(i) = (i >= 4) ? 0.5 * O(i / 2) * "
                           "X(i) + 0.25 * O(i % 4) + 0.3 * O(i - 1) : X(i) }",
                           lambda n: [(n,)]),
    # a max or min reading earlier points of its own target: the later points' gradient
    # reaches the candidates that won (the training forward saves them)
    "max reading earlier maxima": ("def f(double(N) X) -> (O) {\n  O(i) max=! (k == i) ? X(i) : "
                                   "0.5 * O(k) + 0.1 where i in 0:N, k in 0:i + 1\n}",
                                   lambda n: [(n,)]),
    "product of earlier points": ("def f(double(N) X) -> (O) {\n  O(i) *=! (k == i) ? X(i) : "
                                  "0.5 + 0.25 * tanh(O(k)) where i in 0:N, k in 0:i + 1\n}",
                                  lambda n: [(n,)]),
    # without reset, onto a value written before (or onto zeros): one more candidate or
    # factor at each point, along the scan too
    "max onto a value": ("def f(double(N) X) -> (O) {\n  O(i) = X(i)\n  O(i) max= (k < i) ? "
                         "0.5 * O(k) + 0.1 : X(i) * 0.5 where i in 0:N, k in 0:i + 1\n}",
                         lambda n: [(n,)]),
    "product onto a value": ("def f(double(N) X) -> (O) {\n  O(i) = X(i)\n  O(i) *= (k < i) ? "
                             "1.0 + 0.25 * tanh(O(k)) : 1.0 where i in 0:N, k in 0:i + 1\n}",
                             lambda n: [(n,)]),
    "scaled by the point before": ("def f(double(N) X) -> (O) {\n  O(i) = X(i)\n  O(i) *= 0.5 + "
                                   "0.25 * tanh(O(i - 1)) where i in 1:N\n}", lambda n: [(n,)]),
    "max of the point before": ("def f(double(N) X) -> (O) {\n  O(i) = X(i)\n  O(i) max= "
                                "(i >= 1) ? O(i - 1) - 0.1 : X(i)\n}", lambda n: [(n,)]),
    "min from zeros": ("def f(double(N) X) -> (O) {\n  O(i) min= (k < i) ? O(k) * 0.5 : X(i) "
                       "where i in 0:N, k in 0:i + 1\n}", lambda n: [(n,)]),
    "sum onto a value": ("def f(double(N) X) -> (O) {\n  O(i) = X(i)\n  O(i) += (k < i) ? "
                         "0.5 * tanh(O(k)) : 0.0 where i in 0:N, k in 0:i + 1\n}",
                         lambda n: [(n,)]),
    "row min with tanh": ("def f(double(R, N) X, double(N, N) W) -> (O) {\n  O(r, i) min=! "
                          "(k == i) ? X(r, i) : W(i, k) * tanh(O(r, k)) where k in 0:i + 1\n}",
                          lambda n: [(3, n), (n, n)]),
}
TRIANGULAR = {"forward substitution", "substitution as a sum"}  # well conditioned L
BACKENDS = ["cpu", "reference", "cuda-emulated"]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", list(SOURCES))
def test_gradients_match_central_differences(backend, name):
    source, shapes = SOURCES[name]
    kernel = tc.define(source, backend=backend).f
    g = tc.grad(kernel)
    for n in ([1, 7] if backend == "cuda-emulated" else [1, 2, 7, 13]):
        rng = np.random.default_rng(n)
        inputs = [rng.uniform(-1, 1, s) for s in shapes(n)]
        if name in TRIANGULAR:
            inputs[0] = np.tril(inputs[0]) + 4 * np.eye(n)
        assert_gradients_match(kernel, g, inputs, rng)


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


@pytest.mark.parametrize("name", ["cell reading unit 0", "forward substitution",
                                  "substitution as a sum", "mirror read",
                                  "triangle read whole", "after a first write",
                                  "heap parent", "half and remainder",
                                  "max reading earlier maxima", "row min with tanh",
                                  "product of earlier points", "max onto a value",
                                  "product onto a value", "scaled by the point before",
                                  "max of the point before", "min from zeros",
                                  "sum onto a value"])
def test_second_order_of_a_sum_inside_a_recurrence(name):
    """The backward of a recurrence whose reads are not constant shifts is one statement,
    a sum reading earlier points of its own target: itself a recurrence tc.grad
    differentiates, so gradgradcheck holds (its guards keep each read where the forward
    read it, so the second order reads only earlier points too)."""
    torch = pytest.importorskip("torch")
    import tclang.torch as tct
    source, shapes = SOURCES[name]
    f = tct.function(source, "f")
    torch.manual_seed(2)
    inputs = [torch.randn(s, dtype=torch.float64) for s in shapes(5)]
    if name in TRIANGULAR:
        inputs[0] = torch.tril(inputs[0]) * 0.3 + 4 * torch.eye(5, dtype=torch.float64)
    inputs = tuple(x.requires_grad_() for x in inputs)
    assert torch.autograd.gradcheck(f, inputs, eps=1e-6, atol=1e-5, rtol=1e-4)
    assert torch.autograd.gradgradcheck(f, inputs, eps=1e-6, atol=1e-5, rtol=1e-4)


def test_a_sum_inside_the_reverse_scan_visits_only_the_points_that_read():
    """The backward of a read that is not a constant shift sums over the forward points
    that read each point: its loops run over those (the equalities solved by isl), not
    over every pair of points, which for the forward substitution would be N^4."""
    g = tc.grad(tc.define(SOURCES["forward substitution"][0]).f)
    assert "dPrev(u0, u1) +=" in g.source
    n = 60
    lower = np.tril(np.ones((n, n))) + 4 * np.eye(n)
    backward = tc.define(g.source).f_grad  # (L, b, the saved P, dx)
    compiled = backward.compile(lower, np.ones(n), np.ones((n, n)), np.ones(n))
    visits = _statement_visits(compiled, "dPrev", n)
    # each read sends back from n(n - 1) / 2 forward points: with the loops around them
    assert visits <= 4 * n * n, visits


def _statement_visits(compiled, target: str, n: int) -> int:
    """How many iterations the loops around the reduction into `target` make (and how many
    times they run it), their bounds evaluated as the reference backend evaluates them."""
    from polyhedral import loop_ir as L
    ids = {s.id for s in compiled.loop_ir.statements
           if s.target == target and s.kind == "reduce"}
    assert ids
    return _count(L, compiled.loop_ir.body, ids, {"N": n, "z_N": n})


def _count(L, node, ids, env) -> int:
    from backends import interpreter
    def value(e):
        text = L.render_index(e, lambda name: name, str, interpreter._INDEX_OPERATORS)
        return eval(text, vars(interpreter), dict(env))
    if isinstance(node, L.For):  # every iteration of a loop around the statement counts
        if not any(isinstance(r, L.Run) and r.statement in ids for r in L.walk_nodes(node)):
            return 0
        return sum(1 + _count(L, node.body, ids, {**env, node.var: v})
                   for v in range(value(node.lo), value(node.hi), node.step))
    if isinstance(node, L.If):
        branch = node.then if value(node.cond) else node.other
        return 0 if branch is None else _count(L, branch, ids, env)
    if isinstance(node, L.Run):
        return int(node.statement in ids)
    body = getattr(node, "body", ())
    return sum(_count(L, x, ids, env) for x in (body if isinstance(body, tuple) else (body,)))
