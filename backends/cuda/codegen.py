"""GPU-mapped loop IR -> CUDA C: one `__global__` function per launch.

Codegen is printing: one emitter per loop-IR node, one per expression node. Every kernel
takes the buffers, the sizes, the strides (in elements) and an error record; block and
thread ids become `b0 = blockIdx.x`... Index arithmetic is 32-bit where it provably fits
(a specialized kernel whose every size and buffer offset is below 2^30: GPU integer units
are 32-bit, and 64-bit multiplies and divisions cost several instructions each), else
64-bit; gathered subscripts are always 64-bit. The language's integer
division and remainder (Python's), saturating float -> int casts and half-precision
(`__half`) and bfloat16 (`__nv_bfloat16`) storage come from small device helpers at the top of the file. Under TCLANG_EMULATION each
kernel also gets an `extern "C"` host entry that runs it with the CPU emulation of the
thread model (backends/cuda/emulation).
"""

from __future__ import annotations

from dataclasses import dataclass

from backends.cuda.tile_kernels import TileEmitter, shared_bytes
from polyhedral import loop_ir as L
from tclang.lang import program as P
from tclang.dtypes import DType, identity, round_float

CTYPES = {DType.BOOL: "bool", DType.UINT8: "unsigned char", DType.UINT16: "unsigned short",
          DType.UINT32: "unsigned int", DType.UINT64: "unsigned long long",
          DType.INT8: "signed char", DType.INT16: "short", DType.INT32: "int",
          DType.INT64: "long long", DType.FLOAT16: "__half", DType.BFLOAT16: "__nv_bfloat16",
          DType.FLOAT32: "float", DType.FLOAT64: "double"}


def _register_ctype(dtype: DType) -> str:
    """The C type a value of `dtype` is computed in (half and bfloat16: float)."""
    return "float" if dtype.is_narrow_float else CTYPES[dtype]

PRELUDE = r"""
#ifndef TCLANG_EMULATION
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#endif
#include <math.h>
#define TC_DEV __device__ __forceinline__
template <class T> TC_DEV T tc_min(T a, T b) { return a < b ? a : b; }
template <class T> TC_DEV T tc_max(T a, T b) { return a > b ? a : b; }
TC_DEV long long tc_floordiv(long long a, long long b) {
  long long q = a / b, r = a % b; return (r != 0 && ((r < 0) != (b < 0))) ? q - 1 : q; }
TC_DEV long long tc_floormod(long long a, long long b) {
  long long r = a % b; return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r; }
TC_DEV int tc_floordiv(int a, int b) {
  int q = a / b, r = a % b; return (r != 0 && ((r < 0) != (b < 0))) ? q - 1 : q; }
TC_DEV int tc_floormod(int a, int b) {
  int r = a % b; return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r; }
template <class T> TC_DEV T tc_idiv(T a, T b) {            /* Python's //, 0 for b == 0 */
  if (b == 0) return 0;
  if ((T)(b + 1) == 0 && (T)-1 < 0) return (T)(0 - a);
  T q = a / b, r = a % b; return (r != 0 && ((r < 0) != (b < 0))) ? (T)(q - 1) : q; }
template <class T> TC_DEV T tc_imod(T a, T b) {            /* Python's %, 0 for b == 0 */
  if (b == 0) return 0;
  if ((T)(b + 1) == 0 && (T)-1 < 0) return 0;
  T r = a % b; return (r != 0 && ((r < 0) != (b < 0))) ? (T)(r + b) : r; }
template <class T> TC_DEV T tc_fmod(T a, T b) {            /* float % with the divisor's sign */
  T r = fmod(a, b); r = (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
  return r == 0 ? copysign(T(0), b) : r; }                /* a zero has b's sign, as in Python */
template <class I, class F> TC_DEV I tc_f2i(F x, I lo, I hi) {  /* saturating, NaN -> 0 */
  if (x != x) return 0;
  if (x <= (F)lo) return lo;
  if (x >= (F)hi) return hi;
  return (I)x; }
TC_DEV float tc_round_half(float x) { return __half2float(__float2half_rn(x)); }
TC_DEV float tc_round_half(double x) { return __half2float(__double2half(x)); }  /* once */
TC_DEV float tc_round_bf16(float x) { return __bfloat162float(__float2bfloat16_rn(x)); }
TC_DEV float tc_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
TC_DEV double tc_sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }
template <class... S>
TC_DEV bool tc_inside(long long value, long long extent, long long* err, long long tensor,
                      long long dim, long long stmt, S... element) {  /* a checked subscript */
  if (value >= 0 && value < extent) return true;
  if (atomicCAS((unsigned long long*)err, 0ULL, 1ULL) == 0ULL) {
    long long subs[] = {(long long)element..., 0};
    const int n = (int)sizeof...(S);
    err[1] = tensor; err[2] = dim; err[3] = value; err[4] = stmt; err[5] = n;
    for (int k = 0; k < n && k < 8; ++k) err[6 + k] = subs[k]; }
  return false; }
"""

