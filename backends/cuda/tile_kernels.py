"""CUDA C for `L.TileContraction`: a block computes one tile of a contraction, as tuned
GEMMs do (the loop IR says what is summed; how a block walks its tile is this file's).

Two engines, one structure: each stage the block's threads copy a `depth`-deep slice of
the left operand's rows and of the right operand's columns into shared memory (double
buffered: the next slice's copies are in flight while this one is multiplied), then
multiply them:
- "simt" (float32): 8 x 8 points a thread, as two 4 x 4 halves half a tile apart, so a
  warp reads each k-row of a slice as broadcast or conflict-free 16-byte words. The next
  slice is loaded into registers before the multiply and stored after it (its elements
  are laid out k-major in shared memory whatever their layout in memory).
- "mma" (float16 or bfloat16 operands, float32 sums): WMMA fragments of 16 x 16 x 16 on the tensor
  cores, `warp_tile` points a warp. Slices keep the memory layout's fast direction, so
  each 16-byte piece is one asynchronous copy (`cp.async` on sm_80+) with zero fill past
  the edge.
Vector loads (4 floats, 8 halves) are taken only where the run-time strides make the
points along the operand's fast variable consecutive and 16-byte aligned (the kernel
checks at the block's start: a strided or Fortran-ordered argument takes the scalar
copies, which are always right). A block writes its points once: `=` for `+=!` (its init
is in the launch), `+=` otherwise; then the launch's followers run at its points.
"""

from __future__ import annotations

from polyhedral import loop_ir as L
from tclang.dtypes import DType

CTYPES = {DType.FLOAT16: "__half", DType.BFLOAT16: "__nv_bfloat16"}  # tensor-core operands

HALF_VECTOR = 8  # halves in a 16-byte copy
FLOAT_VECTOR = 4


def slice_shapes(n: L.TileContraction) -> tuple[tuple[int, int], tuple[int, int]]:
    """(rows, columns) of one stage's slice of each operand in shared memory (tensor
    cores), its layout's fast direction last, padded by 16 bytes a row (WMMA's loads of
    consecutive rows then start in different banks)."""
    bm, bn, bk = n.tile
    a = (bk, bm + HALF_VECTOR) if n.a.fast == "m" else (bm, bk + HALF_VECTOR)
    b = (bn, bk + HALF_VECTOR) if n.b.fast == "k" else (bk, bn + HALF_VECTOR)
    return a, b


