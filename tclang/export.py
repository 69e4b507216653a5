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
would make a read leave its tensor, the outputs' shapes) and returns a status code instead
of raising. A gather that falls outside its tensor returns TCLANG_INDEX_ERROR with the
same message `TCIndexError` carries. Outputs are written in place; points no statement
writes are zero, as in the arrays a Python call returns. Temporaries are allocated by the
call. The library needs no Python: parallel loops run on the native thread pool that the
JIT uses, linked in. Its code is for the exporting machine's CPU (the header says which).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from polyhedral import loop_ir as L
from tclang.c_text import C_TYPES, PRELUDE, c_string, index_c, size_c, size_variable
from tclang.errors import TCArgumentError, TCError
from tclang.program import Definition

STATUS = {"TCLANG_OK": 0, "TCLANG_BAD_ARGUMENT": 1, "TCLANG_BAD_SIZES": 2,
          "TCLANG_INDEX_ERROR": 3, "TCLANG_OUT_OF_MEMORY": 4}


@dataclass(frozen=True)
class ExportedLibrary:
    """What `export` wrote: the library, its header, and the pieces it was linked from."""

    library: Path
    header: Path
    wrapper: Path
    objects: tuple[Path, ...]
    entry: str
    sizes: dict | None  # None: shape-generic

    @property
    def function(self) -> str:
        return f"tclang_{self.entry}"


def export_kernel(kernel, directory, sizes: dict[str, int] | None) -> ExportedLibrary:
    """Compile `kernel` (a tclang Kernel) for `sizes` (None: every size) with its module's
    options and write the library into `directory`."""
    if kernel.module.backend != "cpu":
        raise TCError(f"export makes a CPU library; this module's backend is "
                      f"{kernel.module.backend!r}: define it with backend='cpu' to export "
                      "(the CUDA source of a kernel is `compiled.source`)")
    defn = kernel.definition
    compiled = _compile(kernel, sizes)
    info = compiled._c.info
    for condition in info.bounds:
        if condition.predicate is None:
            raise TCError(f"{defn.name}: a bounds condition of this definition can only "
                          f"be checked with isl ({condition.message}); export it for "
                          "concrete sizes (--sizes) instead of --generic")
    from backends.llvm import export as llvm_export
    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    name = defn.name
    (folder / f"{name}.o").write_bytes(compiled._c.artifact.blobs["object"])
    (folder / "tclang_runtime.o").write_bytes(llvm_export.runtime_object())
    header = folder / f"{name}.h"
    header.write_text(header_text(defn, sizes, compiled._target))
    wrapper = folder / f"{name}.c"
    static = compiled._c.artifact.blobs.get("static") == b"1"
    wrapper.write_text(wrapper_text(defn, info, sizes, static))
    library = llvm_export.link_library(folder, f"libtclang_{name}.so", [wrapper.name],
                                       [f"{name}.o", "tclang_runtime.o"], f"tclang_{name}")
    return ExportedLibrary(library, header, wrapper,
                           (folder / f"{name}.o", folder / "tclang_runtime.o"), name,
                           dict(sizes) if sizes is not None else None)


def _compile(kernel, sizes: dict[str, int] | None):
    """The kernel compiled generic, or for `sizes` with C-contiguous inputs."""
    from tclang.runtime import Module
    module = kernel.module
    options = dataclasses.replace(module.options, specialize=sizes is not None)
    alone = Module(module.program, "cpu", options)[kernel.name]
    defn = kernel.definition
    if sizes is None:
        shapes = [tuple(0 for _ in t.shape) for t in defn.inputs]
    else:
        missing = sorted({n for t in defn.inputs for d in t.shape for n in d.names()} -
                         set(sizes))
        if missing:
            raise TCArgumentError(f"export of {defn.name} needs a value for the size"
                          f"{'s' if len(missing) > 1 else ''} {', '.join(missing)}",
                          hint="give every size, e.g. --sizes " +
                               ",".join(f"{n}=64" for n in missing))
        shapes = [tuple(d.evaluate(sizes) for d in t.shape) for t in defn.inputs]
    # zero-stride views of one element: the shapes and C-contiguous strides a call would
    # have, without allocating the inputs
    arrays = []
    for t, shape in zip(defn.inputs, shapes):
        one = np.zeros(1, dtype=t.dtype.numpy)
        strides, step = [], one.itemsize
        for extent in reversed(shape):
            strides.append(step)
            step *= max(extent, 1)
        view = np.lib.stride_tricks.as_strided(one, shape, tuple(reversed(strides)),
                                               writeable=False)
        arrays.append(view)
    return alone.compile(*arrays)


