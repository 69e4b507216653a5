"""Automatic schedules, asserted on the loop IR: fusion, tiling, parallel outer loops,
stride-1 innermost loops; the legality checker; shape-generic code; the scheduler guard."""

import numpy as np
import pytest

import tclang as tc
from tclang.lang import program as P
from polyhedral import loop_ir as L
from polyhedral import scheduler
from polyhedral.pipeline import schedule_definition
from tclang.lang.frontend import check_source
from tclang.target import Target

from .loops import enclosing_loops, executed_instances, nest_of, top_level, uses

CPU = Target("cpu", "threads", cores=4, vector_bytes=32)

PROGRAMS = {
    "matmul": ("def matmul(float(M,K) A, float(K,N) B) -> (C) { C(m, n) +=! A(m, k) * B(k, n) }",
               dict(M=256, K=256, N=256), "S0"),
    "conv2d": ("def conv2d(float(N,C,H,W) I, float(M,C,KH,KW) Wt) -> (O) {"
               " O(n, m, h, w) +=! I(n, c, h + kh, w + kw) * Wt(m, c, kh, kw) }",
               dict(N=4, C=16, H=34, W=66, M=64, KH=3, KW=3), "S0"),
    "batched_matmul": ("def bmm(float(B,N,M) X, float(B,M,K) Y) -> (Z) {"
                       " Z(b, n, k) +=! X(b, n, m) * Y(b, m, k) }",
                       dict(B=8, N=128, M=128, K=128), "S0"),
    "mlp2": ("def mlp2(float(B,I) X, float(H,I) W1, float(H) b1, float(O,H) W2, float(O) b2)"
             " -> (Y) {\n Hd(n, h) +=! X(n, i) * W1(h, i)\n Hd(n, h) = fmax(Hd(n, h) + b1(h), 0)"
             "\n Y(n, o) +=! Hd(n, h) * W2(o, h)\n Y(n, o) = fmax(Y(n, o) + b2(o), 0) }",
             dict(B=128, I=256, H=256, O=128), "S2"),
}


def schedule(name, options=tc.Options(), target=CPU):
    source, sizes, _ = PROGRAMS[name]
    return schedule_definition(check_source(source).definitions[0], sizes, options, target)


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_fused_tiled_parallel_and_stride_one(name):
    # the cache-level tiling and loop order alone (register tiles of contractions are
    # tests/polyhedral/test_register_tiles.py's)
    kernel = schedule(name, tc.Options(register_tile=False)).kernel
    main = PROGRAMS[name][2]
    statement = kernel.statement(main)
    # the last copy: polyhedral/guard_splitting.py may unswitch the vector loop (the
    # initialisation's test) into copies that differ only in their guards
    chain, run = list(enclosing_loops(kernel.body, main))[-1]
    # tiled: more loops around the reduction than it has indices
    assert len(chain) > len(statement.indices), [f.var for f in chain]
    # the outermost loop runs in parallel
    assert chain[0].parallel
    # the innermost loop is the stride-1 one: every access it moves, it moves only in the
    # last subscript and by one element; accesses it does not move stay in registers
    inner = chain[-1].var
    index_of = dict(zip(statement.indices, run.indices))
    moved = 0
    for subscripts in [[L.index_var(i) for i in statement.lhs]] + \
            [list(r.affine) for r in P.reads_of(statement.value)]:
        moving = [k for k, a in enumerate(subscripts)
                  if any(uses(index_of[i], inner) for i in indices_in(a))]
        if moving:
            moved += 1
            assert moving == [len(subscripts) - 1], (name, subscripts)
            last = subscripts[-1]
            steps = [coefficient(last, i) for i in indices_in(last) if uses(index_of[i], inner)]
            assert steps in ([1], [-1]), (name, last)
    assert moved >= 1 and chain[-1].vectorize
    # fused: the init (and any epilogue of the same tensor) share the reduction's nest
    nest = nest_of(kernel, main)
    for s in kernel.statements:
        if s.target == statement.target:
            assert list(enclosing_loops(nest, s.id)), f"{s.id} not fused with {main}"


