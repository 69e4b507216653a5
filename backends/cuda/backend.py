"""backend="cuda": the generated CUDA C compiled with nvcc through PyCUDA and run on the GPU.

PyCUDA is imported only here, on first use: a machine without it (or without a GPU) imports
tclang fine and gets a `TCCompileError` saying what to install. Compilation goes through
PyCUDA's `compiler.compile` (nvcc -> cubin for the device's compute capability); the cubin
is what the disk cache keeps, and the cache key includes the compute capability and the
CUDA version. NumPy arguments are copied to the device and results back; arguments that
already live on the GPU (`__cuda_array_interface__`) are used in place and the outputs come
back as the same kind of object (PyTorch, CuPy, PyCUDA GPUArray). A call waits for the GPU
only when it must: to copy results to NumPy arrays, or to read the error record of a kernel
with run-time checks (a gather, `check_bounds`); a kernel on device arrays without them
returns once launched, its work ordered on the default stream with the caller's, as a
PyTorch operator's is.
"""

from __future__ import annotations

import atexit
import functools
import threading

import numpy as np

from backends.contract import Artifact
from backends.cuda import launches as LT
from backends.cuda.codegen import generate, records_errors
from polyhedral import loop_ir as L
from tclang.bfloat16 import STORAGE as BF16_STORAGE
from tclang.errors import TCArgumentError, TCCompileError, TCLaunchError
from tclang.target import Target


@functools.lru_cache(maxsize=1)
def _device():
    """(pycuda.driver, device, context): the primary context of GPU 0."""
    try:
        import pycuda.driver as cuda
    except ImportError as err:
        raise TCCompileError("backend='cuda' needs PyCUDA: pip install 'tclang[cuda]' (on a "
                             "machine with the CUDA toolkit), or use backend='cuda-emulated' "
                             f"to run the generated CUDA on the CPU ({err})") from None
    try:
        cuda.init()
        device = cuda.Device(0)
        context = device.retain_primary_context()
        context.push()
        atexit.register(_release, cuda, context)
    except Exception as err:  # no driver, no device: say so in tclang's words
        raise TCCompileError(f"backend='cuda' found no usable NVIDIA GPU ({err}); use "
                             "backend='cuda-emulated' on machines without one") from None
    return cuda, device, context


def _release(cuda, context) -> None:
    """Pop the primary context before PyCUDA's own exit hook runs (atexit is last in, first
    out): PyCUDA aborts the process if it finds a context still pushed."""
    try:
        while cuda.Context.get_current() is not None:
            cuda.Context.pop()
    except cuda.Error:
        pass
    context.detach()


class CudaBackend:
    name = "cuda"
    device_arrays = True

    def target(self) -> Target:
        cuda, device, _ = _device()
        a = cuda.device_attribute
        major, minor = device.compute_capability()
        version = ".".join(map(str, cuda.get_version()))
        return Target(
            name="cuda", mapping="grid", arch=f"sm_{major}{minor} cuda {version}",
            max_threads_per_block=device.get_attribute(a.MAX_THREADS_PER_BLOCK),
            max_block=(device.get_attribute(a.MAX_BLOCK_DIM_X),
                       device.get_attribute(a.MAX_BLOCK_DIM_Y),
                       device.get_attribute(a.MAX_BLOCK_DIM_Z)),
            max_grid=(device.get_attribute(a.MAX_GRID_DIM_X),
                      device.get_attribute(a.MAX_GRID_DIM_Y),
                      device.get_attribute(a.MAX_GRID_DIM_Z)),
            shared_bytes=device.get_attribute(a.MAX_SHARED_MEMORY_PER_BLOCK),
            warp=device.get_attribute(a.WARP_SIZE))

    def build(self, kernel: L.Kernel, target: Target) -> Artifact:
        from pycuda.compiler import compile as nvcc
        cuda, device, _ = _device()
        source = generate(kernel)
        major, minor = device.compute_capability()
        try:
            cubin = nvcc(source.text, arch=f"sm_{major}{minor}", no_extern_c=True,
                         options=["-O3", "-std=c++17"])
        except Exception as err:
            raise TCCompileError(f"nvcc could not compile the generated CUDA: {err}") from err
        return _artifact(cubin, source.text, LT.table(source), kernel.buffers,
                         [(s.id, s.text, s.line) for s in kernel.statements], kernel.sizes)

    def restore(self, blobs, info):
        return _artifact(blobs["cubin"], blobs["cuda"].decode(), LT.from_json(blobs["launches"]),
                         info.buffers, list(info.statements), info.sizes)

    def allocate(self, shape, dtype, zero: bool, like):
        """Outputs of a call whose inputs live on the GPU: the same kind of array."""
        return device_empty(shape, dtype, zero, like)

    def copy(self, destination, source):
        """Device to device, between two arrays of one library (a strided out=)."""
        module = type(destination).__module__.split(".")[0]
        if module == "torch":
            destination.copy_(source)
        elif module == "cupy":
            import cupy
            cupy.copyto(destination, source)
        else:
            raise TCArgumentError(f"out= of type {type(destination).__name__} must be "
                                  "C-contiguous", hint="pass a contiguous array, or a "
                                  "PyTorch tensor or CuPy array (strided ones are copied)")