# what tile contractions (backends/cuda/tile_kernels.py) need: the tensor cores' fragments
# and 16-byte copies into shared memory, asynchronous on sm_80 and later
TILE_PRELUDE = r"""
#ifndef TCLANG_EMULATION
#include <mma.h>
#endif
#if defined(TCLANG_EMULATION)
TC_DEV void tc_cp16(void* d, const void* s, bool ok) {
  if (ok) memcpy(d, s, 16); else memset(d, 0, 16); }
TC_DEV void tc_cp_commit() {}
template <int N> TC_DEV void tc_cp_wait() {}
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
TC_DEV void tc_cp16(void* d, const void* s, bool ok) {
  const unsigned at = (unsigned)__cvta_generic_to_shared(d);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" :: "r"(at), "l"(s),
               "r"(ok ? 16 : 0)); }
TC_DEV void tc_cp_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> TC_DEV void tc_cp_wait() { asm volatile("cp.async.wait_group %0;\n" :: "n"(N)); }
#else
TC_DEV void tc_cp16(void* d, const void* s, bool ok) {
  *(uint4*)d = ok ? *(const uint4*)s : make_uint4(0u, 0u, 0u, 0u); }
TC_DEV void tc_cp_commit() {}
template <int N> TC_DEV void tc_cp_wait() {}
#endif
"""

# a block's result combined into a value many blocks share (reductions across blocks)
ATOMIC_PRELUDE = r"""
TC_DEV void tc_atomic_add(float* p, float v) { atomicAdd(p, v); }
TC_DEV void tc_atomic_add(double* p, double v) { atomicAdd(p, v); }
TC_DEV void tc_atomic_add(int* p, int v) { atomicAdd(p, v); }
TC_DEV void tc_atomic_add(unsigned* p, unsigned v) { atomicAdd(p, v); }
TC_DEV void tc_atomic_add(long long* p, long long v) {
  atomicAdd((unsigned long long*)p, (unsigned long long)v); }
TC_DEV void tc_atomic_add(unsigned long long* p, unsigned long long v) { atomicAdd(p, v); }
template <class T> TC_DEV void tc_atomic_min(T* p, T v) { atomicMin(p, v); }
template <class T> TC_DEV void tc_atomic_max(T* p, T v) { atomicMax(p, v); }
/* floats: compare-and-swap on the bits, fmin/fmax as the language's min and max */
TC_DEV void tc_atomic_min(float* p, float v) {
  int* q = (int*)p; int old = *q, seen;
  do { seen = old; const int next = __float_as_int(fminf(__int_as_float(seen), v));
       if (next == seen) return; old = atomicCAS(q, seen, next); } while (old != seen); }
TC_DEV void tc_atomic_max(float* p, float v) {
  int* q = (int*)p; int old = *q, seen;
  do { seen = old; const int next = __float_as_int(fmaxf(__int_as_float(seen), v));
       if (next == seen) return; old = atomicCAS(q, seen, next); } while (old != seen); }
TC_DEV void tc_atomic_min(double* p, double v) {
  unsigned long long* q = (unsigned long long*)p; unsigned long long old = *q, seen;
  do { seen = old; const unsigned long long next = (unsigned long long)__double_as_longlong(
         fmin(__longlong_as_double((long long)seen), v));
       if (next == seen) return; old = atomicCAS(q, seen, next); } while (old != seen); }
TC_DEV void tc_atomic_max(double* p, double v) {
  unsigned long long* q = (unsigned long long*)p; unsigned long long old = *q, seen;
  do { seen = old; const unsigned long long next = (unsigned long long)__double_as_longlong(
         fmax(__longlong_as_double((long long)seen), v));
       if (next == seen) return; old = atomicCAS(q, seen, next); } while (old != seen); }
"""
_ATOMIC = {"+": "add", "min": "min", "max": "max"}

NARROW_LIMIT = 1 << 30  # sizes and offsets below this: 32-bit indices, no overflow in sums
JAM = 16  # at most this many points of a thread's loops share one reduction loop
WIDE_STEP = 1 << 20  # a loop stepping this far counts in 64 bits (a grid-stride loop)

#: index operators: C's, and the prelude's helpers for the rest
_OPERATORS = {**L.C_OPERATORS, "floordiv": "tc_floordiv({0}, {1})",
              "floormod": "tc_floormod({0}, {1})", "min": "tc_min({0}, {1})",
              "max": "tc_max({0}, {1})"}

_MATH_DOUBLE = {"abs": "fabs", "min": "fmin", "max": "fmax", "fdivide": None,
                "sigmoid": "tc_sigmoid"}


@dataclass(frozen=True)
class KernelSource:
    """The generated file, and the launches in order: each its function name, the launch,
    and the host-side condition on the sizes under which it runs (None: always)."""

    text: str
    launches: tuple[tuple[str, L.Launch, L.IExpr | None], ...]
    shared: tuple[int, ...] = ()  # each launch's dynamic shared memory, bytes


def generate(kernel: L.Kernel) -> KernelSource:
    """The CUDA C of `kernel`, as its `choices` say (bounds checks; accumulators in
    registers or, without `private_memory`, in global memory)."""
    return _Generator(kernel, kernel.choices.check_bounds,
                      kernel.choices.private_memory).run()


