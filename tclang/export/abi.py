"""The C source around an exported kernel: what the Python runtime does before and after
a kernel call, as C that needs no Python.

`Wrapper(defn, info, sizes, static)` writes, for entry E:
- `tc_bind`: every size from the inputs' extents (each name bound once, consistently), the
  definition's obligations, the sizes a specialized library was made for, and the sizes
  that make a read leave its tensor (isl's predicate, printed as C);
- `tclang_E_output_shape` and `tclang_E_error`;
- `tclang_E` itself: the arguments' extents and strides (NULL strides: C-contiguous), the
  outputs' shapes checked, every argument's element count and byte span checked for 64-bit
  overflow (before the NULL check: 2^62 x 4 elements must not count as none), the outputs
  checked as tclang/runtime/arguments.py checks `out=` (no element shared within one, nor with an
  input or another output), then the target's part: on the CPU (`cpu_source`), temporaries
  allocated, outputs zeroed where no statement writes, `tclang_main` called with the native
  thread pool; on CUDA (`cuda_source`), the same on the device around the launches.

A gather out of its tensor fills the kernel's error record; the wrapper turns it into the
message `TCIndexError` carries and returns TCLANG_INDEX_ERROR.
"""

from __future__ import annotations

import numpy as np

from tclang.export.c_text import C_TYPES, PRELUDE, c_string, index_c, size_c, size_variable
from tclang.errors import TCError
from tclang.lang.program import Definition

STATUS = {"TCLANG_OK": 0, "TCLANG_BAD_ARGUMENT": 1, "TCLANG_BAD_SIZES": 2,
          "TCLANG_INDEX_ERROR": 3, "TCLANG_OUT_OF_MEMORY": 4, "TCLANG_CUDA_ERROR": 5}


def parameters(defn: Definition) -> list[str]:
    """Each argument as `T *X, const int64_t *X_sizes, const int64_t *X_strides`."""
    return [f"{'const ' if t.role == 'input' else ''}{C_TYPES[t.dtype]} *{t.name}, "
            f"const int64_t *{t.name}_sizes, const int64_t *{t.name}_strides"
            for t in defn.inputs + defn.outputs]


def shape_parameters(defn: Definition) -> str:
    return ", ".join(f"const int64_t *{t.name}_sizes" for t in defn.inputs) or "void *unused"