def _artifact(cubin: bytes, text: str, entries, buffers, statements, size_names):
    cuda, _, _ = _device()
    module = cuda.module_from_buffer(cubin)
    functions = [(e, module.get_function(e.function)) for e in entries]
    for e, fn in functions:
        if e.shared > LT.STATIC_SHARED:  # a launch asks for more than 48 KB: opt in
            fn.set_attribute(cuda.function_attribute.MAX_DYNAMIC_SHARED_SIZE_BYTES, e.shared)
    # what every call would otherwise redo: the error record (on the device, zero until a
    # kernel records a bad subscript, and zeroed again after), its host copy, and the
    # argument packing PyCUDA prepares once per signature. A lock keeps two threads'
    # calls from sharing the record.
    err = cuda.mem_alloc(LT.ERR_FIELDS * 8)
    cuda.memset_d8(err, 0, LT.ERR_FIELDS * 8)
    record = cuda.pagelocked_zeros(LT.ERR_FIELDS, dtype=np.int64)  # a direct copy back
    # a kernel without run-time checks (no gather, no check_bounds) can record nothing:
    # on device arrays it returns without waiting for the GPU, as PyTorch's operators do
    checked = records_errors(text)
    lock = threading.Lock()
    prepared: dict[str, list] = {}
    planned: dict[tuple, list] = {}  # sizes -> the launches that run, with their dims

    def launches(signature: str, sizes) -> list:
        key = (signature, tuple(sizes))
        found = planned.get(key)
        if found is None:
            if signature not in prepared:
                prepared[signature] = [(e, fn.prepare(signature)) for e, fn in functions]
            env = dict(zip(size_names, sizes))
            found = [(e.function, fn, *e.dims(env), e.shared) for e, fn in prepared[signature]
                     if e.runs(env)]
            if len(planned) > 64:  # a shape-generic kernel called on many shapes
                planned.clear()
            planned[key] = found
        return found

    def run(arrays, sizes):
        with lock:
            _run(arrays, sizes)

    def _run(arrays, sizes):
        pointers, keep, copy_back = [], [], []
        for k, a in enumerate(arrays):
            pointer = getattr(a, "device_pointer", None)
            if pointer is None:  # a NumPy array: stage it on the device
                memory = cuda.mem_alloc(max(a.nbytes, 1))
                keep.append(memory)
                if buffers[k].kind == "input" or buffers[k].kind == "output":
                    cuda.memcpy_htod(memory, np.ascontiguousarray(a))
                if buffers[k].kind == "output":
                    copy_back.append((a, memory))
                pointer = int(memory)
            pointers.append(int(pointer))
        strides = [s for k, a in enumerate(arrays) for s in LT.element_strides(
            a.shape, None if getattr(a, "device_pointer", None) is None else a.strides,
            a.itemsize)]
        args = pointers + [int(v) for v in sizes] + [int(v) for v in strides] + [int(err)]
        signature = "P" * len(pointers) + "q" * (len(sizes) + len(strides)) + "P"
        in_order = _on_the_default_stream(arrays)
        if not in_order:  # the callers' stream may still be writing the inputs
            cuda.Context.synchronize()
        launched = []
        for function, fn, grid, block, shared in launches(signature, sizes):
            try:
                fn.prepared_call(grid, block, *args, shared_size=shared)
            except cuda.Error as failure:
                raise _launch_error("refused to launch", [(function, grid, block)],
                                    failure) from None
            launched.append((function, grid, block))
        if not (checked or keep) and in_order:
            return  # ordered after the callers' work and before their next, on stream 0
        try:
            cuda.memcpy_dtoh(record, err)  # also waits for the kernels
        except cuda.Error as failure:
            raise _launch_error("failed while running", launched, failure) from None
        if record[0]:
            found = record.copy()
            cuda.memset_d8(err, 0, LT.ERR_FIELDS * 8)  # the next call starts clean
            LT.raise_index_error(found, buffers, statements, [a.shape for a in arrays])
        for host, memory in copy_back:
            staged = np.empty(host.shape, dtype=host.dtype)
            cuda.memcpy_dtoh(staged, memory)
            host[...] = staged

    return Artifact(source=text, run=run, stages={"cuda": text},
                    blobs={"cubin": cubin, "cuda": text.encode(), "launches": LT.to_json(entries)})


