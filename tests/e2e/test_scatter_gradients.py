"""Gradients through gathers and scatters (tclang/autodiff/adjoint.py): the gradient of a
gather is a scatter-add (work proportional to the lookups, not the table), the gradient of
a scatter-add a gather, and that of a scatter by max=/min= a gather routed to the updates
equal to the result (split evenly between ties, as a max=! reduction's). Checked against
finite differences and NumPy (`np.add.at`, `np.maximum.at`), and through `tclang.torch`
with gradcheck."""

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


# ---- scatters by max= and min= ------------------------------------------------------------
# The rule of a max=!/min=! reduction (docs/autodiff.md): the candidates equal to the
# result share its gradient evenly; without `!` the value written before is a candidate.

EXTREMES = {
    "max!": "def f(double(N, D) X, int32(N) Ids, double(E, D) L) -> (double(E, D) O) "
            "{ O(Ids(i), d) max=! X(i, d) }",
    "min!": "def f(double(N, D) X, int32(N) Ids, double(E, D) L) -> (double(E, D) O, P) "
            "{ O(Ids(i), d) min=! tanh(X(i, d)) + L(Ids(i), d)\n"
            " P(e, d) = O(e, d) * L(e, d) }",
    "max": "def f(double(N, D) X, int32(N) Ids, double(E, D) L) -> (double(E, D) O) "
           "{ O(e, d) = L(e, d) * 0.5\n O(Ids(i), d) max= X(i, d) * 1.5 }",
    "min": "def f(double(N, D) X, int32(N) Ids, double(E, D) L) -> (double(E, D) O) "
           "{ O(e, d) = L(e, d)\n O(Ids(i), d) min= X(i, d) }",
}
# what each computes per lookup, and the value before (None: the identity, for `!`)
_FORMS = {
    "max!": (np.maximum, lambda x, lut, ids: x, None),
    "min!": (np.minimum, lambda x, lut, ids: np.tanh(x) + lut[ids], None),
    "max": (np.maximum, lambda x, lut, ids: x * 1.5, lambda lut: lut * 0.5),
    "min": (np.minimum, lambda x, lut, ids: x, lambda lut: lut.copy()),
}


def _extreme_inputs(rng, n, rows, width, ties):
    """X, Ids, L; with `ties`, small integers, so that updates tie with each other and
    with the value before (Ids repeats an element in any case)."""
    ids = rng.integers(0, rows, n).astype(np.int32)
    ids[0] = ids[-1]
    if ties:
        return (rng.integers(-2, 3, (n, width)).astype(np.float64), ids,
                rng.integers(-2, 3, (rows, width)).astype(np.float64))
    return rng.standard_normal((n, width)), ids, rng.standard_normal((rows, width))


def _numpy_rule(name, x, ids, lut, d_out):
    """The gradient (dX, and dL where the value before is L's) by the rule, in NumPy:
    dO of each element split evenly between the candidates equal to it."""
    extreme, value, before = _FORMS[name]
    v = value(x, lut, ids)
    start = np.full(lut.shape, -np.inf if extreme is np.maximum else np.inf) \
        if before is None else before(lut)
    out = start.copy()
    extreme.at(out, ids, v)
    ties = np.zeros(lut.shape) if before is None else (start == out).astype(np.float64)
    np.add.at(ties, ids, (v == out[ids]).astype(np.float64))
    share = np.where(v == out[ids], d_out[ids] / np.where(ties[ids] == 0, 1, ties[ids]), 0)
    if name == "min!":  # tanh(X) + L(Ids): dX through tanh, dL a scatter-add of the share
        dl = np.zeros(lut.shape)
        np.add.at(dl, ids, share)
        return out, share * (1 - np.tanh(x) ** 2), dl, ties
    dx = share * (1.5 if name == "max" else 1.0)
    if before is None:
        return out, dx, np.zeros(lut.shape), ties
    dl = np.where(start == out, d_out / np.where(ties == 0, 1, ties), 0)
    return out, dx, dl * (0.5 if name == "max" else 1.0), ties


