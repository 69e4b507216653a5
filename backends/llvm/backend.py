"""The CPU backend: loop IR -> LLVM IR -> O3 for the host CPU -> object code -> a call.

    module = KernelModule(kernel, triple, ...).build()    # loop IR -> LLVM IR (llvmlite)
    optimised, object_code = optimize(str(module))        # O3, vectorizers on, host CPU
    loaded = LoadedCode(object_code, ("tclang_main",))    # linked (loading.py); the disk cache keeps it

A kernel call passes the data pointers, the sizes, every array's strides (in elements),
an error record and the thread pool's `parallel_for`; Ctrl-C during the call raises
KeyboardInterrupt once every thread of it has stopped (threads.py). A gather that fell
outside its tensor comes back as a `TCIndexError` naming the tensor, the bad value and the
statement.
"""

from __future__ import annotations

import ctypes
import struct
from typing import TYPE_CHECKING

from backends.access_errors import ERR_FIELDS, raise_access_error
from backends.contract import Artifact
from backends.llvm import threads
from backends.llvm.fast_calls import builtin_call
from backends.llvm.loading import LoadedCode
from backends.llvm.pointers import data_pointer
from tclang.errors import TCCompileError

if TYPE_CHECKING:
    from polyhedral import loop_ir as L
    from tclang.target import Target


