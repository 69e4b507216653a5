"""tc.grad of what the forward accepts (issue 35 item 5): `where` clauses of every kind
(a where-local, a range, a range bounded by other indices, `exists`), guarded reads that
bound no index (padding, TC's concat, masks), and second derivatives through `tc.grad(g)`.

Every gradient is checked against central differences in float64: for each input x, the
directional derivative of <w, f(x)> along a random v must equal <grad_x, v>. Extents are
prime or odd, and 1. A range bounded by another index (`where j in 0:i + 1`) was refused
("tc.grad does not yet handle a range bounded by other indices").
"""

from __future__ import annotations

import numpy as np
import pytest

import tclang as tc

ATTENTION = """def f(double(T, D) Q, double(T, D) K, double(T, E) V) -> (O) {
    S(i, j) +=! Q(i, d) * K(j, d)
    Mx(i) max=! S(i, j) where j in 0:i + 1
    P(i, j) = exp(S(i, j) - Mx(i)) where j in 0:i + 1
    Z(i) +=! P(i, j) where j in 0:i + 1
    O(i, e) +=! P(i, j) * V(j, e) / Z(i) where j in 0:i + 1
}"""

# name: (source, sizes); each program also runs with every size 1
PROGRAMS = {
    "where_local": ("def f(double(N) X) -> (Y) { Y(i) = s * X(i) * X(i) where s = 2.0 }",
                    {"N": 5}),
    "where_range": ("def f(double(N) X) -> (Y) { Y(i) = X(i + 1) * X(i) where i in 0:N - 1 }",
                    {"N": 7}),
    "exists": ("def f(double(N) X, double(N) W) -> (Y) "
               "{ Y(i) +=! X(j) * W(j) * X(i) where exists X(j) }", {"N": 5}),
    "trimm": ("def f(double(N, N) L, double(N, K) B) -> (C) "
              "{ C(i, k) +=! L(i, j) * B(j, k) where j in 0:i + 1 }", {"N": 5, "K": 3}),
    "upper": ("def f(double(N, N) L, double(N) B) -> (C) "
              "{ C(i) +=! L(i, j) * B(j) * B(j) where j in i:N }", {"N": 7}),
    "band": ("def f(double(N) X) -> (C) { C(i) +=! X(j) * X(i) where j in (i + 1) / 2:N - i }",
             {"N": 7}),
    "shifted": ("def f(double(N) X) -> (C) "
                "{ C(i) +=! X(i - j) * X(j) where i in 0:N, j in 0:i + 1 }", {"N": 5}),
    "triangle_max": ("def f(double(N, N) S) -> (M) { M(i) max=! S(i, j) * 2.0 "
                     "where j in 0:i + 1 }", {"N": 5}),
    "causal_softmax": ("""def f(double(T, T) S) -> (P) {
        Mx(i) max=! S(i, j) where j in 0:i + 1
        E(i, j) = exp(S(i, j) - Mx(i)) where j in 0:i + 1
        Sm(i) +=! E(i, j) where j in 0:i + 1
        P(i, j) = E(i, j) / Sm(i) where j in 0:i + 1
    }""", {"T": 5}),
    "causal_attention": (ATTENTION, {"T": 5, "D": 3, "E": 2}),
    "masked_attention": ("""def f(double(T, D) Q, double(T, D) K, double(T, E) V) -> (O) {
        S(i, j) +=! Q(i, d) * K(j, d)
        Mx(i) max=! S(i, j)
        P(i, j) = (j <= i) ? exp(S(i, j) - Mx(i)) : 0.0 where i in 0:T, j in 0:T
        Z(i) +=! P(i, j)
        O(i, e) +=! P(i, j) * V(j, e) / Z(i)
    }""", {"T": 5, "D": 3, "E": 2}),
    "partial_overwrite": ("""def f(double(N, N) X) -> (Y) {
        Y(i, j) = X(i, j) * X(i, j)
        Y(i, j) = Y(i, j) * X(i, j) where j in 0:i + 1
    }""", {"N": 4}),
    "conv_pad1": ("""def f(double(B, C, H, W) I, double(F, C, 3, 3) Wt) -> (O) {
        O(n, f, h, w) +=! (h + kh - 1 >= 0 && h + kh - 1 < H && w + kw - 1 >= 0 &&
                           w + kw - 1 < W) ? I(n, c, h + kh - 1, w + kw - 1) * Wt(f, c, kh, kw)
                                           : 0 where h in 0:H, w in 0:W, kh in 0:3, kw in 0:3
    }""", {"B": 2, "C": 2, "H": 5, "W": 3, "F": 3}),
    "pad_window": ("""def f(double(N) X, double(K) Wt) -> (O) {
        O(i) +=! Wt(k) * ((i + k - 1 >= 0 && i + k - 1 < N) ? X(i + k - 1) : 0.0) where i in 0:N
    }""", {"N": 7, "K": 3}),
    "concat": ("def f(double(M, N) A, double(M, N) B) -> (O1) "
               "{ O1(n, i, m) = i == 0 ? A(m, n) : B(m, n) * B(m, n) where i in 0:2 }",
               {"M": 3, "N": 5}),
}


