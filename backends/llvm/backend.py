"""The CPU backend: loop IR -> LLVM IR -> O3 for the host CPU -> object code -> a call.

    module = KernelModule(kernel, triple, ...).build()    # loop IR -> LLVM IR (llvmlite)
    optimised, object_code = optimize(str(module))        # O3, vectorizers on, host CPU
    loaded = LoadedCode(object_code, "tclang_main")       # MCJIT; the disk cache keeps it

A kernel call passes the data pointers, the sizes, every array's strides (in elements),
an error record and the thread pool's `parallel_for`; Ctrl-C during the call raises
KeyboardInterrupt once every thread of it has stopped (threads.py). A gather that fell
outside its tensor comes back as a `TCIndexError` naming the tensor, the bad value and the
statement.
"""

from __future__ import annotations

import ctypes

from backends.access_errors import ERR_FIELDS, raise_access_error
from backends.contract import Artifact
from backends.llvm import jit, threads
from backends.llvm.pointers import data_pointer
from polyhedral import loop_ir as L
from tclang.target import Target, available_cores, cache_sizes


class LLVMBackend:
    name = "cpu"
    device_arrays = False

    def target(self) -> Target:
        triple, cpu, features = jit.host()
        vector_bytes = 64 if "+avx512f" in features else 32 if "+avx" in features else 16
        return Target(name="cpu", mapping="threads", arch=f"{triple} {cpu} {features}",
                      cores=available_cores(), vector_bytes=vector_bytes, **cache_sizes())

    def build(self, kernel: L.Kernel, target: Target) -> Artifact:
        from backends.llvm.kernel_module import KernelModule  # llvmlite.ir: not for a cache hit
        km = KernelModule(kernel, jit.host()[0], jit.data_layout(),
                          unrolled_width=max(2, target.vector_bytes // 4))
        text = str(km.build())
        jit.check_code_size(text, kernel.name)
        optimised, object_code = jit.optimize(text, vectorize=kernel.choices.vectorize)
        names = _names(kernel.buffers, [(s.id, s.text, s.line) for s in kernel.statements])
        return _artifact(object_code, text, optimised, names, km.static)

    def restore(self, blobs, info):
        names = _names(info.buffers, info.statements)
        return _artifact(blobs["object"], blobs["llvm"].decode(),
                         blobs.get("llvm-opt", b"").decode(), names,
                         blobs.get("static") == b"1")


def _names(buffers, statements):
    return ([b.name for b in buffers], [tuple(b.shape) for b in buffers], list(statements))


def _artifact(object_code: bytes, text: str, optimised: str, names, static: bool):
    """`static`: the sizes and every stride are constants in the code (a specialized
    kernel), so a call passes neither: it is just the data pointers."""
    buffer_names, _, statements = names
    loaded = jit.LoadedCode(object_code, "tclang_main")
    function = jit.prototype(len(buffer_names))(loaded.address)
    function.loaded = loaded  # the engine lives while `run` can call it, even mid-call
    parallel_for = threads.parallel_for_address() if "tclang_task" in text else 0
    c_int64 = ctypes.c_int64
    unused = ctypes.addressof(_UNUSED)
    last = [None]  # the last call's sizes and strides, with the arrays passing them

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
            _raise_index_error(err, buffer_names, arrays, statements)

    return Artifact(source=text, run=run, stages={"llvm": text, "llvm-opt": optimised},
                    blobs={"object": object_code, "llvm": text.encode(),
                           "llvm-opt": optimised.encode(), "static": b"1" if static else b"0"})


_UNUSED = (ctypes.c_int64 * 1)()  # what a static kernel gets for the arrays it never reads


def _raise_index_error(err, buffer_names, arrays, statements) -> None:
    raise_access_error(list(err), buffer_names, [a.shape for a in arrays], statements)


def backend() -> LLVMBackend:
    return LLVMBackend()