class _Generator:
    def __init__(self, kernel: L.Kernel, check_bounds: bool, private_memory: bool = True):
        self.kernel = kernel
        self.check_bounds = check_bounds
        self.private_memory = private_memory
        # (a partly generic kernel is generic here: its constants are in its expressions)
        self.specialized = dict(kernel.size_values) if kernel.specialized else None
        self.lines: list[str] = []
        self.buffers = {b.name: b for b in kernel.buffers}
        self.local: dict[str, L.Buffer] = {}
        self.lets = 0  # C variables of lets so far: unique in the file
        narrow = _fits_32_bits(kernel)
        self.itype = "int" if narrow else "long long"  # index arithmetic's C type
        self.suffix = "" if narrow else "LL"  # ... and its literals' suffix

    def run(self) -> KernelSource:
        out = [PRELUDE]
        nodes = list(L.walk_nodes(self.kernel.body))
        if any(isinstance(n, L.TileContraction) for n in nodes):
            out.append(TILE_PRELUDE)
        if any(isinstance(n, L.Combine) and n.atomic for n in nodes) or \
                any(s.scatter for s in self.kernel.statements):
            out.append(ATOMIC_PRELUDE)
        launches = []
        for k, (launch, condition) in enumerate(_launches(self.kernel.body, None)):
            name = f"tclang_{self.kernel.name}_{k}"
            out.append(self.kernel_function(name, launch))
            launches.append((name, launch, condition))
        shared = tuple(sum(shared_bytes(n) for n in L.walk_nodes(launch)
                           if isinstance(n, L.TileContraction))
                       for _, launch, _ in launches)
        return KernelSource("\n".join(out), tuple(launches), shared)

    # ---- one __global__ function ----
    def params(self) -> list[str]:
        params = []
        for b in self.kernel.buffers:
            const = "const " if b.kind == "input" else ""
            params.append(f"{const}{CTYPES[b.dtype]}* __restrict__ {b.name}_")
        params += [f"long long z_{s}" for s in self.kernel.sizes]
        for b in self.kernel.buffers:
            params += [f"long long st_{b.name}_{d}" for d in range(len(b.shape))]
        params.append("long long* __restrict__ tc_err")
        return params

    def kernel_function(self, name: str, launch: L.Launch) -> str:
        threads = 1
        for t in launch.block:
            threads *= t
        self.threads = threads
        self.lines = []
        self.local = {b.name: b for b in launch.buffers}
        self.block = launch.block
        axes = "xyz"
        for k in range(len(launch.grid)):
            self.put(1, f"const {self.itype} b{k} = blockIdx.{axes[k]}; (void)b{k};")
        for k in range(len(launch.block)):
            self.put(1, f"const {self.itype} t{k} = threadIdx.{axes[k]}; (void)t{k};")
        for b in launch.buffers:
            dims = "".join(f"[{self.index(d)}]" for d in b.shape)
            store = "__shared__ " if b.kind == "shared" else ""
            self.put(1, f"{store}{CTYPES[b.dtype]} {b.name}{dims or '[1]'};")
        self.node(launch.body, 1)
        params = ", ".join(self.params())
        body = "\n".join(self.lines)
        args = ", ".join(p.split()[-1] for p in self.params())
        text = (f'extern "C" __global__ void __launch_bounds__({threads}) {name}({params}) {{\n'
                f"{body}\n}}\n")
        text += ("#ifdef TCLANG_EMULATION\n"
                 f'extern "C" int {name}_emulate(long long gx, long long gy, long long gz, '
                 f"long long bx, long long by, long long bz, {params}) {{\n"
                 f"  return tclang_emu::launch(dim3(gx, gy, gz), dim3(bx, by, bz), "
                 f"[&] {{ {name}({args}); }});\n}}\n#endif\n")
        return text

    def put(self, indent: int, line: str) -> None:
        self.lines.append("  " * indent + line)

    def loop_header(self, indent: int, var: str, lo: L.IExpr, hi: L.IExpr, step: int) -> None:
        """`for (...) {`: with 32-bit indices, a loop stepping past WIDE_STEP (blocks
        striding over a grid's worth of points) counts in 64 bits, as `v + step` could
        overflow an int, and gives its body the 32-bit value."""
        if self.itype == "int" and step >= WIDE_STEP:
            self.put(indent, f"for (long long {var}_w = {self.index(lo)}; {var}_w < "
                             f"{self.index(hi)}; {var}_w += {step}) {{")
            self.put(indent + 1, f"const int {var} = (int){var}_w; (void){var};")
            return
        self.put(indent, f"for ({self.itype} {var} = {self.index(lo)}; {var} < "
                         f"{self.index(hi)}; {var} += {step}) {{")

    # ---- loop nodes ----
    def node(self, n: L.Node, indent: int) -> None:
        match n:
            case L.Block(body=items):
                for item in items:
                    self.node(item, indent)
            case L.For() if self.accumulates(n):
                self.private_accumulator(n, indent)
            case L.For() if (nest := self.jam_nest(n)) is not None:
                self.jammed_accumulators(_Jam(self, nest), indent)
            case L.For() if self.private_memory and (found := self.hoisted_jam(n)) is not None:
                self.accumulators_across(n, *found, indent)
            case L.For(var=v, lo=lo, hi=hi, step=step, body=body):
                if n.unroll:
                    self.put(indent, f"#pragma unroll {n.unroll}")
                self.loop_header(indent, v, lo, hi, step)
                self.node(body, indent + 1)
                self.put(indent, "}")
            case L.If(cond=c, then=t, other=o):
                self.put(indent, f"if ({self.index(c)}) {{")
                self.node(t, indent + 1)
                if o is not None:
                    self.put(indent, "} else {")
                    self.node(o, indent + 1)
                self.put(indent, "}")
            case L.Run():
                self.run_statement(n, indent)
            case L.Copy(buffer=b, tensor=t, direction=d, index=idx, offset=off):
                glob = self.address(t, [self.index(i) for i in idx])
                local = self.local_address(b, [f"({self.index(i)}) - ({self.index(o)})"
                                               for i, o in zip(idx, off)])
                self.put(indent, f"{local} = {glob};" if d == "in" else f"{glob} = {local};")
            case L.Combine(op=op, dtype=dt, dst=d, dst_index=di, src=src, src_index=si,
                           atomic=True):
                value = self.named_element(src, si)
                self.put(indent, f"tc_atomic_{_ATOMIC[op]}(&{self.named_element(d, di)}, {value});")
            case L.Combine(op=op, dtype=dt, dst=d, dst_index=di, src=src, src_index=si):
                dst = self.named_element(d, di)
                value = _load(self.named_element(src, si), dt)
                if op is not None:
                    value = _combine(op, _load(dst, dt), value, dt)
                self.put(indent, f"{dst} = {_store(value, dt)};")
            case L.BlockCombine(op=op, dtype=dt, partial=b, count=c):
                self.block_combine(op, dt, b, c, indent)
            case L.Barrier():
                self.put(indent, "__syncthreads();")
            case L.TileContraction():
                TileEmitter(self, n, indent).emit()
            case L.Launch():
                raise ValueError("a launch inside a launch")
            case _:
                raise TypeError(f"unknown loop IR node {n!r}")

    def block_combine(self, op: str, dtype: DType, partial: str, count: int,
                      indent: int) -> None:
        """Each warp combines its lanes' partials by shuffles, lane 0 keeps the warp's in
        partial[warp], then the first warp combines those (missing ones as the identity)."""
        ctype = CTYPES[dtype]
        ident = _literal(identity(op, dtype), dtype)
        fold = _combine(op, "v", "__shfl_down_sync(0xffffffffu, v, o)", dtype)
        put = self.put
        put(indent, "{")
        put(indent + 1, f"{ctype} v = {partial}[t0];")
        put(indent + 1, f"for (int o = 16; o > 0; o >>= 1) v = {fold};")
        put(indent + 1, "__syncthreads();  // every partial read before the warps' results land")
        put(indent + 1, f"if ((t0 & 31) == 0) {partial}[t0 >> 5] = v;")
        put(indent + 1, "__syncthreads();")
        put(indent + 1, "if (t0 < 32) {")
        put(indent + 2, f"v = t0 < {count // 32} ? {partial}[t0] : {ident};")
        put(indent + 2, f"for (int o = 16; o > 0; o >>= 1) v = {fold};")
        put(indent + 2, f"if (t0 == 0) {partial}[0] = v;")
        put(indent + 1, "}")
        put(indent, "}")

    # ---- private (register) promotion of accumulators ----
    def accumulates(self, loop: L.For) -> bool:
        """A loop whose only statement reduces into one element for all its iterations."""
        r = loop.body
        if not self.private_memory or not isinstance(r, L.Run) or \
                any(p.ref == -1 for p in r.promoted):
            return False
        s = self.kernel.statement(r.statement)
        if s.kind != "reduce" or s.scatter:  # a scatter's element moves
            return False
        position = {name: k for k, name in enumerate(s.indices)}
        return not any(L.uses_var(r.indices[position[i]], loop.var) for i in s.lhs)

    def private_accumulator(self, loop: L.For, indent: int) -> None:
        """acc = target; for (...) acc = acc op value; target = acc: one load and one store
        instead of one of each per iteration."""
        r = loop.body
        s = self.kernel.statement(r.statement)
        dtype = self.buffers[s.target].dtype
        ctype = _register_ctype(dtype)
        position = {name: k for k, name in enumerate(s.indices)}
        self.put(indent, f"{{  // {s.target} accumulates in a register")
        for name in s.lhs:
            self.put(indent + 1, f"const {self.itype} o_{name} = "
                                 f"{self.index(r.indices[position[name]])};")
        target = self.address(s.target, [f"o_{i}" for i in s.lhs])
        self.put(indent + 1, f"{ctype} acc = {_load(target, dtype)};")
        if loop.unroll:
            self.put(indent + 1, f"#pragma unroll {loop.unroll}")
        self.loop_header(indent + 1, loop.var, loop.lo, loop.hi, loop.step)
        for name, value in zip(s.indices, r.indices):
            self.put(indent + 2, f"const {self.itype} i_{name} = {self.index(value)};")
        value = _Values(self, s, {p.ref: p for p in r.promoted}, indent + 2).emit(s.value)
        self.put(indent + 2, f"acc = {_combine(s.op, 'acc', value, dtype)};")
        self.put(indent + 1, "}")
        self.put(indent + 1, f"{target} = {_store('acc', dtype)};")
        self.put(indent, "}")

    # ---- a thread's rows jammed into one reduction loop (register tiling) ----
    def jammed_trips(self, loop: L.For) -> int:
        """The iterations of `for (v = t_k; v < H; v += block_k)`, the same on every thread
        when H is a multiple of the step; 0 for any other loop."""
        lo, hi = loop.lo, loop.hi
        if not (isinstance(lo, L.Var) and lo.name.startswith("t") and lo.name[1:].isdigit()
                and isinstance(hi, L.Int)):
            return 0
        k = int(lo.name[1:])
        if k >= len(self.block) or self.block[k] != loop.step or hi.value % loop.step:
            return 0
        return hi.value // loop.step

    def jam_nest(self, loop: L.For):
        """(the thread loops, the inits, the reduction loop) of a register tile, or None.

        One or two parallel loops over a thread's share of points (a matmul's rows `m`
        strided by the threads on y, and its columns `n` by those on x) whose body
        initializes each point's element, then reduces into it: jamming their iterations
        into the reduction loop keeps one accumulator per point in registers and loads
        each element the points share (A(m, k) along a row, B(k, n) down a column) once
        for all of them, instead of a serial chain of fused multiply-adds, each waiting
        on the last, with two loads."""
        loops, node, points = [], loop, 1
        while isinstance(node, L.For) and node.parallel and self.jammed_trips(node) >= 1:
            loops.append(node)
            points *= self.jammed_trips(node)
            items = node.body.body if isinstance(node.body, L.Block) else (node.body,)
            if len(items) == 1 and isinstance(items[0], L.For) and items[0].parallel and \
                    len(loops) < 2:
                node = items[0]
                continue
            *inits, last = items
            if not self.private_memory or not 2 <= points <= JAM or \
                    not isinstance(last, L.For) or not self.accumulates(last) or \
                    any(L.uses_var(last.lo, x.var) or L.uses_var(last.hi, x.var)
                        for x in loops):
                return None
            runs = [i.then if isinstance(i, L.If) and i.other is None else i for i in inits]
            if not all(isinstance(r, L.Run) and self.kernel.statement(r.statement).kind ==
                       "init" for r in runs):
                return None
            return loops, inits, last
        return None

    def jammed_accumulators(self, jam: "_Jam", indent: int) -> None:
        self.put(indent, f"{{  // {jam.names}: {len(jam.runs)} points jammed into one "
                         "reduction loop")
        for item in jam.inits:
            for c in jam.copies:
                self.node(L.substitute_node(item, c), indent + 1)
        jam.declare(indent + 1)
        jam.reduce(indent + 1)
        jam.store(indent + 1)
        self.put(indent, "}")

    # ---- ... and the register tile kept across the tiles of the reduction ----
    def hoisted_jam(self, loop: L.For) -> tuple[int, "_Jam"] | None:
        """(its position in the loop's body, the jammed nest) if `loop` walks the
        reduction's tiles (matmul's k tiles: copies to shared memory, a barrier, the jammed
        nest, a barrier) and nothing else in it touches the reduced tensor: the
        accumulators then stay in registers across all tiles, loaded once before and
        stored once after, instead of a load and a store of each per tile."""
        if loop.parallel or not isinstance(loop.body, L.Block):
            return None
        items = loop.body.body
        nests = [(k, nest) for k, item in enumerate(items) if isinstance(item, L.For)
                 and (nest := self.jam_nest(item)) is not None]
        if len(nests) != 1:
            return None
        position, nest = nests[0]
        jam = _Jam(self, nest)
        if any(L.uses_var(i, loop.var) for r in jam.runs for i in jam.lhs_values(r)):
            return None
        point = jam.lhs_values(jam.inner.body)
        for init in jam.inits:  # each must set exactly the element its accumulator holds
            run = init.then if isinstance(init, L.If) else init
            statement = self.kernel.statement(run.statement)
            where = {name: k for k, name in enumerate(statement.indices)}
            if statement.target != jam.s.target or \
                    [run.indices[where[i]] for i in statement.lhs] != point:
                return None
        for k, item in enumerate(items):
            if k == position:
                continue
            for n in L.walk_nodes(item):
                if not isinstance(n, (L.For, L.If, L.Block, L.Barrier, L.Copy)) or \
                        isinstance(n, L.Copy) and n.tensor == jam.s.target:
                    return None
        return position, jam

    def accumulators_across(self, loop: L.For, position: int, jam: "_Jam",
                            indent: int) -> None:
        self.put(indent, f"{{  // {jam.names}: {len(jam.runs)} points in registers across "
                         f"{loop.var}")
        jam.declare(indent + 1)
        if loop.unroll:
            self.put(indent + 1, f"#pragma unroll {loop.unroll}")
        self.loop_header(indent + 1, loop.var, loop.lo, loop.hi, loop.step)
        for k, item in enumerate(loop.body.body):
            if k != position:
                self.node(item, indent + 2)
                continue
            for init in jam.inits:  # the identity into the accumulators
                for j, c in enumerate(jam.copies):
                    copy = L.substitute_node(init, c)
                    run = copy.then if isinstance(copy, L.If) else copy
                    if isinstance(copy, L.If):
                        self.put(indent + 2, f"if ({self.index(copy.cond)}) {{")
                    statement = self.kernel.statement(run.statement)
                    value = _Values(self, statement, {}, indent + 3).emit(statement.value)
                    self.put(indent + 3, f"acc{j} = {value};")
                    if isinstance(copy, L.If):
                        self.put(indent + 2, "}")
            jam.reduce(indent + 2)
        self.put(indent + 1, "}")
        jam.store(indent + 1)
        self.put(indent, "}")

    def run_statement(self, r: L.Run, indent: int) -> None:
        s = self.kernel.statement(r.statement)
        promoted = {p.ref: p for p in r.promoted}
        self.put(indent, "{" + (f"  // {s.id}: {s.text}" if s.text else ""))
        for name, value in zip(s.indices, r.indices):
            self.put(indent + 1, f"const {self.itype} i_{name} = {self.index(value)};")
        emitter = _Values(self, s, promoted, indent + 1)
        value = emitter.emit(s.value)
        dtype = self.buffers[s.target].dtype
        if s.scatter:
            self.scatter_update(s, emitter, value, dtype, indent + 1)
            self.put(indent, "}")
            return
        lhs = [f"i_{i}" for i in s.lhs]
        target = self.element(s.target, lhs, promoted.get(-1))
        if s.kind == "reduce":
            value = _combine(s.op, _load(target, dtype), value, dtype)
        store = f"{target} = {_store(value, dtype)};"
        if self.check_bounds and lhs and promoted.get(-1) is None:  # the write, checked
            checks = " && ".join(emitter.check(s.target, d, lhs) for d in range(len(lhs)))
            store = f"if ({checks}) {store}"
        self.put(indent + 1, store)
        self.put(indent, "}")

    def scatter_update(self, s: L.StatementDef, emitter: "_Values", value: str,
                       dtype: DType, indent: int) -> None:
        """A scatter's update (tclang/lang/scatters.py): its subscripts computed once,
        each checked as a gather's are, the element updated only when all are inside.
        In a launch of a thread per update the update is atomic; where one thread runs
        the scatter's loops (polyhedral/scatter_loops.py) it is plain and colliding
        updates keep their order."""
        names = []
        for k, e in enumerate(s.scatter):
            self.put(indent, f"const long long o_{k} = (long long)({emitter.emit(e)});")
            names.append(f"o_{k}")
        checks = " && ".join(emitter.check(s.target, d, names) for d in range(len(names)))
        target = self.address(s.target, names)
        if self.threads > 1:  # a thread per update (polyhedral/scatter_loops.py)
            self.put(indent, f"if ({checks or 'true'}) tc_atomic_{_ATOMIC[s.op]}(&{target}, "
                             f"({_register_ctype(dtype)})({value}));")
            return
        combined = _combine(s.op, _load(target, dtype), value, dtype)
        self.put(indent, f"if ({checks or 'true'}) {target} = {_store(combined, dtype)};")

    # ---- addresses ----
    def element(self, tensor: str, subscripts: list[str], promotion) -> str:
        if promotion is not None:
            subs = [f"({s}) - ({self.index(o)})" for s, o in zip(subscripts, promotion.offset)]
            return self.local_address(promotion.buffer, subs)
        return self.address(tensor, subscripts)

    def named_element(self, name: str, index) -> str:
        """An element of a kernel buffer (global memory) or of a launch's own buffer."""
        subs = [self.index(i) for i in index]
        if name in self.local:
            return self.local_address(name, subs)
        return self.address(name, subs)

    def address(self, tensor: str, subscripts: list[str]) -> str:
        if not subscripts:
            return f"{tensor}_[0]"
        terms = [f"({s}) * {self.stride(tensor, d)}" for d, s in enumerate(subscripts)]
        return f"{tensor}_[{' + '.join(terms)}]"

    def local_address(self, buffer: str, subscripts: list[str]) -> str:
        return f"{buffer}{''.join(f'[{s}]' for s in subscripts)}" if subscripts else f"{buffer}[0]"

    def stride(self, tensor: str, dim: int) -> str:
        """A constant for the arrays the runtime allocates (row-major) in a specialized
        kernel; an input's is the argument: a device array's layout is the caller's, but
        a NumPy input is staged on the device row-major whatever its own layout."""
        b = self.buffers[tensor]
        if self.specialized is not None and b.strides is not None and b.kind != "input":
            return f"{b.strides[dim]}{self.suffix}"
        return f"st_{tensor}_{dim}" if self.itype != "int" else f"((int)st_{tensor}_{dim})"

    def extent(self, tensor: str, dim: int) -> str:
        return self.index(self.buffers[tensor].shape[dim])

    def index(self, e: L.IExpr) -> str:
        """An index expression in the kernel's index arithmetic."""
        return L.render_index(e, self.variable, self.integer, _OPERATORS)

    def variable(self, name: str) -> str:
        if name in self.kernel.sizes:
            return f"{self.specialized[name]}{self.suffix}" if self.specialized \
                else f"z_{name}"
        index = L.index_name(name)  # a statement's index, declared by run_statement
        return name if index is None else f"i_{index}"

    def integer(self, value: int) -> str:
        return f"{value}{self.suffix}"


