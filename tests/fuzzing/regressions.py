"""Programs the fuzzers found failing, shrunk: (source, entry, sizes, reason[, options]).

The optional fifth element holds the `tclang.Options` fields of the configuration that
failed (as a dict), which is run on the CPU besides the usual configurations.

tests/fuzzing/test_differential.py runs each through every backend and schedule against
the reference interpreter (in a worker process, so that a crash is a test failure, not
the end of the session). A reason that starts with "OPEN" marks a bug not fixed yet: its
test is a strict xfail, so the fix shows up as an XPASS; then drop the "OPEN" (and the
bug's entry in tclang.fuzzing.differential.KNOWN_BUGS); "FIXED" marks a bug fixed after
the fuzzers found it. `tclang fuzz --regressions` and
`tclang.fuzzing.differential.save_regression` append here.
"""

REGRESSIONS: list[tuple] = []

REGRESSIONS.append((
    "def f(float32 alpha) -> (O) {\n    O = alpha\n}\n", "f", {},
    "FIXED no-loop-at-all: every backend raised TCCompileError 'the polyhedral scop stage "
    "failed for f: call to isl_union_map_read_from_str failed: syntax error' when no "
    "statement of a definition has an index (also `O = 2.0` with a tensor input)"))

REGRESSIONS.append((
    "def f(float(N) A) -> (O) {\n    O = 2.0\n}\n", "f", {"N": 3},
    "FIXED no-loop-at-all: TCCompileError from isl_union_map_read_from_str (syntax error) "
    "in the scop stage, on every backend"))

REGRESSIONS.append((
    "def f(float(M) A) -> (O0) {\n    O0 max=! A(k)\n}\n", "f", {"M": 6},
    "FIXED llvm-abort-unrolled-min-max: cpu with Options(unroll=1) (or 2) aborted the whole "
    "process: LLVM LoopVectorize.cpp:7264 assertion 'VPlan cost model and legacy cost "
    "model disagreed' (M=6; M=5 and M=100 pass; min=! too; vectorize=False avoids it)",
    {"unroll": 1}))

REGRESSIONS.append((
    "def f(float(L, K) A, float(L, K, K) B) -> (O1) {\n    O1 +=! A(i, k) * B(i, j, j)\n}\n",
    "f", {"L": 5, "K": 7},
    "FIXED tiled-reduction-out-of-order: cpu with Options(tile=2, reorder_reductions=False): "
    "with TCLANG_VERIFY=1 TCScheduleError 'the schedule breaks a flow (read-after-write) "
    "dependence on O1'; without it the sum is -2.6391546726226807 where program order gives "
    "-2.6391544342041016 (reorder_reductions=False promises bitwise program order)",
    {"tile": (2,), "reorder_reductions": False}))

REGRESSIONS.append((
    "def matmul(float(M, K) A, float(K, N) B) -> (C) {\n    C(m, n) +=! A(m, k) * B(k, n)\n}\n",
    "matmul", {"M": 1, "K": 7, "N": 1},
    "FIXED cuda-block-reduction-rank: cuda-emulated raised TCCompileError 'the generated "
    "CUDA did not compile for emulation': g++ error: cannot convert 'float [1]' to 'float' "
    "in assignment, at `C_partial[t0] = C_acc[0LL];`: polyhedral/reductions.py gives the "
    "block reduction's private accumulator one dimension per output index but combines "
    "it with one subscript, so every block reduction with two or more output indices "
    "(here a 1x1 output: no parallel loop) fails; the CUDA backend shares the code"))

REGRESSIONS.append((
    "def kernel(float(M) B, int32(M) G) -> (O1, O2) {\n    T0(i) +=! G(i);\n"
    "    O1(i) *=! T0(3*i + j) where j in 0:3\n    O2(j, i) = (O1(i) - B(j))\n"
    "    T4(j, k) +=! O2(i, j) where k in 0:2*M\n"
    "    T5(j, m) +=! fma(O2(l, m), T4(j, k), 0.25)\n}\n", "kernel", {"M": 3},
    "FIXED cuda-block-reduction-rank: (found by `tclang fuzz --seed 2024`, program 174) "
    "cuda-emulated: g++ error: cannot convert 'float [1]' to 'float' at "
    "`T5_partial[t0] = T5_acc[0LL];`"))

