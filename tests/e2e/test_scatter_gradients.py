"""Gradients through gathers and scatters (tclang/autodiff/adjoint.py): the gradient of a
gather is a scatter-add (work proportional to the lookups, not the table), the gradient of
a scatter-add a gather. Checked against finite differences and NumPy's `np.add.at`, and
through `tclang.torch` with gradcheck."""

from __future__ import annotations

import numpy as np
import pytest

import tclang as tc
from tests.e2e.test_autodiff import _directional_errors

PROGRAMS = {
    "emb": "def emb(double(E, D) LUT, int32(B, L) Ids) -> (Y) { Y(b, l, d) = LUT(Ids(b, l), d) }",
    "bag": "def bag(double(E, D) LUT, int32(B, L) Ids, double(B, L) W) -> (O) "
           "{ O(b, d) +=! W(b, l) * tanh(LUT(Ids(b, l), d)) }",
    "hist": "def hist(double(N) X, int32(N) Ids, double(E) Prior) -> (double(E) H) "
            "{ H(e) = Prior(e)\n H(Ids(i)) += X(i) * X(i) }",
    "chain": "def chain(double(N, D) X, int32(N) Ids, double(E, D) W) -> (double(E, D) H, O) "
             "{ H(Ids(i), d) +=! exp(X(i, d))\n O(e) +=! H(e, d) * W(e, d) }",
    "table": "def table(double(E, D) LUT, int32(B) Ids) -> (O) "
             "{ T(e, d) = LUT(e, d) * LUT(e, d)\n O(b, d) = T(Ids(b), d) }",
}


def _inputs(name, rng, n, rows, width):
    ids = rng.integers(0, rows, n).astype(np.int32)
    ids[0] = ids[-1]  # a repeated index
    if name in ("emb", "bag"):
        ids2 = rng.integers(0, rows, (n, 3)).astype(np.int32)
        table = rng.standard_normal((rows, width))
        return (table, ids2) if name == "emb" else (table, ids2, rng.standard_normal((n, 3)))
    if name == "hist":
        return rng.standard_normal(n), ids, rng.standard_normal(rows)
    if name == "chain":
        return rng.standard_normal((n, width)), ids, rng.standard_normal((rows, width))
    return rng.standard_normal((rows, width)), ids


@pytest.mark.parametrize("name", list(PROGRAMS))
@pytest.mark.parametrize("n,rows,width", [(1, 1, 1), (5, 3, 2), (11, 7, 3)])
def test_gradients_match_finite_differences(name, n, rows, width):
    kernel = getattr(tc.define(PROGRAMS[name]), name)
    g = tc.grad(kernel)
    rng = np.random.default_rng(n * 31 + rows)
    inputs = _inputs(name, rng, n, rows, width)
    for x, err in _directional_errors(kernel, g, inputs, rng, 1e-6):
        assert err < 1e-6, f"d/d{x}: relative error {err:.2e}\n{g.source}"


def test_the_gradient_of_a_gather_is_a_scatter_add():
    g = tc.grad(tc.define(PROGRAMS["emb"]).emb)
    assert "    dLUT(Ids(b, l), d) += dY(b, l, d)" in g.source, g.source
    assert "==" not in g.source  # no equality-guarded pass over the table
    rng = np.random.default_rng(0)
    table, ids = rng.standard_normal((50, 4)), rng.integers(0, 50, (6, 5)).astype(np.int32)
    dy = rng.standard_normal((6, 5, 4))
    _, saved = g.forward(table, ids)
    (dlut,) = g.backward((table, ids), saved, (dy,))
    expected = np.zeros_like(table)
    np.add.at(expected, ids, dy)
    np.testing.assert_allclose(dlut, expected, rtol=1e-12, atol=1e-12)


def test_the_gradient_of_a_scatter_add_is_a_gather():
    g = tc.grad(tc.define(PROGRAMS["chain"]).chain, wrt="X")
    assert "dX(i, d) = dH2(Ids(i), d) * exp(X(i, d))" in g.source, g.source


def test_a_scatter_by_max_has_no_gradient_rule():
    m = tc.define("def m(double(N) X, int32(N) Ids, double(E) L) -> (double(E) O) "
                  "{ O(Ids(i)) max=! X(i) }")
    with pytest.raises(tc.TCGradError, match="a scatter by max= has no gradient rule"):
        tc.grad(m.m)


def test_gradcheck_through_torch():
    torch = pytest.importorskip("torch")
    import tclang.torch as tct
    rng = np.random.default_rng(1)
    for name in ("emb", "bag", "hist", "chain"):
        f = tct.function(PROGRAMS[name], name)
        inputs = [torch.from_numpy(np.asarray(a)) for a in _inputs(name, rng, 5, 3, 2)]
        inputs = [t.requires_grad_() if t.is_floating_point() else t for t in inputs]
        assert torch.autograd.gradcheck(f, tuple(inputs), eps=1e-6, atol=1e-6, rtol=1e-5)
