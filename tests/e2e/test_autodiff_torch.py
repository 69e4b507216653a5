"""tclang.torch: gradcheck over the corpus, layers with parameters, and no copies on the
way in. Skipped without PyTorch (an optional extra)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import tclang as tc  # noqa: E402
import tclang.torch as tct  # noqa: E402
from tests.corpus import CASES, as_numpy  # noqa: E402
from tests.e2e.test_autodiff import NOT_DIFFERENTIABLE, _float64  # noqa: E402

DIFFERENTIABLE = [c for c in CASES if c.name not in NOT_DIFFERENTIABLE]


def _float64_case(case):
    try:
        tc.define(_float64(case.source))
    except tc.TCError:
        return None
    return _float64(case.source)


@pytest.mark.parametrize("case", DIFFERENTIABLE, ids=lambda c: c.name)
def test_gradcheck_in_float64(case):
    source = _float64_case(case)
    assert source is not None, "every differentiable corpus program has a float64 form"
    f = tct.function(source, case.entry)
    rng = np.random.default_rng(3)
    for sizes in case.shapes[:2]:
        arrays = case.make_inputs(sizes, rng)
        inputs = []
        for a in arrays:
            a = as_numpy(a)
            t = torch.from_numpy(np.array(a, np.float64 if a.dtype.kind == "f" else a.dtype))
            inputs.append(t.requires_grad_() if t.is_floating_point() else t)
        try:
            f.kernel(*[t.detach() for t in inputs])
        except tc.TCIndexError:
            continue
        assert torch.autograd.gradcheck(f, tuple(inputs), eps=1e-6, atol=1e-5, rtol=1e-4,
                                        fast_mode=True)


MLP = """def mlp(double(B,I) X, double(O,I) W, double(O) b) -> (Y) {
    Y(n, o) +=! X(n, i) * W(o, i)
    Y(n, o)  = fmax(Y(n, o) + b(o), 0)
}"""


def test_a_module_holds_parameters_and_trains():
    torch.manual_seed(0)
    layer = tct.Module(MLP, "mlp", W=torch.randn(3, 5, dtype=torch.float64),
                       b=torch.zeros(3, dtype=torch.float64))
    assert [n for n, _ in layer.named_parameters()] == ["W", "b"]
    x = torch.randn(4, 5, dtype=torch.float64)
    y = layer(x)
    y.sum().backward()
    mask = ((x @ layer.W.T + layer.b) >= 0).double()
    torch.testing.assert_close(layer.W.grad, mask.T @ x)
    torch.testing.assert_close(layer.b.grad, mask.sum(0))


def test_inputs_are_not_copied(monkeypatch):
    import tclang.runtime.kernels as runtime
    f = tct.function(MLP, "mlp")
    x = torch.randn(4, 5, dtype=torch.float64)
    w = torch.randn(3, 5, dtype=torch.float64)
    b = torch.zeros(3, dtype=torch.float64)
    seen = []
    real = runtime.bind_arguments

    def spy(defn, args, device=False):
        binding = real(defn, args, device)
        seen.append([a.__array_interface__["data"][0] for a in binding.arrays])
        return binding
    monkeypatch.setattr(runtime, "bind_arguments", spy)
    with torch.no_grad():
        f(x, w, b)
    assert seen and seen[0][:3] == [x.data_ptr(), w.data_ptr(), b.data_ptr()]


def test_torch_compile_keeps_the_kernel_as_one_operator_with_its_gradient():
    f = tct.function(MLP, "mlp")

    def model(x, w, b):
        return (f(x, w, b) * 2).sum()
    torch.manual_seed(1)
    x = torch.randn(5, 7, dtype=torch.float64)
    w = torch.randn(3, 7, dtype=torch.float64, requires_grad=True)
    b = torch.randn(3, dtype=torch.float64, requires_grad=True)
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)  # no graph break
    loss = compiled(x, w, b)
    loss.backward()
    got = (w.grad.clone(), b.grad.clone())
    w.grad = b.grad = None
    expected = model(x, w, b)
    expected.backward()
    torch.testing.assert_close(loss, expected)
    torch.testing.assert_close(got, (w.grad, b.grad))


def test_torch_compile_takes_a_definition_without_a_gradient():
    f = tct.function("def count(float(N) X) -> (C) { C(i) = int32(X(i) > 0) }", "count")
    x = torch.tensor([-1.0, 2.0, 3.0])
    out = torch.compile(lambda t: f(t) + 1, backend="aot_eager", fullgraph=True)(x)
    assert out.tolist() == [1, 2, 2]


# ---- double backward: the backward is a differentiable tclang function ---------------------

SECOND_ORDER = {
    "cube": ("def cube(double(N) X) -> (Y) { Y(i) = X(i) * X(i) * X(i) }", [(4,)]),
    "matmul": ("def mm(double(M,K) A, double(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }",
               [(3, 4), (4, 2)]),
    "mlp_relu": (MLP, [(3, 4), (2, 4), (2,)]),
    "mlp_tanh": (MLP.replace("fmax(Y(n, o) + b(o), 0)", "tanh(Y(n, o) + b(o))"),
                 [(3, 4), (2, 4), (2,)]),
    "sum_of_squares": ("def sumsq(double(N,M) X) -> (S) { S(n) +=! X(n, m) * X(n, m) }",
                       [(3, 4)]),
    "softmax": ("""def softmax(double(N,D) I) -> (O) {
        mx(n) max=! I(n, d)
        s(n) +=! exp(I(n, d) - mx(n))
        O(n, d) = exp(I(n, d) - mx(n)) / s(n)
    }""", [(3, 5)]),
}


def _entry(source: str) -> str:
    return source.split("(")[0].split()[-1]


@pytest.mark.parametrize("name", sorted(SECOND_ORDER))
def test_gradgradcheck(name):
    """create_graph=True records the backward (itself a tclang Function of the backward
    definition), so the second derivative is right: it was silently missing (the
    gradient came back without a graph, so its own gradient was 0 or an error)."""
    source, shapes = SECOND_ORDER[name]
    f = tct.function(source, _entry(source))
    torch.manual_seed(5)
    inputs = tuple(torch.randn(s, dtype=torch.float64, requires_grad=True) for s in shapes)
    if name == "mlp_relu":  # no pre-activation at relu's kink, where differences jump
        inputs[2].data += 0.05 * torch.sign(inputs[0].detach() @ inputs[1].detach().T
                                            + inputs[2].detach()).mean(0)
    assert torch.autograd.gradcheck(f, inputs, eps=1e-6, atol=1e-5, rtol=1e-4)
    assert torch.autograd.gradgradcheck(f, inputs, eps=1e-6, atol=1e-5, rtol=1e-4)


def test_the_second_and_third_derivatives_of_x_cubed():
    f = tct.function(SECOND_ORDER["cube"][0], "cube")
    x = torch.tensor([1.0, -2.0, 3.0], dtype=torch.float64, requires_grad=True)
    g, = torch.autograd.grad(f(x).sum(), x, create_graph=True)
    gg, = torch.autograd.grad(g.sum(), x, create_graph=True)
    ggg, = torch.autograd.grad(gg.sum(), x)
    torch.testing.assert_close(g, 3 * x.detach() ** 2)
    torch.testing.assert_close(gg, 6 * x.detach())
    torch.testing.assert_close(ggg, torch.full_like(x, 6.0))
    g, = torch.autograd.grad(f(x).sum(), x)  # without create_graph: nothing recorded
    assert not g.requires_grad
    # x * x^3: the second derivative was silently 3x^2 (f's part of it missing), not 12x^2
    g, = torch.autograd.grad((f(x) * x).sum(), x, create_graph=True)
    gg, = torch.autograd.grad(g.sum(), x)
    torch.testing.assert_close(gg, 12 * x.detach() ** 2)


@pytest.mark.slow  # ~60 s: the third-order definitions are long, and compiled fresh
def test_third_order_through_saved_values_matches_pytorch():
    """softmax's backward reads saved values (the row maximum and sum), which depend on
    the input: their gradients arrive in a double backward and go through the gradient of
    the training forward (gradgradcheck[softmax] checks the second order). Checked against
    torch.softmax to the third derivative."""
    source = SECOND_ORDER["softmax"][0]
    f = tct.function(source, "softmax")
    torch.manual_seed(2)
    x = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    w = torch.randn(3, 4, dtype=torch.float64)

    def derivatives(fun):
        g, = torch.autograd.grad((fun(x) * w).sum(), x, create_graph=True)
        gg, = torch.autograd.grad((g * w).sum(), x, create_graph=True)
        ggg, = torch.autograd.grad((gg * w).sum(), x)
        return g, gg, ggg
    torch.testing.assert_close(derivatives(f), derivatives(lambda t: torch.softmax(t, 1)))


def test_a_module_trains_with_a_gradient_penalty():
    """A double backward through a layer's parameters, against its PyTorch twin."""
    source = SECOND_ORDER["mlp_tanh"][0]
    torch.manual_seed(4)
    W, b = torch.randn(2, 4, dtype=torch.float64), torch.randn(2, dtype=torch.float64)
    layer = tct.Module(source, "mlp", W=W.clone(), b=b.clone())
    W.requires_grad_(), b.requires_grad_()
    x = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)

    def penalty(fun, params):
        gx, = torch.autograd.grad(fun(x).sum(), x, create_graph=True)
        return torch.autograd.grad(gx.square().sum(), params)
    got = penalty(layer, (layer.W, layer.b))
    expected = penalty(lambda t: torch.tanh(t @ W.T + b), (W, b))
    torch.testing.assert_close(got, expected)