def directional_errors(kernel, g, args, rng) -> dict[str, float]:
    """Per input of g.wrt, |<grad, v> - central differences| relative to max(1, |...|)."""
    outs, saved = g.forward(*args)
    names = [t.name for t in kernel.definition.outputs]
    seeds = tuple(rng.standard_normal(np.shape(outs[names.index(n)])) for n in g.output_names)
    grads = g.backward(tuple(args), saved, seeds)

    def objective(xs) -> float:
        o = kernel(*xs)
        o = o if isinstance(o, tuple) else (o,)
        return sum(float(np.sum(w * o[names.index(n)])) for w, n in zip(seeds, g.output_names))
    params = [t.name for t in kernel.definition.inputs]
    errors = {}
    for x, gx in zip(g.wrt, grads):
        i, eps = params.index(x), 1e-6
        v = rng.standard_normal(np.shape(args[i]))
        plus, minus = list(args), list(args)
        plus[i], minus[i] = args[i] + eps * v, args[i] - eps * v
        numeric = (objective(plus) - objective(minus)) / (2 * eps)
        errors[x] = abs(numeric - float(np.sum(gx * v))) / max(1.0, abs(numeric))
    return errors


def _inputs(kernel, sizes, rng) -> list:
    return [rng.standard_normal(tuple(d.evaluate(sizes) for d in t.shape))
            for t in kernel.definition.inputs]


def _check(name, backend, unit):
    source, sizes = PROGRAMS[name]
    sizes = {k: 1 for k in sizes} if unit else sizes
    kernel = tc.define(source, backend=backend).f
    g = tc.grad(kernel)
    rng = np.random.default_rng(7)
    errors = directional_errors(kernel, g, _inputs(kernel, sizes, rng), rng)
    assert max(errors.values()) < 1e-6, (errors, g.source, g.forward_source)


@pytest.mark.parametrize("name", sorted(PROGRAMS))
@pytest.mark.parametrize("backend", ["cpu", "reference"])
def test_gradients_of_where_clauses_and_guarded_reads(name, backend):
    _check(name, backend, unit=False)


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_gradients_at_extent_one(name):
    _check(name, "reference", unit=True)


@pytest.mark.parametrize("name", ["causal_attention", "trimm", "conv_pad1", "band"])
def test_gradients_on_the_emulated_gpu(name):
    _check(name, "cuda-emulated", unit=False)


@pytest.mark.slow  # every program compiled for the emulated GPU (~1 minute)
@pytest.mark.parametrize("name", sorted(PROGRAMS))
@pytest.mark.parametrize("unit", [False, True])
def test_every_gradient_on_the_emulated_gpu(name, unit):
    _check(name, "cuda-emulated", unit)


def test_a_triangular_range_is_kept_in_the_training_forward_and_guards_the_backward():
    """The saved candidates of a max=! over a triangle are written over the triangle, and
    the backward's sums run under the range's bound (the guarded-sum pass makes that a
    loop bound: the backward walks the triangle too)."""
    g = tc.grad(tc.define(PROGRAMS["triangle_max"][0]).f)
    assert "where i in 0:N, j in 0:i + 1" in g.forward_source, g.forward_source
    assert "ties_M(i) +=! j < i + 1 ?" in g.source, g.source
    g = tc.grad(tc.define(PROGRAMS["trimm"][0]).f)
    assert "dB(j, k) +=! j < i + 1 ? dC(i, k) * L(i, j) : 0.0" in g.source, g.source