class _Jam:
    """A jammed nest's points: each its substitution of the thread loops' variables, its
    copy of the reduction's run, its element of the target and its accumulator `acc<j>`."""

    def __init__(self, gen: _Generator, nest):
        """`nest`: what `jam_nest` found."""
        self.gen = gen
        loops, self.inits, self.inner = nest
        self.names = ", ".join(x.var for x in loops)
        self.copies: list[dict] = [{}]
        for x in loops:
            self.copies = [{**c, x.var: L.add(x.lo, L.Int(j * x.step))}
                           for c in self.copies for j in range(gen.jammed_trips(x))]
        self.runs = [L.substitute_node(self.inner.body, c) for c in self.copies]
        self.s = gen.kernel.statement(self.inner.body.statement)
        self.dtype = gen.buffers[self.s.target].dtype
        self.position = {name: k for k, name in enumerate(self.s.indices)}
        self.targets = [gen.address(self.s.target, [gen.index(i) for i in self.lhs_values(r)])
                        for r in self.runs]

    def lhs_values(self, run: L.Run) -> list[L.IExpr]:
        return [run.indices[self.position[name]] for name in self.s.lhs]

    def declare(self, indent: int) -> None:
        ctype = _register_ctype(self.dtype)
        for j, target in enumerate(self.targets):
            self.gen.put(indent, f"{ctype} acc{j} = {_load(target, self.dtype)};")

    def reduce(self, indent: int) -> None:
        gen, s, inner = self.gen, self.s, self.inner
        if inner.unroll:
            gen.put(indent, f"#pragma unroll {inner.unroll}")
        gen.loop_header(indent, inner.var, inner.lo, inner.hi, inner.step)
        for j, r in enumerate(self.runs):
            gen.put(indent + 1, "{")
            for name, value in zip(s.indices, r.indices):
                gen.put(indent + 2, f"const {gen.itype} i_{name} = {gen.index(value)};")
            value = _Values(gen, s, {p.ref: p for p in r.promoted}, indent + 2).emit(s.value)
            gen.put(indent + 2, f"acc{j} = {_combine(s.op, f'acc{j}', value, self.dtype)};")
            gen.put(indent + 1, "}")
        gen.put(indent, "}")

    def store(self, indent: int) -> None:
        for j, target in enumerate(self.targets):
            self.gen.put(indent, f"{target} = {_store(f'acc{j}', self.dtype)};")


