"""Call-time argument checks: everything about the arguments is checked before any kernel
runs, and every problem is a `TCArgumentError` saying what was expected and what was found.

Arrays are taken without copying from anything NumPy understands (`__array_interface__`,
`__array__`, DLPack); dtypes must match the declaration exactly; sizes named the same must
agree; the definition's obligations (an output extent that must not be negative, a
declared output shape) must hold for the bound sizes.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import numpy as np

from tclang.lang import program as P
from tclang.bfloat16 import NUMPY_HAS_BFLOAT16, STORAGE as BF16_STORAGE, dtype_key
from tclang.dtypes import DType, from_numpy
from tclang.errors import TCArgumentError
from tclang.runtime.host_tensors import host_view, is_host_tensor, refuse_grad
from tclang.layouts import layout_key, partial_layout_key


class DeviceArray:
    """A GPU array seen through `__cuda_array_interface__`: shape, dtype, strides and the
    device pointer, without copying (PyTorch, CuPy, PyCUDA GPUArray, ...). A PyTorch
    tensor is read through its own accessors: its interface builds a dictionary and
    checks gradients on every call, a good part of a small kernel's launch."""

    def __init__(self, obj):
        if type(obj).__module__.startswith("torch"):
            self.shape = tuple(obj.shape)
            self.dtype = _torch_numpy_dtype(obj.dtype)
            strides = tuple(s * self.dtype.itemsize for s in obj.stride())
            self.device_pointer = obj.data_ptr()
            self.readonly = False
        else:
            interface = obj.__cuda_array_interface__
            self.shape = tuple(int(x) for x in interface["shape"])
            self.dtype = np.dtype(interface["typestr"])
            self.device_pointer = int(interface["data"][0] or 0)
            self.readonly = bool(interface["data"][1])
            strides = interface.get("strides")
        self.obj = obj
        self.itemsize = self.dtype.itemsize
        self.ndim = len(self.shape)
        size = 1
        for extent in self.shape:
            size *= extent
        self.size = size
        self.nbytes = size * self.itemsize
        contiguous = _contiguous_strides(self.shape, self.itemsize)
        self.strides = tuple(int(x) for x in strides) if strides is not None else contiguous
        self.c_contiguous = self.strides == contiguous


_TORCH_DTYPES: dict = {}


def _torch_numpy_dtype(dtype) -> np.dtype:
    """The NumPy dtype of a torch dtype (bfloat16: tclang's bfloat16 storage; others
    NumPy lacks are refused)."""
    found = _TORCH_DTYPES.get(dtype)
    if found is None:
        import torch
        if dtype == torch.bfloat16:
            _TORCH_DTYPES[dtype] = BF16_STORAGE
            return BF16_STORAGE
        try:
            found = np.dtype(torch.empty(0, dtype=dtype).numpy().dtype)
        except (TypeError, RuntimeError):
            raise TCArgumentError(f"a torch tensor of {dtype} has no NumPy dtype",
                                  hint="convert it, e.g. tensor.float()") from None
        _TORCH_DTYPES[dtype] = found
    return found


def _contiguous_strides(shape, itemsize: int) -> tuple[int, ...]:
    strides, step = [], itemsize
    for extent in reversed(shape):
        strides.append(step)
        step *= max(extent, 1)
    return tuple(reversed(strides))


@dataclass(frozen=True)
class Binding:
    """The checked arguments of one call: arrays in parameter order and the size values."""

    arrays: tuple[np.ndarray, ...]
    sizes: dict[str, int]

    def shape_key(self) -> tuple:
        """Shapes, dtypes and layout keys (tclang/layouts.py): what a specialized kernel
        depends on."""
        return tuple((a.shape, dtype_key(a.dtype), layout_key(a.shape, _element_strides(a)))
                     for a in self.arrays)

    def partial_key(self, fixed: tuple[tuple[bool, ...], ...]) -> tuple:
        """What a kernel generic in some sizes depends on (Options(specialize="auto")):
        `fixed` says, per input and dimension, whether its extent is a constant of the
        code. The shapes with None for each generic extent, dtypes, and layout keys
        (tclang/layouts.py, partial_layout_key)."""
        return tuple((tuple(n if f else None for n, f in zip(a.shape, dims)), dtype_key(a.dtype),
                      partial_layout_key(a.shape, _element_strides(a), dims))
                     for a, dims in zip(self.arrays, fixed))