class Wrapper:
    def __init__(self, defn: Definition, info, sizes: dict | None, static: bool):
        """`info`: the compiled kernel's KernelInfo; `static`: the kernel's sizes and
        strides are constants in its code (then arguments must be C-contiguous)."""
        self.defn, self.info, self.sizes, self.static = defn, info, sizes, static
        self.name = defn.name
        self.buffers = info.buffers
        self.n_args = len(defn.inputs) + len(defn.outputs)
        self.size_names = list(dict.fromkeys([*defn.sizes, *info.sizes]))
        self.shape_args = ", ".join(f"{t.name}_sizes" for t in defn.inputs) or "NULL"

    # ---- both targets ----
    def common(self) -> list[str]:
        """Includes, helpers, tc_bind and the output-shape function."""
        out = ["#include <stdint.h>", "#include <stdio.h>", "#include <stdlib.h>",
               "#include <string.h>", "#include <stdarg.h>", "", PRELUDE, _SUPPORT,
               f"const char *tclang_{self.name}_error(void) {{ return tc_message; }}", ""]
        return out + self.bind() + self.output_shape()

    def bind(self) -> list[str]:
        defn, name = self.defn, self.name
        out = [f"static int tc_bind({shape_parameters(defn)}, int64_t *sizes) {{"]
        for s in self.size_names:
            out.append(f"    int64_t {size_variable(s)} = -1; (void){size_variable(s)};")
        bound: dict[str, str] = {}
        for position, t in enumerate(defn.inputs, start=1):
            if t.rank:
                out.append(f"    if (!{t.name}_sizes) return tc_fail(TCLANG_BAD_ARGUMENT, "
                           f"\"{t.name}_sizes is NULL (argument {position} has rank "
                           f"{t.rank})\");")
            for dim, extent in enumerate(t.shape):
                given = f"{t.name}_sizes[{dim}]"
                where = f"dimension {dim} of {t.name}"
                out.append(f"    if ({given} < 0) return tc_fail(TCLANG_BAD_SIZES, "
                           f"\"{where} has a negative extent %lld\", (long long){given});")
                if extent.constant is not None:
                    out.append(f"    if ({given} != {extent.constant}) return tc_fail("
                               f"TCLANG_BAD_SIZES, \"argument {position} ({t.name}) of {name} "
                               f"must have extent {extent.constant} in dimension {dim}, but "
                               f"it has %lld\", (long long){given});")
                    continue
                size = str(extent)
                var = size_variable(size)
                if size not in bound:
                    bound[size] = where
                    out.append(f"    {var} = {given};")
                else:
                    out.append(f"    if ({given} != {var}) return tc_fail(TCLANG_BAD_SIZES, "
                               f"\"size {size} of {name} is %lld by {bound[size]} but %lld "
                               f"by {where} (argument {position}); every dimension named "
                               f"{size} must have the same extent\", (long long){var}, "
                               f"(long long){given});")
        unbound = [s for s in self.size_names if s not in bound]
        if unbound:
            raise TCError(f"export of {name}: the size{'s' if len(unbound) > 1 else ''} "
                          f"{', '.join(unbound)} cannot be bound from the inputs' extents")
        for s, value in (self.sizes or {}).items():
            out.append(f"    if ({size_variable(s)} != {int(value)}) return tc_fail("
                       f"TCLANG_BAD_SIZES, \"this library of {name} was exported for "
                       f"{s}={int(value)}, not %lld; export it with --generic for any "
                       f"sizes\", (long long){size_variable(s)});")
        for ob in defn.obligations:
            relation = ">= 0" if ob.relation == ">=" else "== 0"
            out.append(f"    if (!({size_c(ob.expr)} {relation})) return tc_fail("
                       f"TCLANG_BAD_SIZES, \"%s\", {c_string(ob.message)});")
        for condition in self.info.bounds:
            out.append(f"    if ({index_c(condition.predicate)}) return tc_fail("
                       f"TCLANG_BAD_SIZES, \"%s\", {c_string(condition.message)});")
        for k, s in enumerate(self.size_names):
            out.append(f"    sizes[{k}] = {size_variable(s)};")
        return out + ["    return TCLANG_OK;", "}", ""]

    def unpack_sizes(self) -> list[str]:
        out = [f"    int64_t sizes[{max(1, len(self.size_names))}];",
               f"    int status = tc_bind({self.shape_args}, sizes);",
               "    if (status != TCLANG_OK) return status;"]
        return out + [f"    const int64_t {size_variable(s)} = sizes[{k}]; "
                      f"(void){size_variable(s)};" for k, s in enumerate(self.size_names)]

    def output_shape(self) -> list[str]:
        out = [f"int tclang_{self.name}_output_shape(int output, "
               f"{shape_parameters(self.defn)}, int64_t *shape) {{"]
        out += self.unpack_sizes()
        out.append("    switch (output) {")
        for k, t in enumerate(self.defn.outputs):
            out.append(f"    case {k}:")
            if t.rank:
                out.append(f"        if (!shape) return tc_fail(TCLANG_BAD_ARGUMENT, \"shape "
                           f"is NULL (output {k}, {t.name}, has rank {t.rank})\");")
            for dim, extent in enumerate(t.shape):
                out.append(f"        shape[{dim}] = {size_c(extent)};")
            out.append("        return TCLANG_OK;")
        return out + ["    }", f"    return tc_fail(TCLANG_BAD_ARGUMENT, \"{self.name} has no "
                              "output %d\", output);", "}", ""]

    def prologue(self) -> list[str]:
        """The call's start: sizes bound and checked, then every buffer's extents and
        strides (`extents`, `strides`, buffer by buffer), the outputs' shapes checked."""
        out = self.unpack_sizes()
        total = sum(len(b.shape) for b in self.buffers)
        out.append(f"    int64_t extents[{max(1, total)}], strides[{max(1, total)}];")
        out.append(f"    tc_array arrays[{max(1, self.n_args)}]; (void)arrays;")
        for k, b, position, item in self.buffer_positions():
            rank = len(b.shape)
            for dim, extent in enumerate(b.shape):
                out.append(f"    extents[{position + dim}] = {index_c(extent)};")
            out.append(f"    tc_contiguous({rank}, extents + {position}, strides + {position});")
            if k < self.n_args:
                out += self._argument_checks(k, b, position, item)
        return out + self._overlap_checks()

    def _argument_checks(self, k: int, b, position: int, item: int) -> list[str]:
        rank = len(b.shape)
        out = []
        if rank:
            out.append(f"    if ({b.name}_strides) memcpy(strides + {position}, "
                       f"{b.name}_strides, {rank} * sizeof(int64_t));")
        if k >= len(self.defn.inputs):
            out.append(f"    if (!{b.name}_sizes && {rank}) return tc_fail("
                       f"TCLANG_BAD_ARGUMENT, \"{b.name}_sizes is NULL\");")
            for dim in range(rank):
                out.append(f"    if ({b.name}_sizes[{dim}] != extents[{position + dim}]) "
                           f"return tc_fail(TCLANG_BAD_SIZES, \"output {b.name} must have "
                           f"extent %lld in dimension {dim}, but it has %lld\", "
                           f"(long long)extents[{position + dim}], "
                           f"(long long){b.name}_sizes[{dim}]);")
        out.append(f"    if (tc_describe(&arrays[{k}], {b.name}, {rank}, extents + {position}, "
                   f"strides + {position}, {item})) return tc_fail(TCLANG_BAD_SIZES, "
                   f"\"argument {k + 1} ({b.name}): its element count, or the bytes its "
                   f"strides span from its pointer, do not fit 64 bits\");")
        out.append(f"    if (!{b.name} && arrays[{k}].count > 0) "
                   f"return tc_fail(TCLANG_BAD_ARGUMENT, \"{b.name} is NULL\");")
        if self.static:
            out.append(f"    if (!tc_is_contiguous({rank}, extents + {position}, "
                       f"strides + {position})) return tc_fail(TCLANG_BAD_ARGUMENT, "
                       f"\"{b.name} must be C-contiguous: this library was exported for "
                       f"fixed sizes and layouts (export it with --generic for any "
                       f"strides)\");")
        return out

    def _overlap_checks(self) -> list[str]:
        """The outputs as tclang/runtime/arguments.py's check_out takes them: no two points of one
        output in the same memory (a stride of 0), and no output sharing memory with an
        input (inputs are never modified, and a kernel reads them after it has begun to
        write) or with another output."""
        n_inputs, out = len(self.defn.inputs), []
        for k in range(n_inputs, self.n_args):
            name = self.buffers[k].name
            out.append(f"    if (tc_overlaps_itself(&arrays[{k}])) return tc_fail("
                       f"TCLANG_BAD_ARGUMENT, \"output {name} has overlapping elements (a "
                       f"stride of 0, or strides that put two points in one place): give it "
                       f"memory of its own\");")
            for j in range(k):
                other, why = ((f"input {self.buffers[j].name}", "inputs are never modified")
                              if j < n_inputs else
                              (f"output {self.buffers[j].name}", "each output is written"))
                out.append(f"    if (tc_shares_memory(&arrays[{k}], &arrays[{j}])) return "
                           f"tc_fail(TCLANG_BAD_ARGUMENT, \"output {name} shares memory "
                           f"with {other} (argument {j + 1}): {why}, give the output a "
                           f"separate array\");")
        return out

    def buffer_positions(self):
        """(index, buffer, where its extents start, item size) of every buffer."""
        position = 0
        for k, b in enumerate(self.buffers):
            yield k, b, position, np.dtype(b.dtype.numpy).itemsize
            position += len(b.shape)

    def index_error(self, indent: str, result: str = "return ") -> list[str]:
        """Lines that turn a filled error record `err` into TCLANG_INDEX_ERROR (returned,
        or assigned with `result="result = "`)."""
        buffers, info = self.buffers, self.info
        names = ", ".join(c_string(b.name) for b in buffers) or "NULL"
        ranks = ", ".join(str(len(b.shape)) for b in buffers) or "0"
        offsets = ", ".join(str(p) for _, _, p, _ in self.buffer_positions()) or "0"
        statements = ", ".join(c_string(text) for _, text, _ in info.statements) or "NULL"
        lines = ", ".join(str(line) for _, _, line in info.statements) or "0"
        return [f"{indent}static const char *const names[] = {{{names}}};",
                f"{indent}static const int ranks[] = {{{ranks}}};",
                f"{indent}static const int offsets[] = {{{offsets}}};",
                f"{indent}static const char *const statements[] = {{{statements}}};",
                f"{indent}static const int lines[] = {{{lines}}};",
                f"{indent}{result}tc_index_error(err, names, ranks, offsets, extents, "
                "statements, lines);"]

    # ---- the CPU ----
    def cpu_source(self) -> str:
        """The C file of a CPU library: around `tclang_main`, on the native thread pool."""
        name, buffers = self.name, self.buffers
        pointer_params = ", ".join(["void *"] * len(buffers))
        out = [f"/* {name}.c: generated by `tclang export`: the C ABI around the kernel. */",
               "#include <pthread.h>", "#include <unistd.h>", f'#include "{name}.h"']
        out += self.common()
        out += [f"extern int32_t tclang_main({pointer_params}{', ' if buffers else ''}"
                "const int64_t *, const int64_t *, int64_t *, void *);",
                "extern void tclang_parallel_for(void (*)(void *, int64_t, int64_t), void *, "
                "int64_t, int64_t);",
                "extern void tclang_pool_configure(int64_t);",
                "extern void tclang_pool_forget(void);", "", _CPU_THREADS.replace("ENTRY", name)]
        params = ",\n    ".join(parameters(self.defn))
        out.append(f"int tclang_{name}(\n    {params}) {{")
        out += self.prologue()
        temporaries = []
        for k, b, position, item in self.buffer_positions():
            rank = len(b.shape)
            if k >= self.n_args:
                zero = 1 if b.name in self.info.zero_fill else 0
                out.append(f"    void *tmp_{k} = tc_allocate({rank}, extents + {position}, "
                           f"{item}, {zero});")
                out.append(f"    if (!tmp_{k}) {{ {_free(temporaries)}return tc_fail("
                           f"TCLANG_OUT_OF_MEMORY, \"cannot allocate the temporary "
                           f"{b.name}\"); }}")
                temporaries.append(f"tmp_{k}")
            elif k >= len(self.defn.inputs) and b.name in self.info.zero_fill:
                out.append(f"    tc_zero((char *){b.name}, {rank}, extents + {position}, "
                           f"strides + {position}, {item});")
        pointers = [f"(void *){b.name}" if k < self.n_args else f"tmp_{k}"
                    for k, b in enumerate(buffers)]
        values = ", ".join(size_variable(s) for s in self.info.sizes) or "0"
        out += [f"    const int64_t kernel_sizes[{max(1, len(self.info.sizes))}] = {{{values}}};",
                "    int64_t err[TC_ERR_FIELDS] = {0};",
                "    pthread_once(&tc_once, tc_start);"]
        args = ", ".join(pointers + ["kernel_sizes", "strides", "err",
                                     "tc_threads > 1 ? (void *)tclang_parallel_for : NULL"])
        out += [f"    int32_t code = tclang_main({args});", f"    {_free(temporaries)}",
                "    if (code != 0) {", *self.index_error("        "), "    }",
                "    return TCLANG_OK;", "}", ""]
        return "\n".join(out)