class _Values:
    """A statement body as a C expression; checked gathers emit statements first."""

    def __init__(self, gen: _Generator, s: L.StatementDef, promoted, indent: int):
        self.gen = gen
        self.s = s
        self.promoted = promoted
        self.indent = indent
        self.temps = 0
        self.locals: dict[str, str] = {}  # a let's name -> its C variable

    def emit(self, e: P.Expr) -> str:
        match e:
            case P.Const(value=v, dtype=dt):
                return _literal(v, dt)
            case P.IndexValue(name=n, dtype=dt):
                return _cast(f"((long long)i_{n})", DType.INT64, dt)
            case P.SizeValue(name=n, dtype=dt):
                return _cast(f"((long long){self.gen.index(L.Var(n))})", DType.INT64, dt)
            case P.Read(tensor=t, subscripts=subs, affine=aff, ref=ref):
                return self.read(t, subs, aff, ref)
            case P.Unary(op="neg", operand=x, dtype=dt):
                return f"(({_register_ctype(dt)})(-{self.emit(x)}))"
            case P.Unary(op="not", operand=x):
                return f"(!{self.emit(x)})"
            case P.Binary(op="and", lhs=a, rhs=b):
                return f"({self.emit(a)} & {self.emit(b)})"
            case P.Binary(op="or", lhs=a, rhs=b):
                return f"({self.emit(a)} | {self.emit(b)})"
            case P.Binary(op=op, lhs=a, rhs=b, dtype=dt):
                return self.arith(op, self.emit(a), self.emit(b), dt)
            case P.Compare(op=op, lhs=a, rhs=b):
                sym = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}[op]
                return f"({self.emit(a)} {sym} {self.emit(b)})"
            case P.Select(cond=c, then=t, other=o):
                return f"({self.emit(c)} ? {self.emit(t)} : {self.emit(o)})"
            case P.Call(name=n, args=args, dtype=dt):
                return _call(n, [self.emit(a) for a in args], dt)
            case P.Cast(operand=x, dtype=dt):
                return _cast(self.emit(x), x.dtype, dt)
            case P.Let(name=n, value=v, body=body):  # v is unconditional: a declaration
                name = f"tc_let{self.gen.lets}"
                self.gen.lets += 1
                self.gen.put(self.indent, f"const auto {name} = {self.emit(v)};")
                self.locals[n] = name
                return self.emit(body)
            case P.Local(name=n):
                return self.locals[n]
        raise TypeError(f"cannot emit {e!r}")

    def read(self, tensor: str, subs, affine, ref: int) -> str:
        texts = [self.gen.index(a) if a is not None else f"(long long)({self.emit(sub)})"
                 for sub, a in zip(subs, affine)]
        checks = [self.check(tensor, dim, texts) for dim, a in enumerate(affine)
                  if a is None or self.gen.check_bounds]
        dtype = self.gen.buffers[tensor].dtype
        value = _load(self.gen.element(tensor, texts, self.promoted.get(ref)), dtype)
        if not checks:
            return value
        # checked where the read is evaluated (inside a `?:` branch too), and no load at all
        # when a subscript is out of bounds: the error is recorded, the value is unused
        zero = "false" if dtype is DType.BOOL else "0"
        return f"(({' && '.join(checks)}) ? {value} : {zero})"

    def check(self, tensor: str, dim: int, subscripts: list[str]) -> str:
        """An expression: whether subscript `dim` is inside `tensor` (else it records)."""
        tensor_id = [b.name for b in self.gen.kernel.buffers].index(tensor)
        stmt_id = [s.id for s in self.gen.kernel.statements].index(self.s.id)
        extent = self.gen.extent(tensor, dim)
        element = "".join(f", {s}" for s in subscripts)
        return (f"tc_inside({subscripts[dim]}, {extent}, tc_err, {tensor_id}, {dim}, "
                f"{stmt_id}{element})")

    @staticmethod
    def arith(op: str, a: str, b: str, dtype: DType) -> str:
        if op in ("add", "sub", "mul"):
            sym = {"add": "+", "sub": "-", "mul": "*"}[op]
            ctype = _register_ctype(dtype)
            return f"(({ctype})({a} {sym} {b}))"
        if dtype.is_float:
            return f"({a} / {b})" if op == "div" else f"tc_fmod({a}, {b})"
        ctype = CTYPES[dtype]
        fn = "tc_idiv" if op == "div" else "tc_imod"
        return f"{fn}<{ctype}>({a}, {b})"