def test_a_scatter_by_max_has_a_gradient_gathered_at_the_lookups():
    """tc.grad refused it ("a scatter by max= has no gradient rule"); now it reads dO where
    each update landed: no pass over the table per lookup (no `e == Ids(i)` guard)."""
    m = tc.define("def m(double(N) X, int32(N) Ids, double(E) L) -> (double(E) O) "
                  "{ O(Ids(i)) max=! X(i) }")
    g = tc.grad(m.m, wrt="X")
    assert "    ties_O(Ids(i)) += X(i) == O(Ids(i)) ? 1.0 : 0.0" in g.source, g.source
    assert "    dX(i) = X(i) == O(Ids(i)) ? dO(Ids(i)) / ties_O(Ids(i)) : 0.0" in g.source, \
        g.source
    assert "== Ids" not in g.source
    x = np.array([3.0, 1.0, 3.0, 2.0, -1.0])
    ids = np.array([0, 0, 0, 2, 1], np.int32)
    d_out = np.array([6.0, 5.0, 4.0])
    _, saved = g.forward(x, ids, np.zeros(3))
    (dx,) = g.backward((x, ids, np.zeros(3)), saved, (d_out,))
    np.testing.assert_array_equal(dx, [3.0, 0.0, 3.0, 4.0, 5.0])  # a tie halves


@pytest.mark.parametrize("backend", ["cpu", "reference"])
@pytest.mark.parametrize("name", list(EXTREMES))
@pytest.mark.parametrize("n,rows,width", [(2, 1, 1), (5, 3, 2), (11, 7, 3), (13, 2, 1)])
def test_scatter_extremes_match_finite_differences(name, backend, n, rows, width):
    kernel = tc.define(EXTREMES[name], backend=backend).f
    g = tc.grad(kernel)
    rng = np.random.default_rng(n * 37 + rows * 5 + width)
    inputs = _extreme_inputs(rng, n, rows, width, ties=False)
    if name.endswith("!"):  # an element no update lands on keeps -inf (+inf for min):
        inputs[1][1: rows + 1] = np.arange(rows)  # its differences are NaN; all updated
    for x, err in _directional_errors(kernel, g, inputs, rng, 1e-6):
        assert err < 1e-6, f"d/d{x}: relative error {err:.2e}\n{g.source}"


@pytest.mark.parametrize("backend", ["cpu", "reference"])
@pytest.mark.parametrize("name", list(EXTREMES))
@pytest.mark.parametrize("n,rows,width", [(1, 1, 1), (7, 3, 2), (31, 5, 3)])
def test_scatter_extremes_with_ties_follow_the_rule(name, backend, n, rows, width):
    kernel = tc.define(EXTREMES[name], backend=backend).f
    g = tc.grad(kernel)
    rng = np.random.default_rng(n + rows)
    x, ids, lut = _extreme_inputs(rng, n, rows, width, ties=True)
    outs, saved = g.forward(x, ids, lut)
    outs = outs if isinstance(outs, tuple) else (outs,)
    d_out = rng.integers(1, 9, (rows, width)).astype(np.float64)
    seeds = [d_out] + [np.zeros((rows, width))] * (len(g.output_names) - 1)
    dx, dl = g.backward((x, ids, lut), saved, tuple(seeds))
    out, want_dx, want_dl, ties = _numpy_rule(name, x, ids, lut, d_out)
    np.testing.assert_array_equal(outs[0], out)
    assert n == 1 or ties.max() > 1  # the draw has ties
    np.testing.assert_allclose(dx, want_dx, rtol=1e-14, atol=0)
    np.testing.assert_allclose(dl, want_dl, rtol=1e-14, atol=0)