REGRESSIONS.append((
    "def fuzz(int8(P, M) A) -> (O1) {\n    T0(i, k, j) = A(i, j) where k in 0:M + 1\n"
    "    O1(l, j) *=! (T0(P - 1 - i, k, l) / A(i, j));\n}\n", "fuzz", {"M": 1, "P": 1},
    "FIXED cuda-block-reduction-rank: (found by `tclang fuzz --seed 7`, program 327) "
    "cuda-emulated: g++ error: invalid conversion from 'signed char*' to 'signed char' "
    "at `O1_partial[t0] = O1_acc[0LL];` (the integer form of the same bug)"))

REGRESSIONS.append((
    "def kernel(double(L, L) A) -> (O3) {\n    T0(i) +=! A(i, i)\n"
    "    T1 +=! (exp(1.0) + A(i, j))\n"
    "    T2(j, i) = ((T0(j) / (fabs(A(i, i)) + 1.0)) / (fabs(T1()) + 1.0))\n"
    "    O3(i) max=! T2(i, i)\n}\n", "kernel", {"L": 2},
    "FIXED runner-tolerance (a bug of the differential runner, not of the compiler; found by "
    "`tclang fuzz --seed 2026`, program 441): `exp(1.0)` is a float32 call (literals are "
    "float32), so the reference and the CPU may differ in its last bit; the runner held "
    "this double program to float64's tolerance and reported a mismatch of 6e-8. The "
    "tolerance now takes the type of every operation, not only of tensors and casts"))

REGRESSIONS.append((
    "def kernel(float32(N, P) A, float32(P) B) -> (O0) {\n    T1(j) min=! A(j, i)\n"
    "    O0(i, j) min=! (B(j) * ((0 + T1(k)) - (A(i, j) * k)))\n}\n", "kernel", {"N": 8, "P": 3},
    "FIXED llvm-minnum-reduction-early-exit (found by `tclang fuzz --seed 2027`, program 3437): "
    "cpu automatic, bounds-checked: 11 of 24 elements wrong (-1.138 instead of -4.196). LLVM "
    "22 vectorized the k loop's llvm.minnum reduction with a NaN check whose no-NaN path "
    "left the loop after one vector step, skipping k = 5..7. Reductions now use "
    "llvm.minimumnum/maximumnum (same NaN rule), which vectorize without that check"))

REGRESSIONS.append((
    "def fuzz(float(M) A, int32(L, M) B, int32(L, M, L, M) C) -> (O0, O1, O2) {\n"
    "    O0(j, i) max=! C(j, i, j, i)\n"
    "    O1(j, i) +=! ((O0(i, j) < 1e30) ? 0 : 0);\n"
    "    O2(i, n) +=! (x / (fabs(O1(l, m)) + 1.0)) where j in 0:2, n in 0:L + 1, "
    "x = (A(k) / (fabs(float32(B(i + j, k))) + 1.0))\n}\n", "fuzz", {"L": 2, "M": 2},
    "FIXED isl-ast-drops-degenerate-instances (found by `tclang fuzz --seed 0`, program "
    "262): every configuration disagreed with the oracle on O2 (here 0.0753 instead of "
    "0.0377 at seed 0); the oracle was wrong. Under reorder_reductions=False isl's "
    "scheduler linearized the reduction to 8j + 4k + 2l + m and added the members j, k, l; "
    "from that tree isl's AST generator ran only the instances with l = 0. The lowering "
    "now drops the band members after an injective prefix (polyhedral/lowering.py)"))

REGRESSIONS.append((
    "def fuzz(float(2, Q, L) A, int8(L, Q) B, float(Q, Q) C) -> (O0) {\n"
    "    O0(j, l, k, i) = hypot(A(k, j, l), B(l, i))\n"
    "    T1(j, i) = B(i, j)\n"
    "    T2(i) = ((0 != 0.0) ? ((i + i >= 0 && i + i <= L - 1) ? T1(i, i + i) : 0) : "
    "fmax(((2*i - 4 >= 0 && 2*i - 4 <= L - 1 && i - i >= 0 && i - i < 2) ? "
    "O0(i, 2*i - 4, i - i, i) : 0.0), C(i, i)))\n}\n", "fuzz", {"L": 3, "Q": 16},
    "FIXED untiled-member-huge-point-loop (found by `tclang fuzz --seed 11`, program 477): "
    "cpu automatic never returned. isl skewed the band (members j - i, 4 - 2j + l) and the "
    "tiling left members whole by tiling them with size 2^30; for negative values the "
    "point loop x mod 2^30 ran 2^30 guarded iterations. Untiled members now join the "
    "point loops untouched (polyhedral/tiling.py _tile)"))