# ---- second order through tc.grad ------------------------------------------------------------

SECOND = {
    "cube": ("def f(double(N) X) -> (Y) { Y(i) = X(i) * X(i) * X(i) }", {"N": 5}),
    "tanh": ("def f(double(N) X, double(N) B) -> (Y) { Y(i) = tanh(X(i) * B(i)) }", {"N": 7}),
    "sum_of_squares": ("def f(double(N, M) X) -> (S) { S(n) +=! X(n, m) * X(n, m) }",
                       {"N": 3, "M": 5}),
    "tanh_layer": ("""def f(double(B, I) X, double(O, I) W, double(O) b) -> (Y) {
        Y(n, o) +=! X(n, i) * W(o, i)
        Y(n, o) = tanh(Y(n, o) + b(o))
    }""", {"B": 3, "I": 5, "O": 2}),
    "matmul": ("def f(double(M, K) A, double(K, N) B) -> (C) { C(m, n) +=! A(m, k) * B(k, n) }",
               {"M": 3, "K": 5, "N": 2}),
    "trimm": PROGRAMS["trimm"],
    "pad_window": PROGRAMS["pad_window"],
    "band": PROGRAMS["band"],
    "where_local": PROGRAMS["where_local"],
}


@pytest.mark.parametrize("name", sorted(SECOND))
def test_the_gradient_of_a_gradient(name):
    """tc.grad(g) differentiates g's backward definition (its inputs: the forward's inputs,
    the saved values, the output gradients), checked at the point the forward gives. (A
    backward that routes through a max compares a saved result with its candidates: as a
    function of both it jumps at that very point, so max programs are checked whole,
    through gradgradcheck, below.)"""
    source, sizes = SECOND[name]
    kernel = tc.define(source).f
    g = tc.grad(kernel)
    gg = tc.grad(g)
    assert gg.kernel is g.backward_kernel
    rng = np.random.default_rng(11)
    inputs = _inputs(kernel, sizes, rng)
    outs, saved = g.forward(*inputs)
    seeds = [rng.standard_normal(np.shape(outs[0])) for _ in g.output_names]
    args = [*inputs, *(saved[s.name] for s in g.plan.saved), *seeds]
    errors = directional_errors(g.backward_kernel, gg, args, rng)
    assert max(errors.values()) < 1e-6, (errors, gg.source)


# ---- second order through tclang.torch ---------------------------------------------------------