def _element_strides(a: np.ndarray) -> tuple[int, ...]:
    return tuple(s // a.itemsize for s in a.strides) if a.itemsize else a.strides


def as_array(value, name: str, position: int, scalar_dtype=None, device: bool = False):
    """An argument as a NumPy array (or, for the GPU backend, a DeviceArray), without
    copying when it already is one."""
    if _is_masked(value):
        raise _masked(f"argument {position} ({name})")
    if isinstance(value, np.ndarray):
        array = value.view(np.ndarray) if type(value) is not np.ndarray else value
    elif isinstance(value, (bool, int, float)) and scalar_dtype is not None:
        array = _python_scalar(value, scalar_dtype, name, position)
    elif is_host_tensor(value):  # PyTorch on the CPU: its memory, not a copy
        array = host_view(value, f"argument {position} ({name})", name)
    elif type(value).__module__.startswith("torch") and getattr(value, "is_cuda", False):
        refuse_grad(value, f"argument {position} ({name})", name)
        if device:
            return DeviceArray(value)
        raise _on_gpu(position, name)
    elif hasattr(value, "__cuda_array_interface__"):
        if device:
            return DeviceArray(value)
        raise _on_gpu(position, name)
    else:
        try:
            array = np.from_dlpack(value) if hasattr(value, "__dlpack__") and \
                not hasattr(value, "__array_interface__") else np.asarray(value)
        except Exception as err:  # anything NumPy cannot view is the caller's error
            raise TCArgumentError(f"argument {position} ({name}) is a {type(value).__name__}, "
                                  f"which is not an array ({err})",
                                  hint="pass a NumPy array or an object with "
                                       "__array_interface__ or __dlpack__") from None
    if array.dtype.kind in "OUSVMm" and from_numpy(array.dtype) is None:
        what = type(value).__name__ if array.ndim == 0 else f"array of {array.dtype.name}"
        raise TCArgumentError(f"argument {position} ({name}) is a {what}, not an array of "
                              "numbers", hint="pass a numeric NumPy array")
    if any(s % array.itemsize for s in array.strides if array.itemsize):
        array = np.ascontiguousarray(array)  # strides that are not whole elements
    if not array.dtype.isnative:
        array = array.astype(array.dtype.newbyteorder("="))  # kernels read native order
    return array


def _on_gpu(position: int, name: str) -> TCArgumentError:
    return TCArgumentError(f"argument {position} ({name}) lives on a GPU; this backend needs "
                           "host memory", hint="copy it to the host, or define the kernel with "
                                               "backend='cuda'")


def _masked(what: str) -> TCArgumentError:
    """A masked array's mask would be silently ignored: kernels see only its data."""
    return TCArgumentError(f"{what} is a masked array; tclang kernels would ignore its mask",
                           hint="pass a.filled(value) (or a.data if the mask does not "
                                "matter)")


def _is_masked(value) -> bool:
    """Whether `value` is a NumPy masked array. Asked without touching `np.ma`, whose first
    use imports numpy.ma (~8 ms of a cold call): if nothing imported it, no argument can
    be one."""
    masked = sys.modules.get("numpy.ma")
    return masked is not None and isinstance(value, masked.MaskedArray)


def float_fits(value: float, array: np.ndarray) -> bool:
    """Whether a finite Python float stayed finite in the declared float type."""
    return not np.isfinite(value) or bool(np.isfinite(array))


def _python_scalar(value, dtype: np.dtype, name: str, position: int) -> np.ndarray:
    """A Python number for a 0-d input: it has no dtype of its own, so it takes the
    declared one, provided that loses nothing."""
    if isinstance(value, float) and dtype.kind in "iub":
        raise TCArgumentError(f"argument {position} ({name}) must be {dtype.name}, but a float "
                              f"({value!r}) was given")
    if dtype.kind == "f":
        with np.errstate(over="ignore"):
            array = np.array(value, dtype=dtype)
        if not float_fits(value, array):
            raise TCArgumentError(f"argument {position} ({name}) must be {dtype.name}, and "
                                  f"{value!r} does not fit (it would become {array})")
        return array
    array = np.array(value, dtype=dtype) if not isinstance(value, int) else None
    if array is None:
        info = np.iinfo(dtype) if dtype.kind in "iu" else None
        if info is not None and not info.min <= value <= info.max:
            raise TCArgumentError(f"argument {position} ({name}) must be {dtype.name}, and "
                                  f"{value} does not fit")
        array = np.array(value, dtype=dtype)
    return array


def bind_arguments(defn: P.Definition, args: tuple, device: bool = False) -> Binding:
    """Check `args` against the inputs of `defn` and bind every size name. With
    `device`, arrays on the GPU are accepted as they are."""
    inputs = defn.inputs
    if len(args) != len(inputs):
        expected = ", ".join(t.name for t in inputs)
        raise TCArgumentError(f"{defn.name} takes {len(inputs)} argument"
                              f"{'s' if len(inputs) != 1 else ''} ({expected}), "
                              f"but {len(args)} {'was' if len(args) == 1 else 'were'} given")
    sizes: dict[str, int] = {}
    where: dict[str, str] = {}
    arrays = []
    for position, (tensor, value) in enumerate(zip(inputs, args), start=1):
        array = as_array(value, tensor.name, position,
                         tensor.dtype.numpy if tensor.rank == 0 else None, device)
        _check_dtype(defn, tensor, array, position)
        _check_rank(defn, tensor, array, position)
        for dim, (extent, actual) in enumerate(zip(tensor.shape, array.shape)):
            _bind_dim(defn, tensor, dim, extent, actual, sizes, where, position)
        arrays.append(array)
    for ob in defn.obligations:
        if not ob.holds(sizes):
            raise TCArgumentError(f"{ob.message} (with {_show_sizes(sizes)})", ob.span,
                                  defn.source, hint="check the shapes of the arguments")
    return Binding(tuple(arrays), sizes)


def _check_dtype(defn, tensor: P.Tensor, array: np.ndarray, position: int) -> None:
    found = from_numpy(array.dtype)
    if found is not tensor.dtype or not array.dtype.isnative:  # GPU arrays are not swapped
        shown = dtype_name(array.dtype) if array.dtype.isnative else array.dtype.str
        convert = f"{tensor.name}.astype(np.{tensor.dtype.value})"
        if tensor.dtype is DType.BFLOAT16:
            convert = f"{tensor.name}.bfloat16() (a torch tensor) or {tensor.name}.astype(" \
                      "ml_dtypes.bfloat16)"
        raise TCArgumentError(
            f"argument {position} ({tensor.name}) of {defn.name} must be "
            f"{tensor.dtype.value}, but it is {shown}",
            hint=f"tclang never converts silently: pass {convert} if that is what you mean")


def dtype_name(dtype: np.dtype) -> str:
    """A NumPy dtype's name in messages (tclang's bfloat16 storage: bfloat16)."""
    return "bfloat16" if from_numpy(dtype) is DType.BFLOAT16 else dtype.name


def _check_rank(defn, tensor: P.Tensor, array: np.ndarray, position: int) -> None:
    if array.ndim != tensor.rank:
        dims = ", ".join(str(d) for d in tensor.shape)
        raise TCArgumentError(
            f"argument {position} ({tensor.name}) of {defn.name} must have {tensor.rank} "
            f"dimension{'s' if tensor.rank != 1 else ''} ({tensor.dtype.value}({dims})), "
            f"but it has shape {array.shape}")


def _bind_dim(defn, tensor: P.Tensor, dim: int, extent, actual: int, sizes: dict,
              where: dict, position: int) -> None:
    if extent.constant is not None:
        if actual != extent.constant:
            raise TCArgumentError(
                f"argument {position} ({tensor.name}) of {defn.name} must have extent "
                f"{extent.constant} in dimension {dim}, but it has {actual}")
        return
    name = str(extent)
    if name not in sizes:
        sizes[name] = int(actual)
        where[name] = f"dimension {dim} of {tensor.name}"
    elif sizes[name] != actual:
        raise TCArgumentError(
            f"size {name} of {defn.name} is {sizes[name]} by {where[name]} but {actual} by "
            f"dimension {dim} of {tensor.name} (argument {position})",
            hint=f"every dimension named {name} must have the same extent")


def _show_sizes(sizes: dict[str, int]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sizes.items()) or "no sizes"


def output_shapes(defn: P.Definition, sizes: dict[str, int]) -> list[tuple[int, ...]]:
    return [P.evaluate_shape(t.shape, sizes) for t in defn.outputs]


def check_out(defn: P.Definition, out, binding: Binding) -> tuple[np.ndarray, ...]:
    """The caller's `out=` arrays: one per output (a tuple for several), each of the right
    shape and dtype, writeable, and sharing no memory with an input."""
    outs = out if isinstance(out, (tuple, list)) else (out,)
    if len(outs) != len(defn.outputs):
        raise TCArgumentError(f"{defn.name} has {len(defn.outputs)} output"
                              f"{'s' if len(defn.outputs) != 1 else ''}, but out= gives "
                              f"{len(outs)}", hint="pass a tuple with one array per output")
    shapes = output_shapes(defn, binding.sizes)
    checked = []
    for k, (tensor, array, shape) in enumerate(zip(defn.outputs, outs, shapes)):
        refuse_grad(array, f"out[{k}] ({tensor.name})", tensor.name)
        if hasattr(array, "__cuda_array_interface__") and \
                any(isinstance(a, DeviceArray) for a in binding.arrays):
            checked.append(_check_device_out(k, tensor, DeviceArray(array), shape, binding))
            continue
        if is_host_tensor(array):  # written in place through a view of its memory
            array = host_view(array, f"out[{k}] ({tensor.name})", tensor.name)
        if not isinstance(array, np.ndarray):
            raise TCArgumentError(f"out[{k}] ({tensor.name}) must be a NumPy array or a CPU "
                                  f"torch tensor, not {type(array).__name__}")
        if _is_masked(array):
            raise _masked(f"out[{k}] ({tensor.name})")
        if array.shape != shape:
            raise TCArgumentError(f"out[{k}] ({tensor.name}) must have shape {shape}, but it "
                                  f"has {array.shape}")
        if from_numpy(array.dtype) is not tensor.dtype:
            raise TCArgumentError(f"out[{k}] ({tensor.name}) must be {tensor.dtype.value}, "
                                  f"but it is {dtype_name(array.dtype)}")
        if not array.dtype.isnative:
            raise TCArgumentError(f"out[{k}] ({tensor.name}) is {array.dtype.str}, not in "
                                  "this machine's byte order: kernels write native numbers",
                                  hint="pass a native array and convert the result with "
                                       ".astype(out.dtype)")
        if not array.flags.writeable:
            raise TCArgumentError(f"out[{k}] ({tensor.name}) is read-only")
        if any(s % array.itemsize for s in array.strides if array.itemsize):
            raise TCArgumentError(f"out[{k}] ({tensor.name}) has strides that are not whole "
                                  "elements")
        if _overlaps_itself(array):
            raise TCArgumentError(f"out[{k}] ({tensor.name}) has overlapping elements "
                                  f"(strides {array.strides} for shape {array.shape}): two "
                                  "output points would share one memory location",
                                  hint="pass an array that owns its memory")
        for position, source in enumerate(binding.arrays, start=1):
            if source.size and array.size and shares_memory(source, array):
                raise TCArgumentError(f"out[{k}] ({tensor.name}) shares memory with argument "
                                      f"{position} ({defn.inputs[position - 1].name})",
                                      hint="inputs are never modified: give out= a separate "
                                           "array")
        for j in range(k):
            if array.size and shares_memory(array, checked[j]):
                raise TCArgumentError(f"out[{k}] and out[{j}] share memory")
        checked.append(array)
    return tuple(checked)


SHARE_WORK = 1 << 16
"""Bound on np.shares_memory's exact search; beyond it, bounds overlap counts as sharing."""


def shares_memory(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether `a` and `b` have an element in common (interleaved views such as base[0::2]
    and base[1::2] do not). When the exact problem is too hard, overlapping bounds count."""
    try:
        return bool(np.shares_memory(a, b, max_work=SHARE_WORK))
    except np.exceptions.TooHardError:
        return bool(np.may_share_memory(a, b))


def _check_device_out(k: int, tensor, array: DeviceArray, shape, binding: Binding):
    if array.shape != shape:
        raise TCArgumentError(f"out[{k}] ({tensor.name}) must have shape {shape}, but it "
                              f"has {array.shape}")
    if from_numpy(array.dtype) is not tensor.dtype or not array.dtype.isnative:
        raise TCArgumentError(f"out[{k}] ({tensor.name}) must be {tensor.dtype.value}, "
                              f"but it is {array.dtype.str}")
    if array.readonly:
        raise TCArgumentError(f"out[{k}] ({tensor.name}) is read-only")
    for position, source in enumerate(binding.arrays, start=1):
        if isinstance(source, DeviceArray) and source.size and array.size and \
                source.device_pointer == array.device_pointer:
            raise TCArgumentError(f"out[{k}] ({tensor.name}) is argument {position}",
                                  hint="inputs are never modified: give out= a separate array")
    return array


def _overlaps_itself(array: np.ndarray) -> bool:
    """Whether two elements of `array` share memory (a broadcast or as_strided view).

    Dimensions sorted by stride must each step over everything the smaller ones span: that
    proves the layout one-to-one for every array NumPy itself makes. A layout that fails it
    (rare: interleaved views) has its offsets listed and compared."""
    dims = sorted((abs(stride), extent) for stride, extent in zip(array.strides, array.shape)
                  if extent > 1)
    span = array.itemsize
    for stride, extent in dims:
        if stride < span:
            break
        span = stride * (extent - 1) + span
    else:
        return False
    if array.size > 1 << 24:
        return True  # too many to list: treat as overlapping (the caller gets an error)
    offsets = np.zeros((), np.int64)
    for stride, extent in zip(array.strides, array.shape):
        offsets = np.add.outer(offsets, np.arange(extent, dtype=np.int64) * stride)
    flat = np.sort(offsets.ravel())
    return bool(np.any(np.diff(flat) < array.itemsize))


def call_numpy(kernel, inputs: tuple) -> tuple:
    """kernel(*inputs) for tclang's own NumPy callers (`tclang run` and its checks), as a
    tuple. Where NumPy has no bfloat16, bfloat16 outputs are written into zeroed arrays of
    tclang's storage passed as out= (the zeros tclang would allocate), which only tclang's
    own code reads (tclang/bfloat16.py converts them)."""
    defn = kernel.definition
    if NUMPY_HAS_BFLOAT16 or not any(t.dtype.value == "bfloat16" for t in defn.outputs):
        result = kernel(*inputs)
        return result if isinstance(result, tuple) else (result,)
    shapes = output_shapes(defn, bind_arguments(defn, tuple(inputs)).sizes)
    outs = tuple(np.zeros(shape, t.dtype.numpy) for t, shape in zip(defn.outputs, shapes))
    kernel(*inputs, out=outs if len(outs) > 1 else outs[0])
    return outs
