"""Ahead-of-time export: one definition as a shared library with a plain C ABI.

    lib = mod.mm.export("out/", sizes={"M": 64, "K": 32, "N": 48})   # or sizes=None: generic
    # out/libtclang_mm.so, out/mm.h, out/mm.c (the wrapper), out/mm.o, out/tclang_runtime.o

The header declares, for entry E with inputs I.. and outputs O..:

    int tclang_E(const T *I, const int64_t *I_sizes, const int64_t *I_strides, ...,
                 T *O, const int64_t *O_sizes, const int64_t *O_strides, ...);
    int tclang_E_output_shape(int output, const int64_t *I_sizes, ..., int64_t *shape);
    const char *tclang_E_error(void);          /* the last failure's message, this thread */
    void tclang_E_set_num_threads(int n);      /* before the first call; default: all CPUs */

Sizes are extents; strides are in elements (NULL: C-contiguous). The call checks what the
Python runtime checks before any kernel runs (every size bound consistently, the
definition's obligations, the sizes a specialized library was made for, the sizes that
would make a read leave its tensor, the outputs' shapes, outputs that overlap themselves,
an input or each other, NULL pointers, counts and byte spans past 64 bits) and returns a
status code instead of raising. A gather that falls outside its tensor returns
TCLANG_INDEX_ERROR with the same message `TCIndexError` carries. Outputs are written in
place; points no statement writes are zero, as in the arrays a Python call returns.
Temporaries are allocated by the call. The library needs no Python: parallel loops run on
the native thread pool that the JIT uses, linked in. Its code is for the exporting
machine's CPU (the header says which).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from tclang.errors import TCArgumentError, TCCompileError, TCError
from tclang.export.common import ExportedLibrary, contiguous_views  # noqa: F401 (API)
from tclang.export.abi import STATUS, Wrapper, parameters, shape_parameters
from tclang.lang.program import Definition


def export_kernel(kernel, directory, sizes: dict[str, int] | None, target: str = "cpu",
                  arch: str = "sm_80") -> ExportedLibrary:
    """Compile `kernel` (a tclang Kernel) for `sizes` (None: every size) with its module's
    options and write the library into `directory`: for `target` "cpu" (this machine) or
    "cuda" (the generated CUDA C, its PTX and cubin for `arch`, and a library whose
    function launches it; nvcc makes them, no GPU is needed to export)."""
    if target not in ("cpu", "cuda"):
        raise TCError(f"export targets are 'cpu' and 'cuda', not {target!r}")
    defn = kernel.definition
    if target == "cuda":
        from tclang.export.cuda import schedule_for_gpu
        info, kernel_source, retry_at = schedule_for_gpu(kernel, sizes)
        static = sizes is not None  # specialized CUDA code has the strides as constants
    else:
        compiled = _compile(kernel, sizes)
        info = compiled.info
        retry_at = compiled.retry_at
        static = compiled.artifact.blobs.get("static") == b"1"
    if retry_at is not None:
        _refuse_degraded(defn.name, info.fallback)
    for condition in info.bounds:
        if condition.predicate is None:
            raise TCError(f"{defn.name}: a bounds condition of this definition can only "
                          f"be checked with isl ({condition.message}); export it for "
                          "concrete sizes (--sizes) instead of --generic")
    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    name = defn.name
    wrapper = Wrapper(defn, info, sizes, static)
    header = folder / f"{name}.h"
    if target == "cuda":
        from tclang.export.cuda import write_cuda
        header.write_text(header_text(defn, sizes, f"CUDA, {arch}", cuda=True))
        return write_cuda(wrapper, kernel_source, folder, arch, header)
    from backends.llvm import export as llvm_export
    blobs = compiled.artifact.blobs  # the kernel and the thread pool, as the JIT links them
    (folder / f"{name}.o").write_bytes(blobs["object"])
    (folder / "tclang_runtime.o").write_bytes(blobs["runtime"])
    header.write_text(header_text(defn, sizes, compiled.request.target.arch))
    source = folder / f"{name}.c"
    source.write_text(wrapper.cpu_source())
    library = llvm_export.link_library(folder, f"libtclang_{name}.so", [source.name],
                                       [f"{name}.o", "tclang_runtime.o"], f"tclang_{name}")
    return ExportedLibrary(library, header, source,
                           (folder / f"{name}.o", folder / "tclang_runtime.o"), name,
                           dict(sizes) if sizes is not None else None)


def _refuse_degraded(name: str, fallback: str | None) -> None:
    """A degraded schedule (the scheduler ran past its time limit on a loaded machine, or
    its process died: polyhedral/scheduler.py) is only a stopgap in a process, replaced by
    the full schedule later; a library keeps it for good, slower and without a word. So
    it is refused, with the way to ask for the fallback's schedule on purpose (a program
    whose full schedule always runs past the limit is degraded every time)."""
    raise TCCompileError(
        f"{name}: not exported: the scheduler gave no full schedule this time "
        f"({fallback}), and the library would keep its slower fallback for good. Export "
        "again when the machine is less loaded; if this program's scheduling always runs "
        "past the limit, ask for the fallback on purpose with tc.Options(fusion='min')")


def _compile(kernel, sizes: dict[str, int] | None):
    """The kernel compiled by the driver's door for the CPU: generic (from its inputs'
    ranks and dtypes alone), or for `sizes` with C-contiguous inputs (checked as a call
    with those shapes would be)."""
    from tclang.bfloat16 import dtype_key
    from tclang.driver.compiler import Signature, compile_kernel
    from tclang.runtime.arguments import bind_arguments
    module = kernel.module
    if module.tuned and sizes is None:
        raise TCArgumentError("tuned options are stored per shape: export them for the "
                              "sizes they were tuned for, not for every size",
                              hint="e.g. --sizes M=512,K=512,N=512 --tuned")
    options = dataclasses.replace(module.options, specialize=sizes is not None)
    defn = kernel.definition
    if sizes is None:
        ranks = tuple((t.rank, dtype_key(np.dtype(t.dtype.numpy))) for t in defn.inputs)
        return compile_kernel(defn, "cpu", options, Signature(ranks, None, None))
    unknown = sorted(set(sizes) - set(defn.sizes))
    if unknown:
        raise TCArgumentError(f"{defn.name} has no size{'s' if len(unknown) > 1 else ''} "
                              f"{', '.join(unknown)}; its sizes are "
                              f"{', '.join(defn.sizes) or 'none'}")
    missing = sorted({n for t in defn.inputs for d in t.shape for n in d.names()} - set(sizes))
    if missing:
        raise TCArgumentError(f"export of {defn.name} needs a value for the size"
                              f"{'s' if len(missing) > 1 else ''} {', '.join(missing)}",
                              hint="give every size, e.g. --sizes " +
                                   ",".join(f"{n}=64" for n in missing))
    binding = bind_arguments(defn, contiguous_views(defn, sizes), False)
    shapes = binding.shape_key()
    signature = Signature(shapes, dict(binding.sizes), tuple(s for _, _, s in shapes))
    return compile_kernel(defn, "cpu", options, signature, tuned=module.tuned)


# ---- the header ----------------------------------------------------------------------------

def header_text(defn: Definition, sizes: dict | None, machine: str, cuda: bool = False) -> str:
    name = defn.name
    guard = f"TCLANG_EXPORT_{name.upper()}_H"
    made_for = ("every size (shape-generic)" if sizes is None else
                "the sizes " + ", ".join(f"{k}={v}" for k, v in sizes.items()) +
                " only, C-contiguous")
    statuses = "\n".join(f"    {k} = {v}," for k, v in STATUS.items())
    ranks = "\n".join(f"#define TCLANG_{name.upper()}_{t.name.upper()}_RANK {t.rank}"
                      for t in defn.outputs)
    signature = defn.signature()
    params = ",\n    ".join(parameters(defn) + (["cudaStream_t stream"] if cuda else []))
    if cuda:
        where = ("Data pointers are device pointers (cudaMalloc); sizes and strides live on "
                 "the\n * host. The call launches on `stream` and waits for it (it reads the "
                 "kernels' error\n * record).")
        includes = "#include <stdint.h>\n#include <cuda_runtime.h>"
        threads = ""
    else:
        where = ("Calls may run in parallel from several threads (a second concurrent call "
                 "runs its\n * loops on its own thread).")
        includes = "#include <stdint.h>"
        threads = (f"/* Threads for parallel loops (default: TCLANG_NUM_THREADS, else every "
                   f"online CPU); call it\n * before the first call. */\n"
                   f"void tclang_{name}_set_num_threads(int n);\n")
    return f"""\
