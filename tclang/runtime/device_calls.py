"""The hot path of calls on PyTorch CUDA tensors.

A GPU kernel is worth calling on small work only if the call costs little more than a
PyTorch operator's (~10 µs). The full checks of a call (dtypes, ranks, sizes that agree,
obligations, out= shapes) depend only on the tensors' dtypes, shapes, strides and devices,
so a call whose tensors match one checked in full before skips them: it wraps the tensors
(pointers change from call to call) and runs. Two things do depend on the pointers and are
checked on every call: that no out= tensor overlaps an input or another out=, and that no
tensor needs a gradient (tclang kernels have none to give). Anything else (CuPy arrays, a
list, a CPU tensor in the mix) takes the checked path.
"""

from __future__ import annotations

from tclang.runtime.arguments import Binding, DeviceArray
from tclang.recent import Recent, max_variants


class DeviceHotCalls:
    def __init__(self):
        self._entries = Recent(max_variants())

    def look_up(self, args, out) -> "DeviceHotCall | None":
        """The call's key and, if seen before, its entry; None: not a call this path takes."""
        key = _key(args)
        if key is None:
            return None
        outs = None
        if out is not None:
            outs = out if type(out) is tuple else (out,)
            out_key = _key(outs)
            if out_key is None or _overlap(args, outs):
                return None
            key = (key, out_key)
        return DeviceHotCall(key, args, outs, self._entries.get(key))

    def remember(self, call: "DeviceHotCall", binding: Binding, compiled) -> None:
        """After a call checked in full whose arguments were bound as they are."""
        if all(isinstance(a, DeviceArray) and a.obj is given
               for a, given in zip(binding.arrays, call.args)):
            self._entries.put(call.key, (compiled, dict(binding.sizes)))


class DeviceHotCall:
    __slots__ = ("key", "args", "outs", "entry")

    def __init__(self, key, args, outs, entry):
        self.key, self.args, self.outs, self.entry = key, args, outs, entry

    def run(self):
        compiled, sizes = self.entry
        binding = Binding(tuple(DeviceArray(a) for a in self.args), sizes)
        given = tuple(DeviceArray(o) for o in self.outs) if self.outs is not None else None
        return compiled.run(binding, given=given, checked=True)


def _key(tensors) -> tuple | None:
    """Each tensor's dtype, shape, strides and device, if all are PyTorch CUDA tensors that
    need no gradient."""
    key = []
    for t in tensors:
        if type(t).__module__ != "torch" or not getattr(t, "is_cuda", False) or \
                t.requires_grad:
            return None
        key.append((t.dtype, tuple(t.shape), t.stride(), t.device.index))
    return tuple(key)


def _overlap(args, outs) -> bool:
    """Whether an out= tensor's memory meets an input's or another out='s (a maybe
    counts: the checked path then decides)."""
    spans = [_span(t) for t in args] + [_span(o) for o in outs]
    n_in = len(args)
    for k in range(n_in, len(spans)):
        lo, hi = spans[k]
        for j, (a, b) in enumerate(spans):
            if j != k and lo < b and a < hi and hi > lo and b > a:
                return True
    return False


def _span(t) -> tuple[int, int]:
    """[first byte, last byte + 1) of a tensor's elements (empty for no elements)."""
    start = t.data_ptr()
    if t.is_contiguous():  # (the common case, without a loop in Python)
        return start, start + t.numel() * t.element_size()
    if t.numel() == 0:
        return start, start
    low = high = 0
    for extent, stride in zip(t.shape, t.stride()):
        if stride >= 0:
            high += (extent - 1) * stride
        else:
            low += (extent - 1) * stride
    size = t.element_size()
    return start + low * size, start + (high + 1) * size