def indices_in(e: L.IExpr) -> set[str]:
    """The statement indices a lowered subscript uses."""
    return {L.index_name(v) for v in L.variables(e)} - {None}


def coefficient(e: L.IExpr, index: str) -> int:
    """The coefficient of statement index `index` in a linear subscript."""
    zero = dict.fromkeys(L.variables(e), 0)
    return L.evaluate(e, {**zero, L.index_var(index).name: 1}) - L.evaluate(e, zero)


def test_mlp_layers_keep_their_parallelism():
    """preserve_parallel does not fuse the two layers (that would lose parallel loops)."""
    kernel = schedule("mlp2").kernel
    assert nest_of(kernel, "S0") is not nest_of(kernel, "S2")
    for node in top_level(kernel):
        assert isinstance(node, L.For) and node.parallel


def test_min_fusion_gives_each_statement_its_own_nest():
    kernel = schedule("matmul", tc.Options(fusion="min")).kernel
    assert nest_of(kernel, "I0") is not nest_of(kernel, "S0")


def test_manual_tile_sizes_are_used():
    kernel = schedule("matmul", tc.Options(tile=(16, 8, 4))).kernel
    chain, _ = list(enclosing_loops(kernel.body, "S0"))[-1]  # copies: guard_splitting.py
    trips = [L.evaluate(f.hi, {}) - L.evaluate(f.lo, {}) for f in chain[:3]]
    assert trips == [256 // 16, 256 // 8, 256 // 4]


def test_illegal_loop_order_is_refused_naming_the_dependence():
    source = "def total(float(N, M) A) -> (s) {\n  s +=! A(i, j)\n}"
    defn = check_source(source).definitions[0]
    options = tc.Options(reorder_reductions=False, loop_order=(1, 0))
    with pytest.raises(tc.TCScheduleError) as info:
        schedule_definition(defn, dict(N=3, M=4), options, CPU)
    message = str(info.value)
    assert "flow (read-after-write) dependence on s" in message
    assert "loop_order=(1, 0)" in message and info.value.line == 2
    # the same order is legal when reductions may be reordered
    schedule_definition(defn, dict(N=3, M=4), tc.Options(loop_order=(1, 0)), CPU)


@pytest.mark.parametrize("order", [None, ("j", "k"), ("k", "j")])
@pytest.mark.parametrize("target", [CPU, Target("cuda", "grid", arch="sm_90")])
def test_interchanged_reduction_loops_are_never_parallel(order, target):
    """Summing over j and k into one element: whichever loop runs outside, neither may be
    run in parallel (or spread over threads) without a block reduction. Flow analysis only
    links each update to the one before it in program order; with k outside, no such
    neighbour pair lies inside one k iteration, and the j loop used to be marked parallel
    and run on threads, racing on O(0)."""
    source = "def f(float(J,K) A) -> (O) { O(i) +=! A(j, k) where i in 0:1 }"
    defn = check_source(source).definitions[0]
    kernel = schedule_definition(defn, dict(J=64, K=5), tc.Options(loop_order=order, tile=0),
                                 target).kernel
    (chain, _), = list(enclosing_loops(kernel.body, "S0"))
    assert not any(loop.parallel for loop in chain), [(f.var, f.parallel) for f in chain]


def test_loop_order_by_index_names():
    kernel = schedule("matmul", tc.Options(loop_order=("k", "m", "n"), tile=())).kernel
    chain, run = list(enclosing_loops(kernel.body, "S0"))[-1]  # copies: guard_splitting.py
    assert uses(run.indices[2], chain[0].var)  # k outermost


def test_bad_loop_orders_are_explained():
    with pytest.raises(tc.TCScheduleError, match="not a permutation"):
        schedule("matmul", tc.Options(loop_order=(0, 1)))
    with pytest.raises(tc.TCScheduleError, match="not the index"):
        schedule("matmul", tc.Options(loop_order=("x", "m", "n")))


def test_shape_generic_kernel_is_valid_for_all_sizes():
    mod = tc.define(PROGRAMS["mlp2"][0], backend="reference",
                    options=tc.Options(specialize=False))
    rng = np.random.default_rng(1)
    for B, I, H, O in [(1, 1, 1, 1), (3, 7, 5, 2), (5, 2, 11, 13)]:
        X, W1, b1 = rng.random((B, I), np.float32), rng.random((H, I), np.float32), \
            rng.random(H, np.float32)
        W2, b2 = rng.random((O, H), np.float32), rng.random(O, np.float32)
        hidden = np.maximum(X @ W1.T + b1, 0)
        np.testing.assert_allclose(mod.mlp2(X, W1, b1, W2, b2),
                                   np.maximum(hidden @ W2.T + b2, 0), rtol=1e-5)
    assert len(mod.mlp2._compiled) == 1  # one compilation served every shape


@pytest.fixture
def fresh_scheduler():
    """The scheduling process is forked on first use and kept: stop it before and after,
    so that a test's patches reach the process it runs and go with it."""
    if scheduler._scheduler.pid is not None:
        scheduler._scheduler._stop()
    scheduler._answers.clear()
    yield
    if scheduler._scheduler.pid is not None:
        scheduler._scheduler._stop()


def test_scheduler_time_guard_falls_back(monkeypatch, fresh_scheduler):
    """A "max" schedule past its time limit (here isl is made to stall) falls back to
    "min", saying why; the stalled process is killed and "min" gets a new one."""
    import time
    real_options, real_worker = scheduler._set_options, scheduler._in_worker

    def stalling(ctx, fusion):
        if fusion == "max":
            time.sleep(60)
        real_options(ctx, fusion)

    monkeypatch.setattr(scheduler, "_set_options", stalling)
    monkeypatch.setattr(scheduler, "_in_worker", lambda scop, deps, strategy, limit: real_worker(
        scop, deps, strategy, 0.5 if strategy == "max" else limit))
    defn = check_source(PROGRAMS["matmul"][0]).definitions[0]
    start = time.perf_counter()
    result = schedule_definition(defn, dict(M=8, K=8, N=8), tc.Options(fusion="max"), CPU)
    assert result.strategy == "min" and "ran past 0.5 s" in result.fallback
    assert time.perf_counter() - start < 10


# found by `tclang fuzz --seed 2027` (program 773): isl's scheduler ran for minutes on it,
# whatever the operation limit, while proximity bounded the distance to every consumer
HANGS = """def f(int64(M) A, float(P, P, M, L) B, float gamma) -> (O1, O2, O3, O5) {
    T0(j, k, l, i) = (double(A(i)) * 0.5 + B(j, P - 1 - j, k, l))
    O1(i, l) += B(i, j, k, l);
    O2(i, j, k, l) = (((((!(j - 1 < 0 || j - 1 >= L)) ? T0(i, M - 1 - j, j - 1, l) : 0.0) < 1e30) && (((i - 2 >= 0 && i - 2 <= L - 1) ? B(i, P - 1 - i, l, i - 2) : 0.0) > 0.0)) ? ((fma(double(A(M - 1 - j)), B(i, i, j, k), 0.25) * T0(i, l, k, M - 1 - l)) * fma(2.0, float(((!(k - j < 0 || k - j >= M)) ? A(k - j) : 0)), 0.25)) : B(i, P - 1 - i, M - 1 - l, k));
    O3(k, m, n) += (B(i, l, M - 1 - j, m) / (fabs(O2(i, j, k, j)) + 1.0)) where n in 0:M;
    T4(k, j, i) = min(max(min((int32(floor(((j + 1 >= 0 && j + 1 <= P - 1) ? B(j + 1, j, i, k) : 0.0))) % 4), int32(O1(j, k) > 1e30)), A(i)), max((M + (j - j)), (-int32(T0(j, i, k, i) > 1e30))))
    O5(i) max=! (((((i + 1 >= 0 && i + 1 < L && L - i >= 0 && L - i < L) ? O3(i + 1, L - i, M - 1) : 1) < 1e30) != (((2*i - 1 >= 0 && 2*i - 1 <= P - 1 && !(i - 2 < 0 || i - 2 >= L)) ? O2(2*i - 1, i, i - 2, i) : 1) < 1e30)) ? O1(P - 1, L - 1) : ((fma(cos(1.5), (float32(i) * 0.5 + float32((i - L))), 0.25) + rsqrt(fabs(float(((i + i >= 0 && i + i <= L - 1 && !(i - 2 < 0 || i - 2 >= P)) ? T4(i + i, i - 2, i) : 0))) + 1.0)) - double(A(i))))
}"""


@pytest.mark.filterwarnings("ignore::tclang.errors.TCWarning")
def test_fuzzer_found_scheduler_blowup_is_gone():
    """With proximity to the first consumer only, PPCG's options schedule it at once
    (~0.3 s here, minutes before): no fallback, and the schedule is legal (TCLANG_VERIFY)."""
    defn = check_source(HANGS).definitions[0]
    result = schedule_definition(defn, dict(L=1, M=11, P=2), tc.Options(), CPU)
    assert result.strategy == "preserve_parallel" and result.fallback is None


# found by `tclang fuzz` (seed 0, program 612): the ILP ran past 30 s with unbounded
# schedule coefficients (0.2 s with scheduler.MAX_COEFFICIENT)
UNBOUNDED_COEFFICIENTS = """def f(bool(N) A, float(P, N, N) B) -> (float32(N, N, N, N) O1, O3, O4) {
    T0(k, j) +=! B(i, j, j) where exists A(k);
    O1(i, k, l, m) +=! tanh((((fma(T0(i, i), B(j, k, l), 0.25) * (A(i) ? 1.5 : -0.5)) < 1e30) ? (fma(T0(i, i), B(j, k, l), 0.25) * (A(i) ? 1.5 : -0.5)) : (-0.75))) where m in 0:N
    T2(k, j) *=! (1.0 + 0.01 * tanh((A(N - 1 - j) ? (A(j) ? 1.5 : -0.5) : hypot((pow(fabs((A(N - 1 - j) ? 1.5 : -0.5)) + 1.0, 1.5) * ((((O1(j, j, j, N - 1 - j) < 1e30) != (i <= k)) ? 0.5 : (A(j) ? 1.5 : -0.5)) / (fabs(fabs((A(j) ? 1.5 : -0.5))) + 1.0))), B(i, j, k + l))))) where l in 0:2
    O3(i, k) +=! min((((((A(N - 1 - k) && A(N - 1)) ? (((2*j - 4 >= 0 && 2*j - 4 < N) ? O1(2*j - 4, N - 1 - k, k, k) : 0.0) < 1e30) : true) ? (((k + i >= 0 && k + i <= N - 1 && !(k + 1 < 0 || k + 1 >= N)) ? O1(k + i, k, k, k + 1) : 1) < 1e30) : (T2(0, N - 1 - k) < 1e30)) ? (i == 1) : (T0(k, k) < 1e30)) ? T0(k, k) : double(k)), T0(i + j, k)) where j in 0:3
    O4(l, k, i, j) = (fmax(fma(erf(((false ? false : (T0(l, i) < 1e30)) ? 2.0 : double(P))), T2(0, j), 0.25), double(int32(((k - j >= 0 && k - j <= N - 1) ? A(k - j) : false)))) * O1(i, j, k, l))
}"""

# found by `tclang fuzz` (seed 0, program 1072) with specialize=False: the lexmin of the
# nearest-consumer proximity took 18 s with symbolic sizes (now under an operation limit)
SYMBOLIC_LEXMIN = """def kernel(float(P, Q) A, float32(N, P, L) B) -> (O0, O1, O2) {
    O0(i, k, l, j) = (((B(k, l, L - 1) * A(i, j)) < 1e30) ? float((k - 1)) : (B(k, l, L - 1) * A(i, j)))
    O1(k) +=! tanh(x) where x = fma((((((!(P - k < 0 || P - k >= P) && i - j >= 0 && i - j < N && j + 2 >= 0 && j + 2 <= P - 1) ? O0(P - k, i - j, j + 2, j) : 0) - double(L)) * ((((!(2*k - 4 < 0 || 2*k - 4 >= N) && !(i - j < 0 || i - j >= P)) ? O0(i, 2*k - 4, i - j, j) : 0) < 1e30) ? float32(j) : 0.25)) * (fma(((!(k + j < 0 || k + j >= N) && 2*i - 1 >= 0 && 2*i - 1 <= P - 1 && k - j >= 0 && k - j < Q) ? O0(i, k + j, 2*i - 1, k - j) : 0), ((!(k - 1 < 0 || k - 1 >= N) && k - j >= 0 && k - j <= P - 1) ? O0(i, k - 1, k - j, j) : 0), 0.25) / (fabs(hypot(0.25, A(i, j))) + 1.0))), A(i, j), 0.25), k in 0:Q + 1
    O2(i, m, n, k) *=! (1.0 + 0.01 * tanh(min(O0(l, m, n, k), A(j + i*3, k)))) where j in 0:1;
}"""


@pytest.mark.filterwarnings("ignore::tclang.errors.TCWarning")
@pytest.mark.parametrize("source, sizes", [(UNBOUNDED_COEFFICIENTS, dict(N=3, P=2)),
                                           (SYMBOLIC_LEXMIN, None)],
                         ids=["coefficients", "symbolic-lexmin"])
def test_fuzzer_found_scheduler_timeouts_are_gone(source, sizes):
    """Both ran past the scheduler's time limit for every strategy (20 s and more, then
    program order); now PPCG's options schedule them at once, legally (TCLANG_VERIFY)."""
    defn = check_source(source).definitions[0]
    result = schedule_definition(defn, sizes, tc.Options(), CPU)
    assert result.strategy == "preserve_parallel" and result.fallback is None


def test_the_nearest_consumer_proximity_gives_up_past_its_operation_limit(monkeypatch):
    """Past LEXMIN_OPERATIONS the full proximity is kept, and scheduling goes on."""
    monkeypatch.setattr(scheduler, "LEXMIN_OPERATIONS", 1)
    defn = check_source(PROGRAMS["mlp2"][0]).definitions[0]
    result = schedule_definition(defn, PROGRAMS["mlp2"][1], tc.Options(), CPU)
    assert result.strategy == "preserve_parallel" and result.fallback is None


def test_one_scop_is_scheduled_once_for_every_target(monkeypatch, fresh_scheduler):
    """The scheduling process's answer is kept: the CPU and the reference backend (and
    manual options that keep the fusion) reuse it instead of asking isl again."""
    from tclang.target import reference_target
    asked, real = [], scheduler._ask
    monkeypatch.setattr(scheduler, "_ask", lambda *a: asked.append(a[1]) or real(*a))
    defn = check_source(PROGRAMS["mlp2"][0]).definitions[0]
    sizes = dict(B=5, I=7, H=3, O=2)
    for target, options in ((CPU, tc.Options()), (reference_target(), tc.Options()),
                            (CPU, tc.Options(tile=4))):
        result = schedule_definition(defn, sizes, options, target)
        assert result.strategy == "preserve_parallel" and result.fallback is None
    assert asked == ["preserve_parallel"]


def test_fallbacks_share_the_time_limit(monkeypatch):
    """A program that blows up under every strategy costs about the time limit in all:
    the fallback gets what is left (at least FALLBACK_LIMIT), not a limit of its own."""
    import types
    readings = iter(range(0, 1000, 9))  # each clock reading 9 s after the last
    monkeypatch.setattr(scheduler, "time", types.SimpleNamespace(
        perf_counter=lambda: next(readings)))
    limits = []

    def timing_out(scop, deps, strategy, limit):
        limits.append((strategy, limit))
        raise scheduler._Failed(f"the scheduler ran past {limit:g} s")

    monkeypatch.setattr(scheduler, "_in_worker", timing_out)
    defn = check_source(PROGRAMS["mlp2"][0]).definitions[0]
    result = schedule_definition(defn, dict(B=4, I=4, H=4, O=4), tc.Options(), CPU)
    assert result.strategy == "original"
    assert limits == [("preserve_parallel", scheduler.TIME_LIMIT),
                      ("min", scheduler.FALLBACK_LIMIT)]



def test_a_blown_up_schedule_leaves_room_in_a_fuzzed_programs_time():
    """`tclang fuzz` gives a program (about six compilations) PROGRAM_SECONDS; a scheduler
    blow-up costs the first strategy's limit plus the fallback's. With 10 s for the first,
    every shape-generic compile that blew up made its program "slow"."""
    from tclang.fuzzing.driver import PROGRAM_SECONDS
    assert scheduler.TIME_LIMIT + scheduler.FALLBACK_LIMIT <= PROGRAM_SECONDS / 2


# found by `tclang fuzz` (seed 0, program 1864) with specialize=False: PPCG's options and
# "max" run for 40 s on its scop, whatever the isl options and operation limit; "min" 0.1 s
GENERIC_BLOWUP = """def fuzz(int64(N, N) A) -> (O3) {
    T0(i, j) = (((((true ? (A(N - 1 - j, i) <= 0) : (((i + j >= 0 && i + j <= N - 1) ? A(i, i + j) : 0) != 0)) ? float(((i + i >= 0 && i + i <= N - 1) ? A(j, i + i) : 0)) : 0.5) * fmax(double(i), float(((j + 1 >= 0 && j + 1 <= N - 1 && !(i - i < 0 || i - i >= N)) ? A(j + 1, i - i) : 0)))) * double(A(i, j))) * round(double(N)))
    T1(i, j, l) +=! (T0(i, k + j) * x) where x = float(A(l, i)), k in 0:2;
    T1(i, j, k) += ((T0(k, N - 1 - i) < 1e30) ? float32(A(k, k)) : ((A(k, i) != 0) ? double(N) : min(float(A(k, N - 1 - k)), float32(A(0, i)))));
    O3(p, n, i, l) min=! (min((T1(i, j, k) + float32(A(i, l))), (abs(log(fabs(T1(n, j, l)) + 1.0)) - double((A(N - 1 - i, i) - ((!(m + 1 < 0 || m + 1 >= N)) ? A(m + 1, i) : 0))))) - x) where x = T0(m, n), p in 0:N + 1
    T4(j, i, k, l) = (((O3(i, k, j, k) < 1e30) ? true : (A(l, j) != 0)) ? T0(l, 0) : fmax(((((j != N) && (T1(k, 0, j) < 1e30)) ? 0.5 : ((A(k, j) > 0) ? 1.5 : -0.5)) + hypot(T1(k, 0, N - 1 - k), float32(i))), O3(i, j, k, l))) where exists T0(j, N - 1 - j)
    T1(i, j, k) min= (((erf(double((-4))) * double(A(m, i))) + fma(cbrt(floor(float(A(k, m)))), ((O3(0, k, N - 1 - k, m) < 1e30) ? (float32(A(0, N - 1 - k)) + 1.5) : T0(k, k)), 0.25)) * 0.5 + O3(l, m, m, k))
}"""


@pytest.mark.filterwarnings("ignore::tclang.errors.TCWarning")
def test_a_real_scheduler_blowup_falls_back_to_min(fresh_scheduler):
    """Past the time limit the chain takes "min" (legal: TCLANG_VERIFY), and the
    shape-generic kernel computes what the program as written does."""
    defn = check_source(GENERIC_BLOWUP).definitions[0]
    result = schedule_definition(defn, None, tc.Options(), CPU)
    assert result.strategy == "min" and "preserve_parallel: " in result.fallback
    generic = tc.define(GENERIC_BLOWUP, options=tc.Options(specialize=False)).fuzz
    as_written = tc.define(GENERIC_BLOWUP, backend="reference", options=tc.Options(
        fusion="min", tile=(), reorder_reductions=False, passes=False)).fuzz
    for n in (2, 3):
        A = np.random.default_rng(n).integers(-3, 4, (n, n)).astype(np.int64)
        np.testing.assert_allclose(generic(A), as_written(A), rtol=1e-5)

def test_scheduler_operation_guard_falls_back(monkeypatch):
    """isl giving up in-process (here: an operation limit of 1, on a one-statement scop,
    the only kind scheduled in-process) ends at program order, not an error."""
    monkeypatch.setattr(scheduler, "MAX_OPERATIONS", 1)
    source = "def scale(float(N, M) A) -> (B) { B(i, j) = A(i, j) * 2 }"
    defn = check_source(source).definitions[0]
    result = schedule_definition(defn, dict(N=8, M=8), tc.Options(), CPU)
    assert result.strategy == "original" and "isl gave up" in result.fallback
    mod = tc.define(PROGRAMS["matmul"][0], backend="reference")
    A, B = np.ones((3, 2), np.float32), np.ones((2, 4), np.float32)
    np.testing.assert_array_equal(mod.matmul(A, B), A @ B)


@pytest.mark.parametrize("extents", [(2, 2, 2, 2), (3, 2, 2, 2), (2, 3, 1, 2)])
def test_program_order_reduction_runs_every_instance_once(extents):
    """With reductions in program order isl's scheduler linearizes a 2x2x2x2 reduction to
    8j + 4k + 2l + m and adds j, k, l for full rank; isl's AST generator then ran only the
    instances with l = 0 (fuzz program 262). The lowering drops the members after an
    injective prefix: every instance runs once, in program order."""
    defn = check_source("def f(float(J, K, L, M) A) -> (O) {"
                        " O(n) +=! A(j, k, l, m) where n in 0:2 }").definitions[0]
    sizes = dict(zip("JKLM", extents))
    options = tc.Options(fusion="min", tile=(), reorder_reductions=False)
    runs = executed_instances(schedule_definition(defn, sizes, options, CPU).kernel)
    J, K, L_, M = extents
    in_order = [(n, j, k, l, m) for n in range(2) for j in range(J) for k in range(K)
                for l in range(L_) for m in range(M)]
    assert sorted(runs["S0"]) == in_order
    for n in range(2):  # each output's terms in program order
        assert [r for r in runs["S0"] if r[0] == n] == in_order[n * J * K * L_ * M:
                                                               (n + 1) * J * K * L_ * M]


def test_members_after_an_injective_prefix_are_dropped():
    """Within one band too: after the linearized member nothing is left to order, while
    an ordinary band keeps every member (the pass leaves it alone)."""
    import islpy as isl
    from polyhedral.lowering import drop_members_after_injective_prefix

    def band_members(members: str) -> list[int]:
        ctx = isl.Context()
        tree = isl.Schedule.read_from_str(ctx, (
            'domain: "{ S[j, k, l, m] : 0 <= j, k, l, m <= 1 }"\n'
            f'child:\n  schedule: "[{members}]"\n  permutable: 1\n'))
        found = []

        def visit(node: isl.ScheduleNode) -> bool:
            if node.get_type() == isl.schedule_node_type.band:
                found.append(node.band_n_member())
            return True

        drop_members_after_injective_prefix(tree).get_root().foreach_descendant_top_down(visit)
        return found

    linearized = ", ".join(f"{{ S[j, k, l, m] -> [({e})] }}"
                           for e in ("8j + 4k + 2l + m", "j", "k", "l"))
    assert band_members(linearized) == [1]
    plain = ", ".join(f"{{ S[j, k, l, m] -> [({e})] }}" for e in "jklm")
    assert band_members(plain) == [4]


def test_gpu_mapping_runs_every_instance_once():
    """The block and thread filters partition the domain: interpreting the GPU-mapped
    kernel (every CUDA thread a generator) gives NumPy's results, for block shapes that do
    and do not divide the sizes."""
    from backends.interpreter import compile_kernel
    gpu = Target("cuda", "grid")
    source = PROGRAMS["batched_matmul"][0]
    defn = check_source(source).definitions[0]
    rng = np.random.default_rng(0)
    X, Y = rng.random((3, 5, 7), np.float32), rng.random((3, 7, 6), np.float32)
    for options in (tc.Options(), tc.Options(block=(4, 2), tile=3)):
        kernel = schedule_definition(defn, dict(B=3, N=5, M=7, K=6), options, gpu).kernel
        launches = [n for n in L.walk_nodes(kernel.body) if isinstance(n, L.Launch)]
        assert launches and launches[0].block[0] > 1
        arrays = {"X": X, "Y": Y, "Z": np.zeros((3, 5, 6), np.float32)}
        compile_kernel(kernel)(arrays, dict(B=3, N=5, M=7, K=6))
        np.testing.assert_allclose(arrays["Z"], X @ Y, rtol=1e-5)


def test_the_scheduling_process_ends_with_its_compiler():
    """A compiler process killed outright (a fuzz worker, a CI job) leaves no scheduling
    process behind holding its stdout open: the reader sees EOF within seconds."""
    import subprocess
    import sys
    import threading
    from pathlib import Path
    code = ("import tclang as tc, numpy as np, time\n"
            "m = tc.define('def mm(float(M,K) A, float(K,N) B) -> (C) "
            "{ C(m,n) +=! A(m,k) * B(k,n) }')\n"
            "m.mm(np.ones((2, 3), np.float32), np.ones((3, 4), np.float32))\n"
            "print('compiled', flush=True)\n"
            "time.sleep(120)\n")
    root = Path(__file__).resolve().parents[2]
    child = subprocess.Popen([sys.executable, "-c", code], cwd=root, stdout=subprocess.PIPE,
                             text=True)
    assert child.stdout.readline().strip() == "compiled"
    child.kill()
    child.wait()
    reader = threading.Thread(target=child.stdout.read, daemon=True)
    reader.start()
    reader.join(15)
    assert not reader.is_alive(), "a process forked by the compiler outlived it"


def test_untiled_members_of_a_skewed_band_run_only_their_values():
    """Fuzz program 477: isl skews the band (members j - i and 4 - 2j + l, negative for
    most points) and the tiling leaves some members whole. "Tiling" them by a huge size
    gave point loops x mod 2^30 that ran 2^30 guarded iterations for negative x: the kernel
    never returned. Untiled members now join the point loops untouched; every instance
    still runs once."""
    source = (
        "def fuzz(float(2, Q, L) A, int8(L, Q) B, float(Q, Q) C) -> (O0) {\n"
        "    O0(j, l, k, i) = hypot(A(k, j, l), B(l, i))\n"
        "    T1(j, i) = B(i, j)\n"
        "    T2(i) = ((0 != 0.0) ? ((i + i >= 0 && i + i <= L - 1) ? T1(i, i + i) : 0) : "
        "fmax(((2*i - 4 >= 0 && 2*i - 4 <= L - 1 && i - i >= 0 && i - i < 2) ? "
        "O0(i, 2*i - 4, i - i, i) : 0.0), C(i, i)))\n}\n")
    defn = check_source(source).definitions[0]
    sizes = dict(L=3, Q=16)
    result = schedule_definition(defn, sizes, tc.Options(passes=False),  # as written
                                 Target("cpu", "threads", cores=2, vector_bytes=32))
    runs = executed_instances(result.kernel, max_iterations=10**5)
    assert sorted(runs["S0"]) == sorted({r for r in runs["S0"]})  # each instance once
    assert len(runs["S0"]) == 16 * 3 * 2 * 16 and len(runs["S2"]) == 16
