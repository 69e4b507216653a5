"""PyTorch CPU tensors in and out: no copy on the way in (the kernel reads the tensor's own
memory), tensors sharing the results' memory on the way out, out= tensors written in place
and returned, tensors that require grad refused with what to do. Skipped without torch."""

from __future__ import annotations

import numpy as np
import pytest

import tclang as tc
from tclang.runtime.arguments import as_array

torch = pytest.importorskip("torch")

MM = "def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }"
MOMENTS = ("def moments(float(N, K) I) -> (mean, var) {\n"
           "  mean(n) +=! I(n, k) / float(K)\n"
           "  var(n) +=! (I(n, k) - mean(n)) * (I(n, k) - mean(n)) / float(K)\n}\n")


@pytest.mark.parametrize("shape", [(1, 1, 1), (7, 13, 5), (11, 3, 2)])
def test_tensors_in_tensors_out(shape):
    m, k, n = shape
    a, b = torch.randn(m, k), torch.randn(k, n)
    c = tc.define(MM).mm(a, b)
    assert isinstance(c, torch.Tensor) and c.dtype == torch.float32 and c.device.type == "cpu"
    torch.testing.assert_close(c, a @ b, rtol=1e-5, atol=1e-5)


def test_no_copy_on_the_way_in_or_out():
    a = torch.randn(5, 4)
    assert as_array(a, "A", 1).ctypes.data == a.data_ptr()  # the kernel reads a's memory
    view = torch.randn(4, 5).t()  # strided: read as it is, still no copy
    assert as_array(view, "A", 1).ctypes.data == view.data_ptr()


def test_out_tensors_are_written_in_place_and_returned():
    a, b = torch.randn(6, 4), torch.randn(4, 3)
    out = torch.full((6, 3), float("nan"))
    returned = tc.define(MM).mm(a, b, out=out)
    assert returned is out
    torch.testing.assert_close(out, a @ b, rtol=1e-5, atol=1e-5)
    strided = torch.empty(3, 6).t()
    assert tc.define(MM).mm(a, b, out=strided) is strided
    torch.testing.assert_close(strided, a @ b, rtol=1e-5, atol=1e-5)


def test_several_outputs_and_mixed_arguments():
    x = torch.randn(7, 11, dtype=torch.float32)
    mean, var = tc.define(MOMENTS).moments(x)
    assert isinstance(mean, torch.Tensor) and isinstance(var, torch.Tensor)
    torch.testing.assert_close(mean, x.mean(1), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(var, x.var(1, unbiased=False), rtol=1e-4, atol=1e-5)
    c = tc.define(MM).mm(np.ones((2, 3), np.float32), torch.ones(3, 4))  # one tensor: tensors
    assert isinstance(c, torch.Tensor)
    assert isinstance(tc.define(MM).mm(np.ones((2, 3), np.float32), np.ones((3, 4), np.float32)),
                      np.ndarray)


def test_tensors_that_require_grad_are_refused_with_what_to_do():
    a = torch.randn(2, 3, requires_grad=True)
    with pytest.raises(tc.TCArgumentError, match="requires grad") as raised:
        tc.define(MM).mm(a, torch.randn(3, 2))
    assert "A.detach()" in raised.value.hint
    with pytest.raises(tc.TCArgumentError, match=r"out\[0\] \(C\).*requires grad"):
        tc.define(MM).mm(torch.randn(2, 3), torch.randn(3, 2),
                         out=torch.empty(2, 2, requires_grad=True))


def test_wrong_dtypes_and_unviewable_tensors_are_argument_errors():
    with pytest.raises(tc.TCArgumentError, match="must be float32, but it is float64"):
        tc.define(MM).mm(torch.randn(2, 3, dtype=torch.float64), torch.randn(3, 2))
    with pytest.raises(tc.TCArgumentError, match="must be float32, but it is bfloat16"):
        tc.define(MM).mm(torch.randn(2, 3).bfloat16(), torch.randn(3, 2))
    with pytest.raises(tc.TCArgumentError, match="NumPy cannot view"):
        tc.define(MM).mm(torch.randn(2, 3, dtype=torch.complex64).conj(), torch.randn(3, 2))


TANH_LIKE = "def plus(float(N) X) -> (Y) { Y(i) = X(i) + 1.0 }"
GATHER = "def pick(float(E) T, int32(N) Ids) -> (O) { O(i) = T(Ids(i)) }"


def test_out_into_a_tensor_autograd_saved_makes_its_backward_raise():
    """tanh saves its result for the backward; writing it through out=h.detach() (which
    shares h's memory and version counter) must bump the counter as PyTorch's in-place
    ops do, so the backward raises instead of using the new values (it used them)."""
    kernel = tc.define(TANH_LIKE).plus
    x = torch.randn(5, requires_grad=True)
    h = torch.tanh(x)
    kernel(x.detach(), out=h.detach())
    assert h._version == 1
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        h.sum().backward()
    # the same through a CompiledKernel, and through a strided out= (written by a copy)
    h = torch.tanh(x)
    kernel.compile(x.detach())(x.detach(), out=h.detach())
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        h.sum().backward()
    wide = torch.randn(10, requires_grad=True)
    h = torch.tanh(wide)
    kernel(x.detach(), out=h.detach()[::2])  # a view shares the counter too
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        h.sum().backward()


def test_out_tensors_nobody_saved_still_work_and_each_call_counts():
    kernel = tc.define(MOMENTS).moments
    x = torch.randn(4, 6)
    mean, var = torch.empty(4), torch.empty(4)
    for k in range(1, 3):
        assert kernel(x, out=(mean, var)) == (mean, var)
        assert mean._version == var._version == k
    torch.testing.assert_close(mean, x.mean(1))
    with torch.inference_mode():  # no version counter: nothing to bump, no error
        y, out = torch.randn(3), torch.empty(3)
        tc.define(TANH_LIKE).plus(y, out=out)
    torch.testing.assert_close(out, y + 1)
    w = torch.randn(3, requires_grad=True)
    loss = (w * 2).sum()  # a graph that saved nothing tclang wrote
    tc.define(TANH_LIKE).plus(torch.randn(3), out=torch.empty(3))
    loss.backward()
    torch.testing.assert_close(w.grad, torch.full((3,), 2.0))


def test_a_call_that_fails_part_way_still_counts_as_a_write():
    """A gather out of range stops the kernel after it may have written part of out=."""
    out = torch.zeros(3)
    with pytest.raises(tc.TCIndexError):
        tc.define(GATHER).pick(torch.ones(4), torch.tensor([0, 9, 1], dtype=torch.int32),
                               out=out)
    assert out._version == 1
    wrong = torch.zeros(2)
    with pytest.raises(tc.TCArgumentError):  # refused before running: nothing written
        tc.define(GATHER).pick(torch.ones(4), torch.tensor([0, 1, 1], dtype=torch.int32),
                               out=wrong)
    assert wrong._version == 0