@pytest.mark.parametrize("name", list(EXTREMES))
def test_scatter_extremes_with_ties_on_cuda_emulated(name):
    """The GPU's form: the tie count is an atomic scatter-add (exact: counts of 1.0)."""
    g = tc.grad(tc.define(EXTREMES[name], backend="cuda-emulated").f)
    rng = np.random.default_rng(1)
    x, ids, lut = _extreme_inputs(rng, 13, 3, 2, ties=True)
    _, saved = g.forward(x, ids, lut)
    d_out = np.arange(1.0, 7.0).reshape(3, 2)
    seeds = [d_out] + [np.zeros((3, 2))] * (len(g.output_names) - 1)
    dx, dl = g.backward((x, ids, lut), saved, tuple(seeds))
    _, want_dx, want_dl, ties = _numpy_rule(name, x, ids, lut, d_out)
    assert ties.max() > 1
    np.testing.assert_allclose(dx, want_dx, rtol=1e-14, atol=0)
    np.testing.assert_allclose(dl, want_dl, rtol=1e-14, atol=0)


@pytest.mark.parametrize("bang", ["!", ""])
@pytest.mark.parametrize("op", ["max", "min"])
def test_a_scatter_extreme_and_the_guarded_reduction_have_one_gradient(op, bang):
    """`O(Ids(i), d) max=! X(i, d)` and `O(e, d) max=! e == Ids(i) ? X(i, d) : -1e300`:
    the same result where an update lands, and the same gradient, ties included; without
    `!`, onto `O = L * 0.5` written before, L's gradient too."""
    far = "-1e300" if op == "max" else "1e300"
    init = "" if bang else "O(e, d) = L(e, d) * 0.5\n "
    scatter = tc.define(f"def f(double(N, D) X, int32(N) Ids, double(E, D) L) -> "
                        f"(double(E, D) O) {{ {init}O(Ids(i), d) {op}={bang} X(i, d) }}").f
    reduction = tc.define(f"def f(double(N, D) X, int32(N) Ids, double(E, D) L) -> "
                          f"(double(E, D) O) {{ {init}O(e, d) {op}={bang} e == Ids(i) ? "
                          f"X(i, d) : {far} where e in 0:E }}").f
    rng = np.random.default_rng(3)
    for n, rows, width in [(1, 1, 1), (17, 5, 3), (29, 7, 2)]:
        x, ids, lut = _extreme_inputs(rng, n, rows, width, ties=True)
        d_out = rng.standard_normal((rows, width))
        got = []
        for kernel in (scatter, reduction):
            g = tc.grad(kernel)
            outs, saved = g.forward(x, ids, lut)
            outs = outs if isinstance(outs, tuple) else (outs,)
            got.append(tuple(outs) + tuple(g.backward((x, ids, lut), saved, (d_out,))))
        (o1, *grads1), (o2, *grads2) = got
        updated = np.isfinite(o1)  # elsewhere the identity, or the reduction's +-1e300
        np.testing.assert_array_equal(o1[updated], o2[updated])
        for a, b in zip(grads1, grads2):
            np.testing.assert_allclose(a, b, rtol=1e-14, atol=0)


def test_a_scatter_extreme_without_a_float_input_is_refused_with_its_statement():
    m = tc.define("def m(int32(N) X, int32(N) Ids, int32(E) L) -> (int32(E) O) "
                  "{ O(Ids(i)) max=! X(i) }")
    with pytest.raises(tc.TCGradError, match="no floating-point input") as err:
        tc.grad(m.m)
    assert "line 1" in str(err.value)