def records_errors(text: str) -> bool:
    """Whether generated CUDA can write the error record: a subscript checked at run time
    (a gather, check_bounds) calls `tc_inside`, which PRELUDE defines."""
    return text.count("tc_inside(") > PRELUDE.count("tc_inside(")


def _fits_32_bits(kernel: L.Kernel) -> bool:
    """Whether every size, and every element offset of every buffer, is below
    NARROW_LIMIT in a specialized kernel, so that no index expression (a few such terms
    summed) overflows an int. An input's offsets are bounded in both layouts it may have
    on the device: the caller's (its layout key: constant strides, or run-time ones with a
    bound on the offsets) and row-major (a staged NumPy array)."""
    if not kernel.specialized:
        return False
    sizes = dict(kernel.size_values)
    if any(abs(v) >= NARROW_LIMIT for v in sizes.values()):
        return False
    for b in kernel.buffers:
        if b.kind in ("shared", "private", "scratch"):
            continue
        if b.strides is None:
            return False
        shape = [L.evaluate(d, sizes) for d in b.shape]
        if None in b.strides:  # run-time strides: the layout key bounds the offsets
            if b.offset_bound is None or b.offset_bound > NARROW_LIMIT:
                return False
            span = 0
        else:
            span = sum(max(e - 1, 0) * abs(st) for e, st in zip(shape, b.strides))
        count = 1
        for e in shape:
            count *= max(e, 0)
        if max(span, count) >= NARROW_LIMIT:
            return False
    return True