def test_a_backward_that_tc_grad_refuses_raises_at_double_backward_time():
    """fmod's backward uses trunc, which tc.grad will not differentiate: the first
    derivative with create_graph=True works, differentiating it raises the refusal (never
    a silent zero), as PyTorch's once_differentiable functions do."""
    f = tct.function("def fm(double(N) X, double(N) P) -> (Y) { Y(i) = fmod(X(i), P(i)) }",
                     "fm")
    x = torch.tensor([5.5, 7.25], dtype=torch.float64, requires_grad=True)
    p = torch.tensor([2.0, 3.0], dtype=torch.float64, requires_grad=True)
    dx, dp = torch.autograd.grad(f(x, p).sum(), (x, p), create_graph=True)
    torch.testing.assert_close(dp.detach(), -torch.trunc(x.detach() / p.detach()))
    with pytest.raises(tc.TCGradError, match=r"the backward of fm \(fm_grad.*trunc") as info:
        torch.autograd.grad(dp.sum(), p)
    assert "^" in str(info.value) and "create_graph" in info.value.hint


def test_double_backward_under_torch_compile_is_refused_clearly():
    """torch.compile runs the backward as the registered custom operator: PyTorch's
    AOTAutograd refuses a double backward, and the operator used eagerly says what works."""
    f = tct.function(SECOND_ORDER["cube"][0], "cube")
    x = torch.tensor([1.0, 2.0], dtype=torch.float64, requires_grad=True)
    g, = torch.autograd.grad(f.custom_op()(x).sum(), x, create_graph=True)
    torch.testing.assert_close(g.detach(), 3 * x.detach() ** 2)
    with pytest.raises(tc.TCGradError, match="runs eagerly"):
        torch.autograd.grad(g.sum(), x)
    compiled = torch.compile(lambda t: f(t).sum(), backend="aot_eager", fullgraph=True)
    g, = torch.autograd.grad(compiled(x), x, create_graph=True)
    torch.testing.assert_close(g.detach(), 3 * x.detach() ** 2)
    with pytest.raises(RuntimeError, match="double backward"):
        torch.autograd.grad(g.sum(), x)


