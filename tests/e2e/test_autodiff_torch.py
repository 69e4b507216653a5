"""tclang.torch: gradcheck over the corpus, layers with parameters, and no copies on the
way in. Skipped without PyTorch (an optional extra)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import tclang as tc  # noqa: E402
import tclang.torch as tct  # noqa: E402
from tests.corpus import CASES  # noqa: E402
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
            a = np.asarray(a)
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
    import tclang.runtime as runtime
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
