"""backend="cuda-emulated": the generated CUDA C, compiled by g++ and run on the host.

The same source the GPU would run is compiled as C++ with the emulation header
(backends/cuda/emulation): each block's CUDA threads are fibers that switch at
`__syncthreads()`, so shared memory, barriers and block/thread ids behave as on a GPU, and
a missing barrier gives wrong results. Machines without a GPU (CI) run the whole e2e suite
through the CUDA path this way.

Memory: each distinct generated source is one shared object, loaded once (build.py keeps
it by its hash) and never unloaded, because ctypes never dlcloses and unloading code that a
fiber or another thread may still be in is unsafe. A process running many distinct
kernels through this testing backend grows by one small library per kernel; the CPU
backend frees its kernels' code. The libraries are kept between processes in the store the
driver attaches (the disk cache, authenticated like every entry), never found by file name.
"""

from __future__ import annotations

import ctypes

import numpy as np

from backends.contract import Artifact
from backends.cuda import launches as LT
from backends.cuda.codegen import generate
from polyhedral import loop_ir as L
from tclang.errors import TCCompileError
from tclang.target import Target


class EmulatedBackend:
    name = "cuda-emulated"
    device_arrays = False
    #: where built libraries are kept between processes (backends/contract.py): the
    #: driver attaches the disk cache; without one, each process builds its own
    store = None

    def attach_store(self, store) -> None:
        self.store = store

    def target(self) -> Target:
        return Target(name="cuda-emulated", mapping="grid", arch="emulated sm_80",
                      max_threads_per_block=1024, shared_bytes=48 * 1024)

    def build(self, kernel: L.Kernel, target: Target) -> Artifact:
        source = generate(kernel)
        entries = LT.table(source)
        return _artifact(source.text, entries, kernel.buffers,
                         [(s.id, s.text, s.line) for s in kernel.statements], kernel.sizes,
                         self.store)

    def restore(self, blobs, info):
        return _artifact(blobs["cuda"].decode(), LT.from_json(blobs["launches"]), info.buffers,
                         list(info.statements), info.sizes, self.store)


def _artifact(text: str, entries, buffers, statements, size_names, store):
    from backends.cuda.emulation.build import EmulationBuildError, compile_emulated

    try:
        library = compile_emulated(text, store=store)
    except EmulationBuildError as err:
        raise TCCompileError(f"the generated CUDA did not compile for emulation: {err}") from err
    functions = []
    for entry in entries:
        fn = getattr(library, f"{entry.function}_emulate")
        fn.restype = ctypes.c_int
        functions.append((entry, fn))
    error_text = getattr(library, "tclang_emu_last_error", None)
    if error_text is not None:
        error_text.restype = ctypes.c_char_p

    def run(arrays, sizes):
        env = dict(zip(size_names, sizes))
        strides = [s for a in arrays for s in LT.element_strides(a.shape, a.strides, a.itemsize)]
        err = np.zeros(LT.ERR_FIELDS, dtype=np.int64)
        args = [ctypes.c_void_p(a.ctypes.data) for a in arrays] + \
            [ctypes.c_longlong(v) for v in sizes] + [ctypes.c_longlong(v) for v in strides] + \
            [ctypes.c_void_p(err.ctypes.data)]
        for entry, fn in functions:
            if not entry.runs(env):
                continue
            grid, block = entry.dims(env)
            dims = [ctypes.c_longlong(v) for v in grid + block]
            code = fn(*dims, *args)
            if code != 0:
                detail = error_text().decode() if error_text is not None else f"code {code}"
                raise TCCompileError(f"the CUDA emulation could not run {entry.function}: "
                                     f"{detail}")
            if err[0]:
                LT.raise_index_error(err, buffers, statements, [a.shape for a in arrays])

    return Artifact(source=text, run=run, stages={"cuda": text},
                    blobs={"cuda": text.encode(), "launches": LT.to_json(entries)})


def backend() -> EmulatedBackend:
    return EmulatedBackend()