def shared_bytes(n: L.TileContraction) -> int:
    """The dynamic shared memory a tensor-core launch asks for (0 for the CUDA cores',
    whose slices are static): every stage's slices, or the warps' result tiles if more."""
    if n.engine != "mma":
        return 0
    (ar, ac), (br, bc) = slice_shapes(n)
    bm, bn, _ = n.tile
    wm, wn = n.warp_tile
    slices = n.stages * (ar * ac + br * bc) * 2
    results = (bm // wm) * (bn // wn) * 16 * 16 * 4
    return max(slices, results)


class TileEmitter:
    """Prints one TileContraction through the generator's addresses and index printing."""

    def __init__(self, gen, n: L.TileContraction, indent: int):
        self.gen, self.n, self.indent = gen, n, indent
        self.it = gen.itype

    def put(self, line: str, extra: int = 0) -> None:
        self.gen.put(self.indent + extra, line)

    def offset(self, tensor: str, index) -> str:
        """tensor's element offset at `index` (the generator's strides)."""
        if not index:
            return "0"
        return " + ".join(f"({self.gen.index(i)}) * {self.gen.stride(tensor, d)}"
                          for d, i in enumerate(index))

    # ---- the whole launch body ----
    def emit(self) -> None:
        n, it = self.n, self.it
        bm, bn, bk = n.tile
        self.put("{")
        self.indent += 1
        self.put(f"const {it} {L.TILE_B} = b2; (void){L.TILE_B};")
        self.put(f"const {it} m0 = b1 * {bm}, n0 = b0 * {bn};")
        self.put(f"const {it} ROWS = {self.gen.index(n.rows)}, COLS = {self.gen.index(n.cols)}, "
                 f"DEPTH = {self.gen.index(n.depth)};")
        self.put(f"auto a_at = [&]({it} {L.TILE_M}, {it} {L.TILE_K}) -> {it} {{ return "
                 f"{self.offset(n.a.tensor, n.a.index)}; }};")
        self.put(f"auto b_at = [&]({it} {L.TILE_K}, {it} {L.TILE_N}) -> {it} {{ return "
                 f"{self.offset(n.b.tensor, n.b.index)}; }};")
        self.put(f"auto c_at = [&]({it} {L.TILE_M}, {it} {L.TILE_N}) -> {it} {{ return "
                 f"{self.offset(n.target, n.out_index)}; }};")
        width = HALF_VECTOR if n.engine == "mma" else FLOAT_VECTOR
        self.vector_check("a_vec", n.a, "a_at", width, ("m", "k"), "ROWS", "DEPTH")
        self.vector_check("b_vec", n.b, "b_at", width, ("k", "n"), "DEPTH", "COLS")
        self.put(f"const {it} steps = (DEPTH + {bk - 1}) / {bk};")
        if n.engine == "mma":
            self.mma()
        else:
            self.simt()
        self.followers()
        self.indent -= 1
        self.put("}")

    def vector_check(self, name: str, op: L.TileOperand, at: str, width: int,
                     variables: tuple[str, str], first: str, second: str) -> None:
        """`name`: whether this block may copy `width` points along the operand's fast
        variable at once: consecutive in memory, aligned, and the fast extent a multiple
        of `width` (so a vector is wholly inside or wholly outside)."""
        if not op.linear or op.fast not in variables:
            self.put(f"const bool {name} = false;")
            return
        fast_first = op.fast == variables[0]
        origin = f"{at}(0, 0)"
        along = f"{at}(1, 0)" if fast_first else f"{at}(0, 1)"
        across = f"{at}(0, 1)" if fast_first else f"{at}(1, 0)"
        extent = first if fast_first else second
        self.put(f"const bool {name} = ({along} - {origin} == 1) && ({origin} % {width} == 0) && "
                 f"(({across} - {origin}) % {width} == 0) && ({extent} % {width} == 0) && "
                 f"(((unsigned long long){op.tensor}_) % 16 == 0);")

    # ---- CUDA cores ----
    def simt(self) -> None:
        n, it = self.n, self.it
        bm, bn, bk = n.tile
        threads = (bm // 8) * (bn // 8)
        self.put(f"__shared__ __align__(16) float As[2][{bk}][{bm}];")
        self.put(f"__shared__ __align__(16) float Bs[2][{bk}][{bn}];")
        self.put("float acc[8][8];")
        self.put("#pragma unroll")
        self.put("for (int i = 0; i < 8; ++i) for (int j = 0; j < 8; ++j) acc[i][j] = 0.0f;")
        self.put(f"const int ty = (int)t0 / {bn // 8}, tx = (int)t0 % {bn // 8};")
        la, lb = bm * bk // threads, bk * bn // threads  # elements a thread copies a stage
        self.put(f"float ra[{la}], rb[{lb}];")
        # element e of a thread's share: its (row, column) in the slice, fast-major
        self.slice_coordinates("a", n.a, bm, bk, "m", la, threads)
        self.slice_coordinates("b", n.b, bk, bn, "k", lb, threads)
        self.put(f"auto load = [&]({it} k0) {{")
        self.simt_load("a", n.a, "a_at", la, "m0 + r", "k0 + c", "ROWS", "DEPTH")
        self.simt_load("b", n.b, "b_at", lb, "k0 + r", "n0 + c", "DEPTH", "COLS")
        self.put("};")
        self.put("auto store = [&](int s) {")
        self.put("#pragma unroll", 1)
        self.put(f"for (int e = 0; e < {la}; ++e) {{ int r, c; a_rc(e, r, c); "
                 f"As[s][c][r] = ra[e]; }}", 1)
        self.put("#pragma unroll", 1)
        self.put(f"for (int e = 0; e < {lb}; ++e) {{ int r, c; b_rc(e, r, c); "
                 f"Bs[s][r][c] = rb[e]; }}", 1)
        self.put("};")
        self.put("load(0); store(0); __syncthreads();")
        self.put(f"for ({it} s = 0; s < steps; ++s) {{")
        self.put("const int cur = (int)(s & 1);", 1)
        self.put(f"if (s + 1 < steps) load((s + 1) * {bk});", 1)
        self.put("#pragma unroll", 1)
        self.put(f"for (int kk = 0; kk < {bk}; ++kk) {{", 1)
        self.put("float a[8], b[8];", 2)
        self.put("#pragma unroll", 2)
        self.put(f"for (int i = 0; i < 4; ++i) {{ a[i] = As[cur][kk][ty * 4 + i]; "
                 f"a[i + 4] = As[cur][kk][{bm // 2} + ty * 4 + i]; "
                 f"b[i] = Bs[cur][kk][tx * 4 + i]; b[i + 4] = Bs[cur][kk][{bn // 2} + tx * 4 + i]; }}",
                 2)
        self.put("#pragma unroll", 2)
        self.put("for (int i = 0; i < 8; ++i)", 2)
        self.put("#pragma unroll", 3)
        self.put("for (int j = 0; j < 8; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);", 3)
        self.put("}", 1)
        self.put("if (s + 1 < steps) store(cur ^ 1);", 1)
        self.put("__syncthreads();", 1)
        self.put("}")
        self.put("#pragma unroll")
        self.put("for (int i = 0; i < 8; ++i) {")
        self.put(f"const {it} tc_m = m0 + (i < 4 ? ty * 4 + i : {bm // 2} + ty * 4 + i - 4);", 1)
        self.put("if (tc_m >= ROWS) continue;", 1)
        self.put("#pragma unroll", 1)
        self.put("for (int j = 0; j < 8; ++j) {", 1)
        self.put(f"const {it} tc_n = n0 + (j < 4 ? tx * 4 + j : {bn // 2} + tx * 4 + j - 4);", 2)
        self.put(f"if (tc_n < COLS) {self.write('c_at(tc_m, tc_n)', 'acc[i][j]')}", 2)
        self.put("}", 1)
        self.put("}")

    def slice_coordinates(self, name: str, op: L.TileOperand, rows: int, cols: int,
                          row_var: str, count: int, threads: int) -> None:
        """`name_rc(e, r, c)`: the slice element (r, c) that a thread's e-th copy is. The
        thread's copies are runs of FLOAT_VECTOR points along the fast direction (columns
        unless the operand's fast variable is the rows'), runs `threads` apart."""
        v = FLOAT_VECTOR
        if op.fast == row_var:  # runs down the rows
            self.put(f"auto {name}_rc = [&](int e, int& r, int& c) {{ const int q = (int)t0 + "
                     f"(e / {v}) * {threads}; c = q / {rows // v}; r = (q % {rows // v}) * {v} + "
                     f"e % {v}; }};")
        else:
            self.put(f"auto {name}_rc = [&](int e, int& r, int& c) {{ const int q = (int)t0 + "
                     f"(e / {v}) * {threads}; r = q / {cols // v}; c = (q % {cols // v}) * {v} + "
                     f"e % {v}; }};")

    def simt_load(self, name: str, op: L.TileOperand, at: str, count: int, row: str,
                  col: str, row_extent: str, col_extent: str) -> None:
        reg = "ra" if name == "a" else "rb"
        v = FLOAT_VECTOR
        self.put(f"if ({name}_vec) {{", 1)
        self.put("#pragma unroll", 2)
        self.put(f"for (int e = 0; e < {count}; e += {v}) {{", 2)
        self.put(f"int r, c; {name}_rc(e, r, c);", 3)
        self.put(f"if ({row} < {row_extent} && {col} < {col_extent}) {{", 3)
        self.put(f"const float4 w = *reinterpret_cast<const float4*>({op.tensor}_ + "
                 f"{at}({row}, {col}));", 4)
        self.put(f"{reg}[e] = w.x; {reg}[e + 1] = w.y; {reg}[e + 2] = w.z; {reg}[e + 3] = w.w;", 4)
        self.put(f"}} else {{ {reg}[e] = {reg}[e + 1] = {reg}[e + 2] = {reg}[e + 3] = 0.0f; }}", 3)
        self.put("}", 2)
        self.put("} else {", 1)
        self.put("#pragma unroll", 2)
        self.put(f"for (int e = 0; e < {count}; ++e) {{", 2)
        self.put(f"int r, c; {name}_rc(e, r, c);", 3)
        self.put(f"{reg}[e] = ({row} < {row_extent} && {col} < {col_extent}) ? "
                 f"{op.tensor}_[{at}({row}, {col})] : 0.0f;", 3)
        self.put("}", 2)
        self.put("}", 1)

    # ---- tensor cores ----
    def mma(self) -> None:
        n, it = self.n, self.it
        bm, bn, bk = n.tile
        wm, wn = n.warp_tile
        fm, fn = wm // 16, wn // 16
        warps = (bm // wm) * (bn // wn)
        threads = 32 * warps
        stages = n.stages
        a_col = n.a.fast == "m"  # the slice laid out m-fastest: a column-major fragment
        b_col = n.b.fast == "k"
        (ar, ac), (br, bc) = slice_shapes(n)
        a_bytes = stages * ar * ac * 2
        total = shared_bytes(n)
        w = "nvcuda::wmma"
        ctype = CTYPES[n.a.dtype]  # __half or __nv_bfloat16
        # one region: the slices while the sums run, the warps' result tiles after them
        self.put("#ifdef TCLANG_EMULATION")
        self.put(f"__shared__ __align__(128) unsigned char tc_smem[{total}];")
        self.put("#else")
        self.put("extern __shared__ __align__(128) unsigned char tc_smem[];")
        self.put("#endif")
        self.put(f"{ctype} (*As)[{ar}][{ac}] = reinterpret_cast<{ctype} (*)[{ar}][{ac}]>"
                 f"(tc_smem);")
        self.put(f"{ctype} (*Bs)[{br}][{bc}] = reinterpret_cast<{ctype} (*)[{br}][{bc}]>"
                 f"(tc_smem + {a_bytes});")
        self.put("float (*Cs)[16 * 16] = reinterpret_cast<float (*)[16 * 16]>(tc_smem);")
        self.put("const int warp = (int)t0 / 32, lane = (int)t0 % 32;")
        self.put(f"const int wm0 = (warp / {bn // wn}) * {wm}, wn0 = (warp % {bn // wn}) * {wn};")
        self.put(f"{w}::fragment<{w}::accumulator, 16, 16, 16, float> acc[{fm}][{fn}];")
        self.put("#pragma unroll")
        self.put(f"for (int i = 0; i < {fm}; ++i)")
        self.put("#pragma unroll")
        self.put(f"for (int j = 0; j < {fn}; ++j) {w}::fill_fragment(acc[i][j], 0.0f);")
        # a slice element's place in shared memory, its layout's fast direction last
        a_elem = "As[s][c][r]" if a_col else "As[s][r][c]"
        b_elem = "Bs[s][c][r]" if b_col else "Bs[s][r][c]"
        # each thread's 16-byte pieces: where they come from at depth 0 and go to, worked
        # out once; a stage adds its depth times the operand's step along k
        self.pieces("a", "a_at", bm, bk, a_col, a_elem.replace("As[s]", "As[0]"), "m0 + r",
                    "c", "ROWS", "c", "(a_at(0, 1) - a_at(0, 0))", threads)
        self.pieces("b", "b_at", bk, bn, b_col, b_elem.replace("Bs[s]", "Bs[0]"), "r",
                    "n0 + c", "COLS", "r", "(b_at(1, 0) - b_at(0, 0))", threads)
        self.put(f"auto load = [&]({it} k0, int s) {{")
        self.mma_load("a", n.a, "a_at", bm, bk, a_col, a_elem, "m0 + r", "k0 + c", "ROWS",
                      "DEPTH", threads, "&As[s][0][0]")
        self.mma_load("b", n.b, "b_at", bk, bn, b_col, b_elem, "k0 + r", "n0 + c", "DEPTH",
                      "COLS", threads, "&Bs[s][0][0]")
        self.put("};")
        a_layout = f"{w}::col_major" if a_col else f"{w}::row_major"
        b_layout = f"{w}::col_major" if b_col else f"{w}::row_major"
        a_ptr = "&As[cur][kk][wm0 + i * 16]" if a_col else "&As[cur][wm0 + i * 16][kk]"
        b_ptr = "&Bs[cur][wn0 + j * 16][kk]" if b_col else "&Bs[cur][kk][wn0 + j * 16]"
        # stages - 1 slices ahead: at step s, slice s is complete once all but the
        # stages - 2 latest copy groups are; the barrier after the wait also tells that
        # every warp is done with the stage the next copies overwrite (step s - 1's)
        self.put(f"for (int p = 0; p < {stages - 1}; ++p) {{ if (p < steps) load(p * {bk}, p); "
                 f"tc_cp_commit(); }}")
        self.put(f"for ({it} s = 0; s < steps; ++s) {{")
        self.put(f"const int cur = (int)(s % {stages});", 1)
        self.put(f"tc_cp_wait<{stages - 2}>(); __syncthreads();", 1)
        self.put(f"if (s + {stages - 1} < steps) load((s + {stages - 1}) * {bk}, "
                 f"(int)((s + {stages - 1}) % {stages}));", 1)
        self.put("tc_cp_commit();", 1)
        self.put("#pragma unroll", 1)
        self.put(f"for (int kk = 0; kk < {bk}; kk += 16) {{", 1)
        self.put(f"{w}::fragment<{w}::matrix_a, 16, 16, 16, {ctype}, {a_layout}> fa[{fm}];", 2)
        self.put(f"{w}::fragment<{w}::matrix_b, 16, 16, 16, {ctype}, {b_layout}> fb[{fn}];", 2)
        self.put("#pragma unroll", 2)
        self.put(f"for (int i = 0; i < {fm}; ++i) {w}::load_matrix_sync(fa[i], {a_ptr}, {ac});",
                 2)
        self.put("#pragma unroll", 2)
        self.put(f"for (int j = 0; j < {fn}; ++j) {w}::load_matrix_sync(fb[j], {b_ptr}, {bc});",
                 2)
        self.put("#pragma unroll", 2)
        self.put(f"for (int i = 0; i < {fm}; ++i)", 2)
        self.put("#pragma unroll", 3)
        self.put(f"for (int j = 0; j < {fn}; ++j) {w}::mma_sync(acc[i][j], fa[i], fb[j], "
                 f"acc[i][j]);", 3)
        self.put("}", 1)
        self.put("}")
        self.put("tc_cp_wait<0>(); __syncthreads();  // the slices' memory becomes Cs")
        self.put("#pragma unroll")  # (fragments indexed by constants stay in registers)
        self.put(f"for (int i = 0; i < {fm}; ++i)")
        self.put("#pragma unroll")
        self.put(f"for (int j = 0; j < {fn}; ++j) {{")
        self.put(f"{w}::store_matrix_sync(Cs[warp], acc[i][j], 16, {w}::mem_row_major);", 1)
        self.put("__syncwarp();", 1)
        self.put("for (int e = lane; e < 256; e += 32) {", 1)
        self.put(f"const {it} tc_m = m0 + wm0 + i * 16 + e / 16, "
                 f"tc_n = n0 + wn0 + j * 16 + e % 16;", 2)
        self.put(f"if (tc_m < ROWS && tc_n < COLS) {self.write('c_at(tc_m, tc_n)', 'Cs[warp][e]')}",
                 2)
        self.put("}", 1)
        self.put("__syncwarp();", 1)
        self.put("}")

    def pieces(self, name: str, at: str, rows: int, cols: int, transposed: bool,
               elem: str, row: str, col: str, extent: str, k: str, step: str,
               threads: int) -> None:
        """`name_src[p]`, `name_dst[p]`, `name_k[p]`, `name_ok[p]`: a thread's p-th piece of
        a slice (the run of HALF_VECTOR points along the fast direction it copies), its
        element offset in the operand at depth 0, its place in a stage, its depth within
        the slice, and whether it lies inside the operand's rows or columns."""
        v = HALF_VECTOR
        run = rows if transposed else cols
        pieces = rows * cols // v
        count = -(-pieces // threads)
        coords = (f"const int c = q / {run // v}; const int r = (q % {run // v}) * {v};"
                  if transposed else
                  f"const int r = q / {run // v}; const int c = (q % {run // v}) * {v};")
        self.put(f"{self.it} {name}_src[{count}]; int {name}_dst[{count}], {name}_k[{count}]; "
                 f"bool {name}_ok[{count}];")
        self.put(f"const {self.it} {name}_step = {step};")
        self.put("#pragma unroll")
        self.put(f"for (int p = 0; p < {count}; ++p) {{")
        self.put(f"const int q = (int)t0 + p * {threads};", 1)
        self.put(coords, 1)
        self.put(f"{name}_ok[p] = q < {pieces} && ({row if name == 'a' else col}) < {extent};", 1)
        self.put(f"{name}_k[p] = {k};", 1)
        self.put(f"{name}_src[p] = {name}_ok[p] ? {at}({row}, {col}) : 0;", 1)
        self.put(f"{name}_dst[p] = (int)(&{elem} - &{elem.split('[')[0]}[0][0][0]);", 1)
        self.put("}")

    def mma_load(self, name: str, op: L.TileOperand, at: str, rows: int, cols: int,
                 transposed: bool, elem: str, row: str, col: str, row_extent: str,
                 col_extent: str, threads: int, stage: str) -> None:
        """Copies of a slice (rows x cols points) into shared memory: 16-byte asynchronous
        copies along the fast direction when `name_vec` (the pieces worked out before),
        else one half at a time."""
        count = -(-(rows * cols // HALF_VECTOR) // threads)
        self.put(f"if ({name}_vec) {{", 1)
        self.put("#pragma unroll", 2)
        self.put(f"for (int p = 0; p < {count}; ++p) {{", 2)
        self.put(f"const bool ok = {name}_ok[p] && k0 + {name}_k[p] < DEPTH;", 3)
        self.put(f"tc_cp16({stage} + {name}_dst[p], {op.tensor}_ + (ok ? {name}_src[p] + "
                 f"k0 * {name}_step : 0), ok);", 3)
        self.put("}", 2)
        self.put("} else {", 1)
        self.put(f"for (int q = (int)t0; q < {rows * cols}; q += {threads}) {{", 2)
        if transposed:
            self.put(f"const int c = q / {rows}; const int r = q % {rows};", 3)
        else:
            self.put(f"const int r = q / {cols}; const int c = q % {cols};", 3)
        self.put(f"{elem} = ({row} < {row_extent} && {col} < {col_extent}) ? "
                 f"{op.tensor}_[{at}({row}, {col})] : {CTYPES[op.dtype]}(0.0f);", 3)
        self.put("}", 2)
        self.put("}", 1)

    # ---- the result ----
    def write(self, where: str, value: str) -> str:
        target = f"{self.n.target}_[{where}]"
        dtype = self.n.target_dtype
        if self.n.op is None:
            rhs = value
        else:
            rhs = f"{_load(target, dtype)} + {value}"
        return f"{target} = {_store(rhs, dtype)};"

    def followers(self) -> None:
        n = self.n
        if not n.followers:
            return
        bm, bn, _ = n.tile
        threads = self.gen.block[0]
        self.put("__syncthreads();  // the block's sums are written: its followers read them")
        self.put(f"for (int p = (int)t0; p < {bm * bn}; p += {threads}) {{")
        self.put(f"const {self.it} tc_m = m0 + p / {bn}, tc_n = n0 + p % {bn};", 1)
        self.put("if (tc_m >= ROWS || tc_n >= COLS) continue;", 1)
        for f in n.followers:
            self.gen.node(f, self.indent + 1)
        self.put("}")


def _load(element: str, dtype: DType) -> str:
    return f"__half2float({element})" if dtype is DType.FLOAT16 else element


def _store(value: str, dtype: DType) -> str:
    return f"__float2half_rn({value})" if dtype is DType.FLOAT16 else value