def _launches(node: L.Node, condition: L.IExpr | None) -> list:
    """(launch, host condition) pairs in order: the host runs launches in sequence, each
    under the conditions on the sizes around it."""
    def both(c: L.IExpr) -> L.IExpr:
        return c if condition is None else L.Op("and", (condition, c))

    match node:
        case L.Launch():
            return [(node, condition)]
        case L.Block(body=items):
            return [x for item in items for x in _launches(item, condition)]
        case L.If(cond=c, then=t, other=o):
            found = _launches(t, both(c))
            if o is not None:
                found += _launches(o, both(L.Op("not", (c,))))
            return found
    raise ValueError("a GPU kernel's host code must be launches under conditions on sizes")


def _literal(value, dtype: DType) -> str:
    if dtype is DType.BOOL:
        return "true" if value else "false"
    if dtype.is_float:
        v = round_float(value, dtype)
        if v != v:
            text = "(0.0/0.0)"
        elif v in (float("inf"), float("-inf")):
            text = "(1.0/0.0)" if v > 0 else "(-1.0/0.0)"
        else:
            text = repr(v)
        return f"((double){text})" if dtype is DType.FLOAT64 else f"((float){text})"
    return f"(({CTYPES[dtype]}){int(value)}{'ULL' if not dtype.is_signed else 'LL'})"