def _free(names: list[str]) -> str:
    return "".join(f"free({n}); " for n in names)


_CPU_THREADS = """\
static pthread_once_t tc_once = PTHREAD_ONCE_INIT;
static long tc_threads = 0;  /* 0: not chosen yet */

static void tc_start(void) {
    if (tc_threads == 0) {
        const char *env = getenv("TCLANG_NUM_THREADS");
        tc_threads = env && *env ? atol(env) : sysconf(_SC_NPROCESSORS_ONLN);
    }
    if (tc_threads < 1) tc_threads = 1;
    tclang_pool_configure(tc_threads - 1);
    pthread_atfork(NULL, NULL, tclang_pool_forget);  /* a child has none of our threads */
}

void tclang_ENTRY_set_num_threads(int n) { tc_threads = n < 1 ? 1 : n; }
"""


def _support_text() -> str:
    from backends.access_errors import ERR_FIELDS, MAX_SUBSCRIPTS
    return f"""\
#define TC_ERR_FIELDS {ERR_FIELDS}
#define TC_MAX_SUBSCRIPTS {MAX_SUBSCRIPTS}
#ifdef __cplusplus
#define TC_THREAD_LOCAL thread_local
#else
#define TC_THREAD_LOCAL _Thread_local
#endif

static TC_THREAD_LOCAL char tc_message[1024];

static int tc_fail(int status, const char *format, ...) {{
    va_list args;
    va_start(args, format);
    vsnprintf(tc_message, sizeof tc_message, format, args);
    va_end(args);
    return status;
}}

/* An argument as the checks of tclang/runtime/arguments.py see it: its elements' byte range
   [lo, hi) in the address space, and how many there are. */
typedef struct {{
    const char *data;
    int rank;
    const int64_t *extents, *strides;  /* strides in elements */
    int64_t item, count, lo, hi;
}} tc_array;

/* The element count, or -1 when an extent is negative or the count does not fit 64 bits
   (2^62 x 4 must not wrap to 0 and let a NULL pointer pass as an empty array). */
static inline int64_t tc_count(int rank, const int64_t *extents) {{
    int64_t n = 1;
    for (int d = 0; d < rank; d++)
        if (extents[d] < 0) return -1;
    for (int d = 0; d < rank; d++)
        if (extents[d] == 0) return 0;
    for (int d = 0; d < rank; d++)
        if (__builtin_mul_overflow(n, extents[d], &n)) return -1;
    return n;
}}

/* Fill `a`; 1 if its element count, the bytes its strides span, or the addresses they
   reach from `data` do not fit 64 bits. */
static inline int tc_describe(tc_array *a, const void *data, int rank, const int64_t *extents,
                              const int64_t *strides, int64_t item) {{
    int64_t low = 0, high = 0, step, first, last;
    a->data = (const char *)data; a->rank = rank; a->extents = extents;
    a->strides = strides; a->item = item; a->lo = a->hi = 0;
    a->count = tc_count(rank, extents);
    if (a->count <= 0) return a->count < 0;
    for (int d = 0; d < rank; d++) {{
        if (__builtin_mul_overflow(strides[d], extents[d] - 1, &step)) return 1;
        if (__builtin_add_overflow(step < 0 ? low : high, step, step < 0 ? &low : &high))
            return 1;
    }}
    if (__builtin_mul_overflow(low, item, &first) || __builtin_mul_overflow(high, item, &last)
        || __builtin_add_overflow(last, item, &last)) return 1;
    if (!data) return 0;  /* refused as NULL by the caller */
    if (__builtin_add_overflow((int64_t)(uintptr_t)data, first, &a->lo) || a->lo < 0 ||
        __builtin_add_overflow((int64_t)(uintptr_t)data, last, &a->hi)) return 1;
    return 0;
}}

static inline int tc_compare(const void *x, const void *y) {{
    int64_t a = *(const int64_t *)x, b = *(const int64_t *)y;
    return (a > b) - (a < b);
}}

/* The sorted addresses of an array's elements, or NULL (too many to list: over 2^24, as
   tclang/runtime/arguments.py decides; or no memory). */
static inline int64_t *tc_addresses(const tc_array *a) {{
    int64_t index[32] = {{0}}, *out;
    if (a->count > ((int64_t)1 << 24) || a->rank > 32) return NULL;
    out = (int64_t *)malloc((size_t)a->count * sizeof *out);
    if (!out) return NULL;
    uint64_t at = (uint64_t)(uintptr_t)a->data;  /* unsigned: a step past the end wraps */
    for (int64_t k = 0; k < a->count; k++) {{
        out[k] = (int64_t)at;
        for (int d = a->rank - 1; d >= 0; d--) {{
            at += (uint64_t)a->strides[d] * (uint64_t)a->item;
            if (++index[d] < a->extents[d]) break;
            at -= (uint64_t)a->strides[d] * (uint64_t)a->item * (uint64_t)a->extents[d];
            index[d] = 0;
        }}
    }}
    qsort(out, (size_t)a->count, sizeof *out, tc_compare);
    return out;
}}

/* Whether two elements of `a` share memory (a stride of 0, interleaving strides), as
   tclang/runtime/arguments.py's _overlaps_itself: the dimensions sorted by stride must each step
   over all that the smaller ones span (every layout NumPy makes); else the addresses are
   listed and compared (too many to list counts as overlapping). */
static inline int tc_overlaps_itself(const tc_array *a) {{
    int64_t size[32], extent[32], span = a->item;
    int n = 0;
    if (a->count <= 1) return 0;
    if (a->rank > 32) return 1;
    for (int d = 0; d < a->rank; d++) {{
        if (a->extents[d] <= 1) continue;
        int64_t s = (a->strides[d] < 0 ? -a->strides[d] : a->strides[d]) * a->item;
        int at = n++;
        for (; at > 0 && size[at - 1] > s; at--) {{
            size[at] = size[at - 1]; extent[at] = extent[at - 1];
        }}
        size[at] = s; extent[at] = a->extents[d];
    }}
    int ordered = 1;
    for (int k = 0; k < n && ordered; k++) {{
        if (size[k] < span) ordered = 0;
        else span += size[k] * (extent[k] - 1);
    }}
    if (ordered) return 0;
    int64_t *at = tc_addresses(a);
    int overlaps = at == NULL;
    for (int64_t k = 1; at && k < a->count && !overlaps; k++)
        overlaps = at[k] - at[k - 1] < a->item;
    free(at);
    return overlaps;
}}

/* Whether `a` and `b` have a byte in common, as tclang/runtime/arguments.py's shares_memory:
   disjoint byte ranges do not; where the ranges meet, the elements' addresses are compared
   (interleaved views such as base[0::2] and base[1::2] do not share), and arrays too
   large to list count as sharing. */
static inline int tc_shares_memory(const tc_array *a, const tc_array *b) {{
    if (a->count <= 0 || b->count <= 0 || a->hi <= b->lo || b->hi <= a->lo) return 0;
    if (a->lo == b->lo) return 1;
    int64_t *x = tc_addresses(a), *y = x ? tc_addresses(b) : NULL;
    int shares = y == NULL;
    for (int64_t i = 0, j = 0; y && i < a->count && j < b->count && !shares;) {{
        if (x[i] + a->item <= y[j]) i++;
        else if (y[j] + b->item <= x[i]) j++;
        else shares = 1;
    }}
    free(x);
    free(y);
    return shares;
}}

static inline void tc_contiguous(int rank, const int64_t *extents, int64_t *strides) {{
    int64_t step = 1;
    for (int d = rank - 1; d >= 0; d--) {{
        strides[d] = step;
        step *= extents[d] > 1 ? extents[d] : 1;
    }}
}}

static inline int tc_is_contiguous(int rank, const int64_t *extents, const int64_t *strides) {{
    int64_t expected[32];
    if (rank > 32) return 0;
    tc_contiguous(rank, extents, expected);
    for (int d = 0; d < rank; d++)
        if (extents[d] > 1 && strides[d] != expected[d]) return 0;
    return 1;
}}

static inline size_t tc_bytes(int rank, const int64_t *extents, size_t item) {{
    size_t n = 1;  /* 0: too big for memory */
    for (int d = 0; d < rank; d++) {{
        if (extents[d] != 0 && n > SIZE_MAX / item / (size_t)extents[d]) return 0;
        n *= (size_t)extents[d];
    }}
    return (n ? n : 1) * item;
}}

static inline void *tc_allocate(int rank, const int64_t *extents, size_t item, int zero) {{
    size_t bytes = tc_bytes(rank, extents, item);
    if (bytes == 0) return NULL;
    return zero ? calloc(bytes / item, item) : malloc(bytes);
}}

static inline void tc_zero(char *data, int rank, const int64_t *extents,
                           const int64_t *strides, size_t item) {{
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
"""


_SUPPORT = _support_text()