def _gradgradcheck(name):
    torch = pytest.importorskip("torch")
    import tclang.torch as tct
    source, sizes = PROGRAMS[name]
    f = tct.function(source, "f")
    rng = np.random.default_rng(3)
    inputs = tuple(torch.from_numpy(a).requires_grad_()
                   for a in _inputs(f.kernel, sizes, rng))
    assert torch.autograd.gradcheck(f, inputs, eps=1e-6, atol=1e-5, rtol=1e-4)
    assert torch.autograd.gradgradcheck(f, inputs, eps=1e-6, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("name", ["causal_attention", "conv_pad1", "band", "where_local"])
def test_gradgradcheck_of_where_clauses_and_guarded_reads(name):
    _gradgradcheck(name)


@pytest.mark.slow  # ~15 s a program: five definitions compiled for each
@pytest.mark.parametrize("name", sorted(set(PROGRAMS) - {"causal_attention", "conv_pad1",
                                                         "band", "where_local"}))
def test_gradgradcheck_of_every_where_program(name):
    _gradgradcheck(name)


# ---- errors in the user's terms ---------------------------------------------------------------

MODULE = """def a(float(N) X) -> (Y) { Y(i) = X(i) }

def f(float(N) X) -> (Y) {
    Y(i) = floor(X(i)) * s where s = 2.0
}
def h(float(N) X) -> (Y, Z) {
    Y(i) +=! X(j) where i in 0:N, j in 0:i + 1
    Z(i) = Y(i) * Y(i)
}
"""


def test_an_error_while_differentiating_points_at_the_users_statement():
    """The refusal is located in the module as the user wrote it (its line, caret under
    the statement), and says nothing about adding a where clause that is there."""
    with pytest.raises(tc.TCGradError) as info:
        tc.grad(tc.define(MODULE).f)
    err = info.value
    assert err.line == 4 and "Y(i) = floor(X(i)) * s where s = 2.0" in str(err), str(err)
    assert "^^^" in str(err) and "where" not in (err.hint or "")


def test_a_triangular_range_is_differentiated_not_refused():
    g = tc.grad(tc.define(MODULE).h)  # "tc.grad does not yet handle a range bounded by..."
    x = np.arange(1.0, 6.0, dtype=np.float32)
    dX = g(x, np.ones(5, np.float32), np.zeros(5, np.float32))
    np.testing.assert_allclose(dX, [5, 4, 3, 2, 1])  # X(j) feeds Y(i) for every i >= j


def test_an_output_gradient_of_the_wrong_type_is_said_in_the_callers_terms():
    """Not "argument 3 (dY) of h_grad": the caller passed two gradients, and never saw the
    generated backward's signature."""
    g = tc.grad(tc.define(MODULE).h)
    x = np.ones(5, np.float32)
    with pytest.raises(tc.TCArgumentError, match=r"the gradient of output Y is float64, but "
                       r"Y is float32") as info:
        g(x, np.ones(5), np.ones(5, np.float32))
    assert "h_grad" not in str(info.value) and "float32" in info.value.hint


# ---- half and bfloat16 ---------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", ["half", "bfloat16"])
def test_an_unused_narrow_input_gets_a_zero_gradient_of_its_type(dtype):
    """Found by the fuzzer's own-types grad check (seed 36, program 13): the zero gradient
    of an input no output depends on was the literal 0.0, float32, which the backward
    would not narrow into a half gradient ("the backward ... does not check")."""
    g = tc.grad(tc.define(f"def f(float(N) A, {dtype} beta) -> (O) "
                          "{ O(i) = A(i) * 2.0 where i in 0:N }").f)
    assert f"dbeta = {dtype}(0.0)" in g.source, g.source
    A = np.arange(3, dtype=np.float32)
    if dtype == "half":
        dA, dbeta = g(A, np.float16(1.5), np.ones(3, np.float32))
        assert np.asarray(dbeta).dtype == np.float16 and float(dbeta) == 0.0
        np.testing.assert_array_equal(dA, [2, 2, 2])


@pytest.mark.parametrize("op", ["max", "min"])
@pytest.mark.parametrize("sizes", [{"P": 5, "Q": 7}, {"P": 1, "Q": 3}, {"P": 13, "Q": 1}])
def test_ties_of_a_max_over_an_index_the_candidates_do_not_use(op, sizes):
    """`O(k, j, i) max=! B(i, j, k) where exists C(l)`: every l is a candidate and they all
    tie, so each gets 1/P of dO. The count of ties left l out of its text (a sum over
    nothing: 1) while the weight was multiplied by P: the gradient came out P times too
    large (fuzz seed 2028, program 1276)."""
    from tclang.fuzzing import gradients
    from tclang.fuzzing.generator import GeneratedProgram
    source = (f"def f(double(3, Q, Q) B, int32(P) C) -> (O) {{\n"
              f"    O(k, j, i) {op}=! B(i, j, k) where exists C(l)\n}}\n")
    assert gradients.check_grad(GeneratedProgram(source, "f", sizes))[0] == []
    k = tc.define(source)["f"]
    rng = np.random.default_rng(0)
    b = rng.standard_normal((3, sizes["Q"], sizes["Q"]))
    c = np.zeros(sizes["P"], dtype=np.int32)
    d = rng.standard_normal((sizes["Q"], sizes["Q"], 3))
    g = tc.grad(k)
    _, saved = g.forward(b, c)
    (db,) = g.backward((b, c), saved, (d,))
    np.testing.assert_allclose(db, d.transpose(2, 1, 0), rtol=1e-12)  # O is B, permuted