def _load(element: str, dtype: DType) -> str:
    if dtype is DType.BFLOAT16:
        return f"__bfloat162float({element})"
    return f"__half2float({element})" if dtype is DType.FLOAT16 else element


def _store(value: str, dtype: DType) -> str:
    if dtype is DType.BFLOAT16:
        return f"__float2bfloat16_rn({value})"
    return f"__float2half_rn({value})" if dtype is DType.FLOAT16 else value


def _combine(op: str, acc: str, value: str, dtype: DType) -> str:
    if op == "+":
        return f"({acc} + {value})" if dtype is not DType.BOOL else f"({acc} | {value})"
    if op == "*":
        return f"({acc} * {value})" if dtype is not DType.BOOL else f"({acc} & {value})"
    if dtype.is_float:
        suffix = "" if dtype is DType.FLOAT64 else "f"
        return f"f{op}{suffix}({acc}, {value})"
    if dtype is DType.BOOL:
        return f"({acc} & {value})" if op == "min" else f"({acc} | {value})"
    return f"tc_{op}<{CTYPES[dtype]}>({acc}, {value})"


def _call(name: str, args: list[str], dtype: DType) -> str:
    joined = ", ".join(args)
    if dtype is DType.FLOAT64:
        mapped = _MATH_DOUBLE.get(name, name)
        if name == "fdivide":
            return f"({args[0]} / {args[1]})"
        return f"{mapped}({joined})"
    if dtype.is_float:
        match name:
            case "sigmoid":
                return f"tc_sigmoid({joined})"
            case "abs":
                return f"fabsf({joined})"
            case "min" | "max":
                return f"f{name}f({joined})"
            case "fdivide":
                return f"({args[0]} / {args[1]})"
        return f"{name}f({joined})"
    ctype = CTYPES[dtype]
    if name == "abs":
        return f"(({ctype})({args[0]} < 0 ? -{args[0]} : {args[0]}))" if dtype.is_signed \
            else args[0]
    return f"tc_{name}<{ctype}>({joined})"


def _cast(x: str, src: DType, dst: DType) -> str:
    if src is dst:
        return x
    if dst is DType.BOOL:
        return f"({x} != 0)"
    if dst is DType.FLOAT16:  # a double rounds to half once, as NumPy and the CPU do
        wide = "double" if src is DType.FLOAT64 else "float"
        return f"tc_round_half(({wide})({x}))"
    if dst is DType.BFLOAT16:
        return f"tc_round_bf16((float)({x}))"
    if dst.is_float:
        return f"(({CTYPES[dst]})({x}))"
    if src.is_float:
        import numpy as np
        info = np.iinfo(dst.numpy)
        suffix = "ULL" if not dst.is_signed else "LL"
        lo = f"(({CTYPES[dst]}){info.min}{suffix})" if info.min else f"(({CTYPES[dst]})0)"
        if dst is DType.INT64:
            lo = "((long long)(-9223372036854775807LL - 1))"
        return f"tc_f2i<{CTYPES[dst]}>({x}, {lo}, (({CTYPES[dst]}){info.max}{suffix}))"
    return f"(({CTYPES[dst]})({x}))"