# ---- the header ----------------------------------------------------------------------------

def _parameters(defn: Definition) -> list[str]:
    params = []
    for t in defn.inputs:
        params.append(f"const {C_TYPES[t.dtype]} *{t.name}, const int64_t *{t.name}_sizes, "
                      f"const int64_t *{t.name}_strides")
    for t in defn.outputs:
        params.append(f"{C_TYPES[t.dtype]} *{t.name}, const int64_t *{t.name}_sizes, "
                      f"const int64_t *{t.name}_strides")
    return params


def _shape_parameters(defn: Definition) -> str:
    return ", ".join(f"const int64_t *{t.name}_sizes" for t in defn.inputs)


def header_text(defn: Definition, sizes: dict | None, target) -> str:
    name = defn.name
    guard = f"TCLANG_EXPORT_{name.upper()}_H"
    made_for = ("every size (shape-generic)" if sizes is None else
                "the sizes " + ", ".join(f"{k}={v}" for k, v in sizes.items()) +
                " only, C-contiguous")
    statuses = "\n".join(f"    {k} = {v}," for k, v in STATUS.items())
    ranks = "\n".join(f"#define TCLANG_{name.upper()}_{t.name.upper()}_RANK {t.rank}"
                      for t in defn.outputs)
    signature = defn.signature()
    params = ",\n    ".join(_parameters(defn))
    return f"""\
/* {name}.h: generated by `tclang export`. Do not edit.
 *
 * {signature}
 * Source:
{_comment_lines(defn.source)}
 * Exported for {made_for}.
 * Machine code for: {target.arch if target is not None else "this machine"}
 *
 * Each argument is a pointer, its extents (sizes) and its strides in elements (NULL:
 * C-contiguous); rank-0 tensors may pass NULL for both. float16 elements are passed as
 * their IEEE binary16 bits (uint16_t) and bool as uint8_t. A call returns TCLANG_OK or a
 * status saying why nothing (bad arguments or sizes) or not everything (an index error,
 * out of memory) was computed; tclang_{name}_error() gives the message. Outputs are
 * written in place; points no statement writes are zero. Calls may run in parallel from
 * several threads (a second concurrent call runs its loops on its own thread).
 */
#ifndef {guard}
#define {guard}

#include <stdint.h>

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
int tclang_{name}_output_shape(int output, {_shape_parameters(defn) or "void *unused"},
    int64_t *shape);

/* The message of the last call on this thread that did not return TCLANG_OK. */
const char *tclang_{name}_error(void);

/* Threads for parallel loops (default: TCLANG_NUM_THREADS, else every online CPU); call it
 * before the first call. */
void tclang_{name}_set_num_threads(int n);

#ifdef __cplusplus
}}
#endif

#endif
"""


def _comment_lines(source: str) -> str:
    return "\n".join(" *   " + line.replace("*/", "* /") for line in source.strip().splitlines())


# ---- the wrapper ---------------------------------------------------------------------------