/* {name}.h: generated by `tclang export`. Do not edit.
 *
 * {signature}
 * Source:
{_comment_lines(defn.source)}
 * Exported for {made_for}.
 * Code for: {machine}
 *
 * Each argument is a pointer, its extents (sizes) and its strides in elements (NULL:
 * C-contiguous); rank-0 tensors may pass NULL for both. float16 elements are passed as
 * their IEEE binary16 bits (uint16_t), bfloat16 ones as their bits (uint16_t: the upper
 * half of the float32 of the same value) and bool as uint8_t. A call returns TCLANG_OK or a
 * status saying why nothing (bad arguments or sizes) or not everything (an index error,
 * out of memory) was computed; tclang_{name}_error() gives the message. Outputs are
 * written in place; points no statement writes are zero. {where}
 */
#ifndef {guard}
#define {guard}

{includes}

#ifdef __cplusplus
extern "C" {{
#endif

#ifndef TCLANG_STATUS_DEFINED
#define TCLANG_STATUS_DEFINED
enum tclang_status {{
{statuses}
}};
#endif

{ranks}
#define TCLANG_{name.upper()}_OUTPUTS {len(defn.outputs)}

int tclang_{name}(
    {params});

/* The shape of output `output` (0-based) for inputs of these extents: writes its rank
 * extents into `shape` and returns TCLANG_OK, or a status as tclang_{name} would. */
int tclang_{name}_output_shape(int output, {shape_parameters(defn)},
    int64_t *shape);

/* The message of the last call on this thread that did not return TCLANG_OK. */
const char *tclang_{name}_error(void);

{threads}
#ifdef __cplusplus
}}
#endif

#endif
"""


def _comment_lines(source: str) -> str:
    return "\n".join(" *   " + line.replace("*/", "* /") for line in source.strip().splitlines())