def _on_the_default_stream(arrays) -> bool:
    """Whether the callers' libraries queue their work on the legacy default stream, as
    the launches do: then the order is theirs, and no call needs to wait. (PyTorch and
    CuPy do unless a `with stream:` block says otherwise; PyCUDA arrays always.) Asked
    once per library: a call's arrays are on the one device tclang drives."""
    asked = set()
    for a in arrays:
        module = type(getattr(a, "obj", None)).__module__.split(".")[0]
        if module in asked:
            continue
        asked.add(module)
        if module == "torch" and _torch_stream(a.obj) != 0:
            return False
        if module == "cupy":
            import cupy
            if cupy.cuda.get_current_stream().ptr != 0:
                return False
    return True


def _torch_stream(tensor) -> int:
    """The raw handle of PyTorch's current stream on the tensor's device: through the
    accessor its own compiled kernels use (a microsecond), else the public one (several:
    it builds a Stream object)."""
    import torch
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:
        return int(raw(tensor.get_device()))
    return torch.cuda.current_stream(tensor.device).cuda_stream


def _launch_error(what: str, launches, failure) -> TCLaunchError:
    """A driver error in tclang's words: which generated functions, with which grid and
    block. A fault while running leaves the CUDA context unusable, so say that too."""
    names = "; ".join(f"{name} (grid {grid}, block {block})" for name, grid, block in launches)
    after = "" if what == "refused to launch" else (
        " The CUDA context is unusable after a fault: restart the process, and report the "
        "program and shapes as a tclang bug (Options(check_bounds=True) names the access).")
    return TCLaunchError(f"the GPU {what} {names or 'the kernel'}: {failure}.{after}")


def device_empty(shape, dtype: np.dtype, zero: bool, like):
    """A new device array of the library `like` (the user's object) comes from (GPUArray
    if none is known); the runtime wraps it as it wraps the inputs."""
    module = type(like).__module__.split(".")[0]
    make = {"torch": _torch_empty, "cupy": _cupy_empty}.get(module, _gpuarray_empty)
    return make(shape, dtype, zero, like)


def _torch_empty(shape, dtype, zero, like):
    import torch
    t = torch.bfloat16 if dtype == BF16_STORAGE else \
        torch.from_numpy(np.empty(0, dtype=dtype)).dtype
    return (torch.zeros if zero else torch.empty)(shape, dtype=t, device=like.device)


def _cupy_empty(shape, dtype, zero, like):
    import cupy
    return (cupy.zeros if zero else cupy.empty)(shape, dtype=dtype)


def _gpuarray_empty(shape, dtype, zero, like):
    from pycuda import gpuarray
    return (gpuarray.zeros if zero else gpuarray.empty)(shape, dtype=dtype)


def backend() -> CudaBackend:
    return CudaBackend()