def wrapper_text(defn: Definition, info, sizes: dict | None, static: bool) -> str:
    """The C source of the exported functions around the kernel's `tclang_main`."""
    name = defn.name
    buffers = info.buffers
    n_in, n_out = len(defn.inputs), len(defn.outputs)
    size_names = list(dict.fromkeys([*defn.sizes, *info.sizes]))
    out = [f"/* {name}.c: generated by `tclang export`: the C ABI around the kernel. */",
           "#include <stdint.h>", "#include <stdio.h>", "#include <stdlib.h>",
           "#include <string.h>", "#include <stdarg.h>", "#include <pthread.h>",
           "#include <unistd.h>", f'#include "{name}.h"', "", PRELUDE]
    pointer_params = ", ".join(["void *"] * len(buffers))
    out += [f"extern int32_t tclang_main({pointer_params}{', ' if buffers else ''}"
            "const int64_t *, const int64_t *, int64_t *, void *);",
            "extern void tclang_parallel_for(void (*)(void *, int64_t, int64_t), void *, "
            "int64_t, int64_t);",
            "extern void tclang_pool_configure(int64_t);",
            "extern void tclang_pool_forget(void);", ""]
    out += _support(name)
    # binding: every size from the inputs' extents, then every check on sizes alone
    out.append(f"static int tc_bind({_shape_parameters(defn) or 'void *unused'}, "
               "int64_t *sizes) {")
    for k, s in enumerate(size_names):
        out.append(f"    int64_t {size_variable(s)} = -1; (void){size_variable(s)};")
    bound: dict[str, str] = {}
    for position, t in enumerate(defn.inputs, start=1):
        if t.rank:
            out.append(f"    if (!{t.name}_sizes) return tc_fail(TCLANG_BAD_ARGUMENT, "
                       f"\"{t.name}_sizes is NULL (argument {position} has rank {t.rank})\");")
        for dim, extent in enumerate(t.shape):
            given = f"{t.name}_sizes[{dim}]"
            where = f"dimension {dim} of {t.name}"
            out.append(f"    if ({given} < 0) return tc_fail(TCLANG_BAD_SIZES, "
                       f"\"{where} has a negative extent %lld\", (long long){given});")
            if extent.constant is not None:
                out.append(f"    if ({given} != {extent.constant}) return tc_fail("
                           f"TCLANG_BAD_SIZES, \"argument {position} ({t.name}) of {name} must "
                           f"have extent {extent.constant} in dimension {dim}, but it has "
                           f"%lld\", (long long){given});")
                continue
            size = str(extent)
            var = size_variable(size)
            if size not in bound:
                bound[size] = where
                out.append(f"    {var} = {given};")
            else:
                out.append(f"    if ({given} != {var}) return tc_fail(TCLANG_BAD_SIZES, "
                           f"\"size {size} of {name} is %lld by {bound[size]} but %lld by "
                           f"{where} (argument {position}); every dimension named {size} "
                           f"must have the same extent\", (long long){var}, "
                           f"(long long){given});")
    unbound = [s for s in size_names if s not in bound]
    if unbound:
        raise TCError(f"export of {name}: the size{'s' if len(unbound) > 1 else ''} "
                      f"{', '.join(unbound)} cannot be bound from the inputs' extents")
    if sizes is not None:
        for s, value in sizes.items():
            if s in bound:
                out.append(f"    if ({size_variable(s)} != {int(value)}) return tc_fail("
                           f"TCLANG_BAD_SIZES, \"this library of {name} was exported for "
                           f"{s}={int(value)}, not %lld; export it with --generic for any "
                           f"sizes\", (long long){size_variable(s)});")
    for ob in defn.obligations:
        relation = ">= 0" if ob.relation == ">=" else "== 0"
        out.append(f"    if (!({size_c(ob.expr)} {relation})) return tc_fail("
                   f"TCLANG_BAD_SIZES, \"%s\", {c_string(ob.message)});")
    for condition in info.bounds:
        out.append(f"    if ({index_c(condition.predicate)}) return tc_fail(TCLANG_BAD_SIZES, "
                   f"\"%s\", {c_string(condition.message)});")
    for k, s in enumerate(size_names):
        out.append(f"    sizes[{k}] = {size_variable(s)};")
    out += ["    return TCLANG_OK;", "}", ""]

    def unpack_sizes() -> list[str]:
        return [f"    const int64_t {size_variable(s)} = sizes[{k}]; (void){size_variable(s)};"
                for k, s in enumerate(size_names)]

    shape_args = ", ".join(f"{t.name}_sizes" for t in defn.inputs) or "NULL"
    # output shapes
    out.append(f"int tclang_{name}_output_shape(int output, "
               f"{_shape_parameters(defn) or 'void *unused'}, int64_t *shape) {{")
    out.append(f"    int64_t sizes[{max(1, len(size_names))}];")
    out.append(f"    int status = tc_bind({shape_args}, sizes);")
    out.append("    if (status != TCLANG_OK) return status;")
    out += unpack_sizes()
    out.append("    switch (output) {")
    for k, t in enumerate(defn.outputs):
        out.append(f"    case {k}:")
        for dim, extent in enumerate(t.shape):
            out.append(f"        shape[{dim}] = {size_c(extent)};")
        out.append("        return TCLANG_OK;")
    out += ["    }", f"    return tc_fail(TCLANG_BAD_ARGUMENT, \"{name} has no output %d\", "
                    "output);", "}", ""]
    # the call
    params = ",\n    ".join(_parameters(defn))
    out.append(f"int tclang_{name}(\n    {params}) {{")
    out.append(f"    int64_t sizes[{max(1, len(size_names))}];")
    out.append(f"    int status = tc_bind({shape_args}, sizes);")
    out.append("    if (status != TCLANG_OK) return status;")
    out += unpack_sizes()
    total = sum(len(b.shape) for b in buffers)
    out.append(f"    int64_t extents[{max(1, total)}], strides[{max(1, total)}];")
    position = 0
    for k, b in enumerate(buffers):
        for dim, extent in enumerate(b.shape):
            out.append(f"    extents[{position + dim}] = {index_c(extent)};")
        rank = len(b.shape)
        out.append(f"    tc_contiguous({rank}, extents + {position}, strides + {position});")
        if k < n_in + n_out:
            if rank:
                out.append(f"    if ({b.name}_strides) memcpy(strides + {position}, "
                           f"{b.name}_strides, {rank} * sizeof(int64_t));")
            if k >= n_in:
                out.append(f"    if (!{b.name}_sizes && {rank}) return tc_fail("
                           f"TCLANG_BAD_ARGUMENT, \"{b.name}_sizes is NULL\");")
                for dim in range(rank):
                    out.append(f"    if ({b.name}_sizes[{dim}] != extents[{position + dim}]) "
                               f"return tc_fail(TCLANG_BAD_SIZES, \"output {b.name} must have "
                               f"extent %lld in dimension {dim}, but it has %lld\", "
                               f"(long long)extents[{position + dim}], "
                               f"(long long){b.name}_sizes[{dim}]);")
            out.append(f"    if (!{b.name} && tc_count({rank}, extents + {position}) > 0) "
                       f"return tc_fail(TCLANG_BAD_ARGUMENT, \"{b.name} is NULL\");")
            if static:
                out.append(f"    if (!tc_is_contiguous({rank}, extents + {position}, "
                           f"strides + {position})) return tc_fail(TCLANG_BAD_ARGUMENT, "
                           f"\"{b.name} must be C-contiguous: this library was exported for "
                           f"fixed sizes and layouts (export it with --generic for any "
                           f"strides)\");")
        position += rank
    # temporaries
    position = 0
    temporaries = []
    for k, b in enumerate(buffers):
        rank = len(b.shape)
        if k >= n_in + n_out:
            item = np.dtype(b.dtype.numpy).itemsize
            zero = b.name in info.zero_fill
            out.append(f"    void *tmp_{k} = tc_allocate({rank}, extents + {position}, {item}, "
                       f"{1 if zero else 0});")
            temporaries.append(f"tmp_{k}")
            out.append(f"    if (!tmp_{k}) {{ {_free(temporaries[:-1])}return tc_fail("
                       f"TCLANG_OUT_OF_MEMORY, \"cannot allocate the temporary {b.name}\"); }}")
        elif k >= n_in and b.name in info.zero_fill:
            item = np.dtype(b.dtype.numpy).itemsize
            out.append(f"    tc_zero((char *){b.name}, {rank}, extents + {position}, "
                       f"strides + {position}, {item});")
        position += rank
    pointers = []
    for k, b in enumerate(buffers):
        pointers.append(f"(void *){b.name}" if k < n_in + n_out else f"tmp_{k}")
    size_values = ", ".join(size_variable(s) for s in info.sizes) or "0"
    out.append(f"    const int64_t kernel_sizes[{max(1, len(info.sizes))}] = {{{size_values}}};")
    out.append("    int64_t err[TC_ERR_FIELDS] = {0};")
    out.append("    pthread_once(&tc_once, tc_start);")
    args = ", ".join(pointers + ["kernel_sizes", "strides", "err",
                                 "tc_threads > 1 ? (void *)tclang_parallel_for : NULL"])
    out.append(f"    int32_t code = tclang_main({args});")
    out.append(f"    {_free(temporaries)}")
    names = ", ".join(c_string(b.name) for b in buffers) or "NULL"
    ranks = ", ".join(str(len(b.shape)) for b in buffers) or "0"
    offsets, position = [], 0
    for b in buffers:
        offsets.append(str(position))
        position += len(b.shape)
    statements = ", ".join(c_string(text) for _, text, _ in info.statements) or "NULL"
    lines = ", ".join(str(line) for _, _, line in info.statements) or "0"
    out += ["    if (code != 0) {",
            f"        static const char *const names[] = {{{names}}};",
            f"        static const int ranks[] = {{{ranks}}};",
            f"        static const int offsets[] = {{{', '.join(offsets) or '0'}}};",
            f"        static const char *const statements[] = {{{statements}}};",
            f"        static const int lines[] = {{{lines}}};",
            "        return tc_index_error(err, names, ranks, offsets, extents, statements, "
            "lines);",
            "    }", "    return TCLANG_OK;", "}", ""]
    return "\n".join(out)