NO_SECOND_DERIVATIVE = {
    "conv2d_stride2": "does not check",  # a strided window's backward: a range bound the
    "maxpool": "does not check",         # language cannot state (docs/autodiff.md)
    "builtins_binary": "trunc",          # fmod's backward uses trunc
}


@pytest.mark.slow  # ~4 minutes: every corpus program's second-order kernels, compiled fresh
@pytest.mark.parametrize("case", DIFFERENTIABLE, ids=lambda c: c.name)
def test_gradgradcheck_on_the_corpus(case):
    """Every differentiable corpus program has a right second derivative, or a refusal
    raised at double-backward time (never a wrong or silently zero one)."""
    f = tct.function(_float64_case(case), case.entry)
    arrays = case.make_inputs(case.shapes[0], np.random.default_rng(3))
    inputs = []
    for a in arrays:
        a = np.asarray(a)
        t = torch.from_numpy(np.array(a, np.float64 if a.dtype.kind == "f" else a.dtype))
        inputs.append(t.requires_grad_() if t.is_floating_point() else t)
    try:
        f.kernel(*[t.detach() for t in inputs])
    except tc.TCIndexError:
        pytest.skip("its first shape's random gathers fall outside the table")
    if case.name in NO_SECOND_DERIVATIVE:
        with pytest.raises(tc.TCGradError, match=NO_SECOND_DERIVATIVE[case.name]):
            torch.autograd.gradgradcheck(f, tuple(inputs), eps=1e-6, atol=1e-5, rtol=1e-4,
                                         fast_mode=True)
        return
    assert torch.autograd.gradgradcheck(f, tuple(inputs), eps=1e-6, atol=1e-5, rtol=1e-4,
                                        fast_mode=True)


