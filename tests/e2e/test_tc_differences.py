"""Issue 35 item 6: TC's `<=>` annotation, constant left-side subscripts and reductions over
bool, on every backend against NumPy (docs/language.md, "Differences from TC")."""

from __future__ import annotations

import numpy as np
import pytest

import tclang as tc

BACKENDS = ["cpu", "reference", "cuda-emulated"]

SOURCE = """
def total(float(N) A) -> (C) { C(0) +=! A(i) }
def corner(float(N, M) A) -> (C) { C(2, j) +=! A(i, j) * float(i) }
def last(float(N, M) A) -> (C) { C(i, 0) max=! A(i, j) where i in 0:N }
def fc(float(B, I) X, float(O, I) W) -> (Y) {
    Y(n, o) +=! X(n, i) * W(o, i) <=> fc(X, W)
}
def relu(float(B, I) X) -> (Y) { Y(n, i) = fmax(X(n, i), 0) <=> relu(X(n, i)) }
def any_all(bool(N, M) P) -> (bool(N) Any, bool(N) All) {
    Any(i) max=! P(i, j)
    All(i) min=! P(i, j)
}
"""


@pytest.fixture(scope="module", params=BACKENDS)
def mod(request):
    return tc.define(SOURCE, backend=request.param)


@pytest.mark.parametrize("n,m", [(1, 1), (2, 3), (7, 5), (13, 1)])
def test_constant_left_subscripts(mod, n, m):
    r = np.random.default_rng(n * 100 + m)
    A = r.random((n, m), np.float32)
    np.testing.assert_allclose(mod.total(A[:, 0]), [A[:, 0].sum()], rtol=1e-5)
    want = np.zeros((3, m), np.float32)
    want[2] = (A * np.arange(n)[:, None]).sum(0)
    np.testing.assert_allclose(mod.corner(A), want, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(mod.last(A), A.max(1, keepdims=True))


@pytest.mark.parametrize("b,i,o", [(1, 1, 1), (3, 5, 2), (7, 13, 3)])
def test_the_equivalence_annotation_changes_nothing(mod, b, i, o):
    r = np.random.default_rng(b + i + o)
    X, W = r.standard_normal((b, i), np.float32), r.standard_normal((o, i), np.float32)
    np.testing.assert_allclose(mod.fc(X, W), X @ W.T, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(mod.relu(X), np.maximum(X, 0))


@pytest.mark.parametrize("n,m", [(1, 1), (2, 3), (7, 5), (13, 2), (3, 0)])
def test_bool_reductions_are_any_and_all(mod, n, m):
    P = np.random.default_rng(n * 7 + m).random((n, m)) < 0.5
    got_any, got_all = mod.any_all(P)
    np.testing.assert_array_equal(got_any, P.any(1))  # an empty row: false
    np.testing.assert_array_equal(got_all, P.all(1))  # an empty row: true


@pytest.mark.parametrize("op", ["+=!", "*=!", "+=", "*="])
def test_sums_and_products_of_bool_are_refused(op):
    with pytest.raises(tc.TCSemanticError, match="cannot reduce bool values") as info:
        tc.define(f"def f(bool(N) P) -> (int32(1) C) {{ C(0) = 0\n C(0) {op} P(i) }}")
    assert info.value.line == 2 and "int32(x)" in str(info.value)


@pytest.mark.parametrize("source,error,message,column", [
    ("def f(float(N) A) -> (C) { C(i) = A(i) <=> copy(Z) }", tc.TCSemanticError,
     "Z in the `<=>` annotation is not a tensor, size or index of this statement", 49),
    ("def f(float(N) A) -> (C) { C(i) = A(i) <=> copy(Q(i)) }", tc.TCSemanticError,
     "Q in the `<=>` annotation is not a tensor", 49),
    ("def f(float(N) A) -> (C) { C(i) = A(i) <=> }", tc.TCSyntaxError,
     "unexpected '}'; expected a name", 44),
    ("def f(float(N) A) -> (C) { C(i) = A(i) where i in 0:N <=> copy(A) }", tc.TCSyntaxError,
     "hint: `<=> name(args)` comes right after the statement's expression, before `where`",
     55),
    ("def f(float(N) A) -> (C) { C(i + 1) = A(i) }", tc.TCSyntaxError,
     "unexpected '+'", 32),
    ("def f(float(N) A) -> (C) { C(0, 0) = A(i) }", tc.TCSemanticError,
     "which makes it a reduction index, but `=` does not reduce", 40),
])
def test_bad_annotations_and_subscripts_are_located(source, error, message, column):
    with pytest.raises(error) as info:
        tc.define(source)
    assert message in str(info.value) and info.value.column == column, str(info.value)


def test_a_left_constant_subscript_hint_says_what_to_write():
    with pytest.raises(tc.TCSyntaxError) as info:
        tc.define("def f(float(N) A) -> (C) { C(i + 1) = A(i) }")
    assert "C(i) = A(i - 1)" in str(info.value)


def test_constant_subscripts_keep_their_names_apart():
    """The fresh index of `C(0)` does not capture an index the statement uses (`c0`)."""
    k = tc.define("def f(float(N, M) A) -> (C) { C(0, c0) +=! A(c1, c0) }").f
    A = np.arange(6, dtype=np.float32).reshape(3, 2)
    np.testing.assert_array_equal(k(A), A.sum(0, keepdims=True))


def test_grad_through_a_constant_subscript():
    k = tc.define(SOURCE).total
    g = tc.grad(k)
    np.testing.assert_array_equal(g(np.arange(4, dtype=np.float32), np.full(1, 2.0, np.float32)),
                                  np.full(4, 2.0))