def _free(names: list[str]) -> str:
    return "".join(f"free({n}); " for n in names)


def _support(name: str) -> list[str]:
    """The wrapper's static helpers: messages, the thread pool's start, allocation."""
    from backends.access_errors import ERR_FIELDS, MAX_SUBSCRIPTS
    return [f"""\
#define TC_ERR_FIELDS {ERR_FIELDS}
#define TC_MAX_SUBSCRIPTS {MAX_SUBSCRIPTS}

static _Thread_local char tc_message[1024];

const char *tclang_{name}_error(void) {{ return tc_message; }}

static int tc_fail(int status, const char *format, ...) {{
    va_list args;
    va_start(args, format);
    vsnprintf(tc_message, sizeof tc_message, format, args);
    va_end(args);
    return status;
}}

static pthread_once_t tc_once = PTHREAD_ONCE_INIT;
static long tc_threads = 0;  /* 0: not chosen yet */

static void tc_start(void) {{
    if (tc_threads == 0) {{
        const char *env = getenv("TCLANG_NUM_THREADS");
        tc_threads = env && *env ? atol(env) : sysconf(_SC_NPROCESSORS_ONLN);
    }}
    if (tc_threads < 1) tc_threads = 1;
    tclang_pool_configure(tc_threads - 1);
    pthread_atfork(NULL, NULL, tclang_pool_forget);  /* a child has none of our threads */
}}

void tclang_{name}_set_num_threads(int n) {{ tc_threads = n < 1 ? 1 : n; }}

static inline int64_t tc_count(int rank, const int64_t *extents) {{
    int64_t n = 1;
    for (int d = 0; d < rank; d++) n *= extents[d];
    return n;
}}

static inline void tc_contiguous(int rank, const int64_t *extents, int64_t *strides) {{
    int64_t step = 1;
    for (int d = rank - 1; d >= 0; d--) {{
        strides[d] = step;
        step *= extents[d] > 1 ? extents[d] : 1;
    }}
}}

static inline int tc_is_contiguous(int rank, const int64_t *extents, const int64_t *strides) {{
    int64_t expected[TC_MAX_SUBSCRIPTS > 16 ? TC_MAX_SUBSCRIPTS : 16];
    if (rank > 16) return 0;
    tc_contiguous(rank, extents, expected);
    for (int d = 0; d < rank; d++)
        if (extents[d] > 1 && strides[d] != expected[d]) return 0;
    return 1;
}}

static inline void *tc_allocate(int rank, const int64_t *extents, size_t item, int zero) {{
    size_t n = 1;
    for (int d = 0; d < rank; d++) {{
        if (extents[d] != 0 && n > SIZE_MAX / item / (size_t)extents[d]) return NULL;
        n *= (size_t)extents[d];
    }}
    n = n ? n : 1;
    return zero ? calloc(n, item) : malloc(n * item);
}}

static inline void tc_zero(char *data, int rank, const int64_t *extents, const int64_t *strides,
                    size_t item) {{
    if (rank == 0) {{ memset(data, 0, item); return; }}
    for (int64_t i = 0; i < extents[0]; i++)
        tc_zero(data + i * strides[0] * (int64_t)item, rank - 1, extents + 1, strides + 1, item);
}}

static int tc_index_error(const int64_t *err, const char *const *names, const int *ranks,
                          const int *offsets, const int64_t *extents,
                          const char *const *statements, const int *lines) {{
    int64_t tensor = err[1], dim = err[2], value = err[3], statement = err[4], n = err[5];
    char shape[256] = "(", element[256] = "";
    size_t used = 1;
    for (int d = 0; d < ranks[tensor]; d++)
        used += snprintf(shape + used, used < sizeof shape ? sizeof shape - used : 0,
                         d + 1 < ranks[tensor] || ranks[tensor] == 1 ? "%lld, " : "%lld",
                         (long long)extents[offsets[tensor] + d]);
    if (ranks[tensor] == 1 && used >= 2 && used < sizeof shape) shape[used - 1] = 0;
    strncat(shape, ")", sizeof shape - strlen(shape) - 1);
    if (n > 0) {{
        size_t at = snprintf(element, sizeof element, "%s[", names[tensor]);
        for (int64_t k = 0; k < n && k < TC_MAX_SUBSCRIPTS && at < sizeof element; k++)
            at += snprintf(element + at, sizeof element - at, k ? ", %lld" : "%lld",
                           (long long)err[6 + k]);
        if (at < sizeof element) snprintf(element + at, sizeof element - at, "]");
    }} else {{
        snprintf(element, sizeof element, "%s", names[tensor]);
    }}
    return tc_fail(TCLANG_INDEX_ERROR, "index %lld is out of bounds for dimension %lld of "
                   "%s (shape %s): element %s in `%s` (line %d); nothing outside the array "
                   "was accessed", (long long)value, (long long)dim, names[tensor], shape,
                   element, statements[statement], lines[statement]);
}}
"""]