def test_a_double_backward_whose_first_derivative_is_constant_is_zero():
    """`O0 = (alpha > 0) ? beta : 1.5 * beta`: dO0/dalpha is 0 wherever it exists, so the
    backward's outputs depend on none of its float inputs and tc.grad of it refuses with
    "no output ... depends on" (TCZeroGradientError). Through tclang.torch with
    create_graph=True that refusal came out of gradgradcheck as an error (fuzz seed 2030,
    program 672); the second derivative is the zero autograd gives constants."""
    pytest.importorskip("torch")
    from tclang.fuzzing import gradients
    from tclang.fuzzing.generator import GeneratedProgram
    source = ("def fuzz(float64 alpha, int8 beta) -> (O0) {\n"
              "    O0 = ((!(beta > 0) || (alpha() > 0.0)) ? double(beta) : "
              "((!(beta() != 0) || false) ? double(beta()) : (float(beta()) * 1.5)))\n}\n")
    assert gradients.check_torch(GeneratedProgram(source, "fuzz", {}), "gradgradcheck")[0] == []


def test_a_double_backward_through_a_value_read_only_in_a_condition():
    """T is computed through int32(...) (no derivative: tc.grad refuses it) and read by
    the backward only in a condition, so its gradient is zero by construction. That zero
    came back from the backward as a tensor, so the double backward asked for the
    gradient of the training forward with T as an output, and tc.grad refused T's
    statement: gradgradcheck crashed (fuzz seed 2040, program 1593). A gradient zero by
    construction is now None, autograd's zero."""
    source = ("def f(double(N) A, double(N) B) -> (O) {\n"
              "    T(i) = double(int32(B(i) * 4.0))\n"
              "    O(i) = (T(i) > 0.0) ? A(i) * A(i) * B(i) : A(i) * B(i)\n}")
    f = tct.function(source, "f")
    torch.manual_seed(3)
    inputs = tuple(torch.randn(7, dtype=torch.float64, requires_grad=True) for _ in range(2))
    assert torch.autograd.gradcheck(f, inputs, eps=1e-6, atol=1e-5, rtol=1e-4)
    assert torch.autograd.gradgradcheck(f, inputs, eps=1e-6, atol=1e-5, rtol=1e-4)