REGRESSIONS.append((
    "def f(int32(L, N) A, int64(N) B, int32(N, K) C, bool(M) D) -> (O0) {\n"
    "    O0(i) = double(B(i))\n"
    "    O0(i) += sqrt(fabs(erf((-0.75))) + 1.0)\n"
    "    O0(i) += (double(A(j, k)) + float(C(k, 0)))\n}\n", "f",
    {"K": 5, "L": 7, "M": 7, "N": 6},
    "FIXED gpu-row-reduction-pointwise-update (found by `tclang fuzz --programs 2000`, seed 0, "
    "program 1032): cuda-emulated automatic crashed with IndexError in "
    "polyhedral/reductions.py: a `+=` with no reduction index (a pointwise step) was taken "
    "for a row reduction and its innermost reduction index looked up. Pointwise steps are "
    "now checked as assignments are"))

REGRESSIONS.append((
    "def fuzz(float32(P, K, K) C) -> (O2) {\n"
    "    O2(n, l, j) *=! (C(k, l, K - 1 - i) * ((C(j, i, n) <= 0.0) ? double(0) : 0))\n}\n",
    "fuzz", {"K": 2, "P": 8},
    "FIXED packed-tensor-read-twice (found by `tclang fuzz --programs 2000`, seed 0, program "
    "656): cpu automatic crashed with StopIteration in polyhedral/packing.py. The lanes (j) "
    "move one of C's two reads; the packing looked for them in the other. A tensor the "
    "register tile's statement reads twice is no longer packed"))

REGRESSIONS.append((
    "def k(double(M, N) A, double(2, 3) B, double(S0, S1) dO, double(M, N) ddA) -> "
    "(double(S0, S1) ddO) {\n    ddO(s0, s1) +=! s0 >= 0 && s0 < 2*M && m == s0 / 2 ? "
    "B(s0 % 2, s1 % 3) * ddA(m, n) : 0.0 where s0 in 0:S0, s1 in 0:S1, m in 0:M, n in 0:N\n}\n",
    "k", {"M": 1, "N": 7, "S0": 2, "S1": 21},
    "FIXED guarded-sum-factor-scope (not found by the fuzzer: kronecker_literal's second "
    "derivative, tc.grad of its backward): every backend raised TCCompileError 'the "
    "polyhedral scop stage failed for k: call to isl_union_map_read_from_str failed: syntax "
    "error': factoring out the sum's scale took B(s0 % 2, s1 % 3) out of the sum restricted "
    "to m == s0 / 2, keeping that guard (and the condition) in an assignment without m. "
    "Options(passes=False) or reorder_reductions=False avoided it. Fixed by b9d2aa2; "
    "tclang/lang/passes/rewrite.py's check_names now refuses any such rewrite by name"))

REGRESSIONS.append((
    "def f(float(R, N) X, float(R, N) Y) -> (Z) {\n"
    "    Z(r, k) +=! (k < i) ? X(r, k) * Y(r, i) : 0.0 where r in 0:R, k in 0:N, i in 0:N\n"
    "}\n", "f", {"R": 4, "N": 3},
    "FIXED guarded-sum-factor-scop (a factor that reads a tensor stays in a guarded sum, "
    "tclang/lang/reduction_scales.py): the automatic schedule on cpu, reference and "
    "cuda-emulated raises TCCompileError 'the polyhedral scop stage failed for f: call to "
    "isl_union_map_read_from_str failed: syntax error'; Options(passes=False), "
    "shape-generic code and some manual options compile it. Found by tclang fuzz's "
    "reduction programs (and in tc.grad's backward of a guarded prefix sum of tanh)"))

REGRESSIONS.append((
    "def f(float(K) X, float(K) Y) -> (Z) {\n"
    "    Z(a, b) +=! b == a - 1 ? X(a - 1) * Y(i) : 0.0 where a in 0:K, b in 0:K, i in 0:K\n"
    "}\n", "f", {"K": 3},
    "FIXED guarded-sum-factor (out-of-bounds; the same fix): the automatic schedule on cpu and reference "
    "reads X[-1] (TCIndexError with bounds checks): X(a - 1), which does not depend on the "
    "reduced i, loses the guard b == a - 1 (which keeps a >= 1); passes=False reads "
    "nothing outside. Found through tc.grad's backward of a guarded read "
    "(B(j + 2, j - 1, k, j - 2) under j - 2 >= 0 && ...), whose equality guards the "
    "generic generator never writes"))
