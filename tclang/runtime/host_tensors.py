"""PyTorch CPU tensors as arguments: viewed without a copy on the way in, and results of
the same kind on the way out.

A call whose inputs include a CPU `torch.Tensor` returns tensors: each NumPy result
wrapped by `torch.from_numpy`, which shares its memory (no copy). `out=` takes CPU
tensors (written in place through a NumPy view of their memory, strided ones included)
and the call returns those same tensor objects, their version counters bumped as
PyTorch's in-place operations bump them (modified_in_place). A tensor that requires grad
is refused with what to do: a kernel call records no gradient. (GPU tensors go to backend='cuda',
which returns tensors on their device; docs/language.md.) torch is never imported here
unless the caller passed a tensor.
"""

from __future__ import annotations

import numpy as np

from tclang.bfloat16 import NUMPY_HAS_BFLOAT16, STORAGE as BF16_STORAGE
from tclang.errors import TCArgumentError


def is_host_tensor(value) -> bool:
    """A torch.Tensor (or subclass, such as a Parameter) in CPU memory."""
    if not type(value).__module__.startswith("torch"):
        return False
    device = getattr(value, "device", None)
    return getattr(device, "type", None) == "cpu" and hasattr(value, "data_ptr")


def refuse_grad(tensor, what: str, name: str) -> None:
    """A tensor that requires grad, on any device, is refused: a kernel call records no
    gradient (and PyTorch will not hand out its memory)."""
    if type(tensor).__module__.startswith("torch") and getattr(tensor, "requires_grad", False):
        raise TCArgumentError(f"{what} is a tensor that requires grad: a kernel call records "
                              "no gradient", hint=f"pass {name}.detach() to compute "
                                                  "without one")


def host_view(tensor, what: str, name: str) -> np.ndarray:
    """The tensor's memory as a NumPy array (no copy); `what` and `name` say which
    argument it is in errors."""
    refuse_grad(tensor, what, name)
    try:
        if str(tensor.dtype) == "torch.bfloat16":  # NumPy has none: its bits, as tclang's
            import torch
            return tensor.view(torch.int16).numpy().view(BF16_STORAGE)
        return tensor.numpy()
    except (TypeError, RuntimeError) as err:  # a dtype NumPy lacks (bfloat16), a conjugate
        raise TCArgumentError(f"{what} is a tensor NumPy cannot view ({err})",
                              hint="convert it to a float32, float64, float16, bfloat16 or "
                                   "integer tensor") from None


def as_torch(array: np.ndarray):
    """A NumPy result as a torch tensor sharing its memory (bfloat16 ones included)."""
    import torch
    if array.dtype == BF16_STORAGE:
        return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(array)


def modified_in_place(out) -> None:
    """Tell autograd that a kernel wrote the out= tensors (CPU or CUDA) in place, as
    PyTorch's own in-place operations do: bump their version counters, which views and
    `.detach()` share with the tensor they come from. A tensor autograd saved for a
    backward (tanh's result, say) and then overwritten through `out=h.detach()` makes that
    backward raise "modified by an inplace operation" instead of using the new values.
    The bump is O(1) per tensor (a counter, not a pass over memory); torch is imported only
    when an out= is a tensor, so it already is."""
    outs = out if isinstance(out, (tuple, list)) else (out,)
    for o in outs:
        if type(o).__module__.startswith("torch"):
            break
    else:  # (no generator: this runs on every checked call with out=)
        return
    import torch
    from torch.autograd.graph import increment_version
    # (an inference-mode tensor has no counter: increment_version skips it)
    increment_version([o for o in outs if isinstance(o, torch.Tensor)])


def refuse_numpy_bfloat16(defn, args: tuple, out) -> None:
    """A bfloat16 output a NumPy caller would get, where NumPy has no bfloat16 (ml_dtypes
    is not installed), is refused before anything runs: tclang's private storage dtype
    must not escape. Torch callers (an input or out= is a tensor) get torch.bfloat16."""
    if NUMPY_HAS_BFLOAT16 or out is not None or \
            not any(t.dtype.value == "bfloat16" for t in defn.outputs):
        return
    if any(type(a).__module__.startswith("torch") for a in args):
        return
    names = ", ".join(t.name for t in defn.outputs if t.dtype.value == "bfloat16")
    raise TCArgumentError(f"{defn.name} returns bfloat16 ({names}), which NumPy has no type "
                          "for", hint="pass torch tensors (the results are then torch "
                                      "tensors of torch.bfloat16), pass out= tensors, or "
                                      "install ml_dtypes (pip install tclang[bf16]) for "
                                      "NumPy arrays of ml_dtypes.bfloat16")


def like_the_caller(result, args: tuple, out):
    """`result` as the caller's kind: the out= tensors themselves, or tensors sharing the
    NumPy results' memory when an input was a CPU tensor; else unchanged."""
    if out is not None:
        outs = tuple(out) if isinstance(out, (tuple, list)) else (out,)
        if any(is_host_tensor(o) for o in outs):
            return outs[0] if len(outs) == 1 else outs
        return result
    if not any(is_host_tensor(a) for a in args):
        return result
    if isinstance(result, tuple):
        return tuple(as_torch(r) for r in result)
    return as_torch(result)