def test_gradcheck_through_torch():
    torch = pytest.importorskip("torch")
    import tclang.torch as tct
    rng = np.random.default_rng(1)
    for name in ("emb", "bag", "hist", "chain"):
        f = tct.function(PROGRAMS[name], name)
        inputs = [torch.from_numpy(np.asarray(a)) for a in _inputs(name, rng, 5, 3, 2)]
        inputs = [t.requires_grad_() if t.is_floating_point() else t for t in inputs]
        assert torch.autograd.gradcheck(f, tuple(inputs), eps=1e-6, atol=1e-6, rtol=1e-5)
    for name in EXTREMES:  # no ties (random normal values); every element updated
        f = tct.function(EXTREMES[name], "f")
        x, ids, lut = _extreme_inputs(rng, 7, 3, 2, ties=False)
        ids[:3] = np.arange(3)
        inputs = (torch.from_numpy(x).requires_grad_(), torch.from_numpy(ids),
                  torch.from_numpy(lut).requires_grad_())
        assert torch.autograd.gradcheck(f, inputs, eps=1e-6, atol=1e-6, rtol=1e-5), name
        assert torch.autograd.gradgradcheck(f, inputs, eps=1e-6, atol=1e-6, rtol=1e-5), name


# ---- the reduction form without `!` -------------------------------------------------------

ONTO = {
    "rows": "def f(double(N, K) X, double(N) L) -> (double(N) O) "
            "{ O(i) = L(i) * 2.0\n O(i) max= X(i, k) * 0.5 }",
    "pointwise": "def f(double(N, K) X, double(N) L) -> (double(N) O) "
                 "{ O(i) = tanh(L(i))\n O(i) min= X(i, 0) }",
}


@pytest.mark.parametrize("backend", ["cpu", "reference"])
@pytest.mark.parametrize("name", list(ONTO))
@pytest.mark.parametrize("n,k", [(1, 1), (7, 3), (13, 5)])
def test_a_max_reduction_onto_a_value_written_before(name, backend, n, k):
    """`O(i) max= X(i, k)` after `O(i) = L(i)`: the value before is one more candidate
    (the scatter's rule); tc.grad refused `max=` without reset."""
    kernel = tc.define(ONTO[name], backend=backend).f
    g = tc.grad(kernel)
    rng = np.random.default_rng(n * k)
    inputs = (rng.standard_normal((n, k)), rng.standard_normal(n))
    for x, err in _directional_errors(kernel, g, inputs, rng, 1e-6):
        assert err < 1e-6, f"d/d{x}: relative error {err:.2e}\n{g.source}"
    if name == "rows":  # with ties: each of the tied candidates gets its share
        x = np.array([[1.0, 2.0, 2.0], [0.0, 1.0, -1.0], [1.0, 0.5, 1.0]]) * 2.0
        lut = np.array([1.0, 0.0, 0.5])
        _, saved = g.forward(x, lut)
        dx, dl = g.backward((x, lut), saved, (np.array([6.0, 4.0, 9.0]),))
        # rows 0 and 2: three candidates tie (two of X and the value before), row 1: one
        np.testing.assert_array_equal(dx, np.array([[0, 2, 2], [0, 4, 0], [3, 0, 3]]) * 0.5)
        np.testing.assert_array_equal(dl, np.array([2, 0, 3]) * 2.0)


@pytest.mark.parametrize("text", [
    "def f(double(N, K) X) -> (double(N) O) { O(i) max= X(i, k) }",
    "def f(double(N, K) X, double(N) L) -> (double(N) O) "
    "{ O(i) = L(i)\n O(i) max= X(i, k) where i in 0:N-1 }",
])
def test_a_max_reduction_onto_zeros_or_part_of_a_value(text):
    """Refused until issue 35's last gradients: from zeros, 0 is one more candidate; onto
    part of a value, that value is one where the max writes and passes through where it
    does not (tests/e2e/test_reduction_gradients.py has the rest)."""
    import warnings
    from tclang.fuzzing import gradients
    from tclang.fuzzing.generator import GeneratedProgram
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tc.TCWarning)
        for n in (1, 2, 7):
            failures, notes = gradients.check_grad(GeneratedProgram(text, "f",
                                                                    {"N": n, "K": 3}))
            assert failures == [] and notes[0] == "grad", (failures, notes)