class LLVMBackend:
    """Importing this module loads neither LLVM nor the loop IR: a disk-cache hit only
    restores (loading.py links the object code)."""

    name = "cpu"
    device_arrays = False
    #: what a call needs of an artifact's blobs (the runtime keeps these in call records)
    call_blobs = ("object", "static", "runtime")

    def target(self) -> Target:
        """From what the OS says of the CPU (machine.cpu_from_os): no LLVM in this process
        for it. Where the OS says nothing, LLVM's host description (jit.host)."""
        from tclang.target import Target, available_cores, cache_sizes, cpu_from_os, vector_bytes
        described = cpu_from_os()
        if described is None:
            from backends.llvm import jit
            triple, cpu, features = jit.host()
            described = f"{triple} {cpu} {features}", features.split(",")
        arch, flags = described
        return Target(name="cpu", mapping="threads", arch=arch, cores=available_cores(),
                      vector_bytes=vector_bytes(flags), **cache_sizes())

    def prepare(self) -> None:
        """A compile is coming: the optimizer process starts now and loads LLVM while the
        polyhedral layer works (jit.start)."""
        from backends.llvm import jit
        jit.start()

    def while_scheduling(self) -> None:
        """The LLVM IR builder (llvmlite.ir, ~20 ms of imports) loads while the middle
        end's process schedules, not after."""
        import importlib
        importlib.import_module("backends.llvm.kernel_module")

    def build(self, kernel: L.Kernel, target: Target) -> Artifact:
        from backends.llvm import jit
        from backends.llvm.kernel_module import KernelModule  # llvmlite.ir: not for a cache hit
        triple, _, _ = jit.host()
        km = KernelModule(kernel, triple, jit.data_layout(),
                          unrolled_width=max(2, target.vector_bytes // 4))
        text = str(km.build())
        jit.check_code_size(text, kernel.name)
        optimised, object_code = _optimized(text, kernel)
        blobs = {"object": object_code, "llvm": text.encode(), "llvm-opt": optimised.encode(),
                 "static": b"1" if km.static else b"0", "runtime": jit.runtime_object()}
        return _artifact(blobs, [b.name for b in kernel.buffers],
                         [(s.id, s.text, s.line) for s in kernel.statements])

    def restore(self, blobs, info):
        return _artifact(blobs, [b.name for b in info.buffers], list(info.statements))


def _optimized(text: str, kernel: L.Kernel) -> tuple[str, bytes]:
    """LLVM's O3 of the kernel's module, within the compile budget (jit.optimizer_limit).
    Past it, the cheaper way out: the same module without LLVM's vectorizers (where LLVM's
    worst cases are), the compile marked degraded (tclang/budget.py: the driver keeps it
    in memory only, and compiles it in full again later)."""
    from backends.llvm import jit
    from tclang import budget as compile_budget
    budget = compile_budget.current()

    def remaining():
        return None if budget is None else budget.remaining()

    vectorize = kernel.choices.vectorize
    try:
        return jit.optimize(text, vectorize, jit.optimizer_limit(text, remaining()))
    except jit.OptimizerTimeout as slow:
        if not vectorize:
            raise
        if budget is not None:
            budget.fall_back(f"{slow}: compiled without LLVM's vectorizers")
        return jit.optimize(text, False, jit.optimizer_limit(text, remaining()))


def _artifact(blobs: dict[str, bytes], buffer_names: list[str], statements: list):
    """blobs: "object" (the kernel), "static" (b"1": the sizes and every stride are
    constants in the code, a specialized kernel, so a call passes just the data pointers),
    "runtime" (the thread pool and the native call entry, threads.py), and the texts
    "llvm" and "llvm-opt" (absent from a call record)."""
    static = blobs.get("static") == b"1"
    loaded = LoadedCode(blobs["object"], ("tclang_main", "tclang_packed"))
    function = _prototype(len(buffer_names))(loaded.address("tclang_main"))
    function.loaded = loaded  # the code stays mapped while `run` can call it, even mid-call
    runtime = threads.resident(blobs.get("runtime"))
    parallel_for = threads.parallel_for_address()
    c_int64 = ctypes.c_int64
    unused = ctypes.addressof(_UNUSED)
    last = [None]  # the last call's sizes and strides, with the arrays passing them

    def entry(templates=None, sizes=None, strides=None):
        """The bound native call; a kernel that reads sizes or strides at run time is
        bound to the `sizes` and each array's `strides` (in elements) of the call whose
        inputs `templates` are (the signature then holds those inputs to their shapes
        and strides; the runtime allocates the other arrays alike each time)."""
        if static:
            return builtin_call(runtime["tclang_call"], loaded.address("tclang_packed"),
                                parallel_for, unused, len(buffer_names), templates, loaded)
        if templates is None or sizes is None or strides is None:
            return None
        values = (c_int64 * max(1, len(sizes)))(*sizes)
        steps = (c_int64 * max(1, len(strides)))(*strides)
        return builtin_call(runtime["tclang_call"], loaded.address("tclang_packed"),
                            parallel_for, unused, len(buffer_names), templates,
                            (loaded, values, steps), ctypes.addressof(values),
                            ctypes.addressof(steps))
    call = entry() if static else None

    def run_fast(arrays, sizes):
        result = call(*arrays)
        if result:
            if type(result) is not bytes:
                raise TCCompileError(f"internal error: the kernel entry refused {len(arrays)} "
                                     "arrays")
            raise_access_error(struct.unpack(f"<{ERR_FIELDS}q", result), buffer_names,
                               [a.shape for a in arrays], statements)

    def run(arrays, sizes):
        if static:
            sizes_ptr = strides_ptr = unused
        else:  # a repeat of the last call's sizes and strides reuses its arrays (~1.5 us)
            key = (tuple(sizes), tuple(a.strides for a in arrays))
            passed = last[0]
            if passed is None or passed[0] != key:
                strides = [s // a.itemsize for a in arrays for s in a.strides]
                passed = (key, (c_int64 * max(1, len(sizes)))(*sizes),
                          (c_int64 * max(1, len(strides)))(*strides))
                last[0] = passed  # one assignment: another thread sees old or new, whole
            sizes_ptr = ctypes.addressof(passed[1])
            strides_ptr = ctypes.addressof(passed[2])
        err = (c_int64 * ERR_FIELDS)()
        args = [data_pointer(a) for a in arrays] + [sizes_ptr, strides_ptr,
                                                    ctypes.addressof(err), parallel_for]
        code = function(*args)
        if code:
            raise_access_error(list(err), buffer_names, [a.shape for a in arrays], statements)

    text = blobs.get("llvm", b"").decode()
    optimised = blobs.get("llvm-opt", b"").decode()
    return Artifact(source=text, run=run if call is None else run_fast,
                    stages={"llvm": text, "llvm-opt": optimised}, blobs=blobs,
                    bind=entry)


_UNUSED = (ctypes.c_int64 * 1)()  # what a static kernel gets for the arrays it never reads


def _prototype(n_buffers: int):
    """The ctypes signature of `tclang_main`: buffers, sizes, strides, err, parallel_for."""
    args = [ctypes.c_void_p] * n_buffers + [ctypes.c_void_p] * 4
    return ctypes.CFUNCTYPE(ctypes.c_int32, *args)


def backend() -> LLVMBackend:
    return LLVMBackend()
