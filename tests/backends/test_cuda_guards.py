"""Guards on the GPU: every path of the mapping runs a statement only where its guard holds.

A sum of `c ? e : 0` with an affine `c` runs over the points where `c` holds: the condition
is in the statement's domain, not in its value (tclang/lang/guarded_sums.py). isl's loops
walk domains; the loops of a block reduction (polyhedral/reductions.py: a block per row,
a full reduction, a small output with a long sum) walk boxes and take each statement's
guard from its domain. Before, they walked the box alone and added every `e`: a causal
mask was ignored from rows of 32 on (rows of 31 stay on one thread each). Each program
here runs on the generated CUDA and its CPU emulation against NumPy, at rows around a
warp, at 1 and a prime and at 1025 rows; its loop IR runs exactly its domain's instances;
its CUDA compiles with nvcc.
"""

from __future__ import annotations

import shutil
from collections import Counter
from types import SimpleNamespace

import islpy as isl
import numpy as np
import pytest

import tclang as tc
from backends.cuda.emulation.build import available
from backends.cuda.codegen import PRELUDE
from polyhedral.pipeline import schedule_definition
from tclang.lang.frontend import check_source
from tclang.options import Options
from tests.backends.test_cuda_codegen import GPU, _compile, _source
from tests.polyhedral.loops import executed_instances

CUDA = "cuda-emulated"
emulated = pytest.mark.skipif(not available(), reason="the emulation needs g++")
# (rows, columns): around a warp (row reductions start at 32 columns), 1, a prime, and
# 1025 rows of 40 columns (several blocks' worth of rows, grid-stride loops)
SHAPES = [(1, 1), (31, 31), (32, 32), (33, 33), (37, 37), (1025, 40)]


def _where(keep, a: np.ndarray, other=0.0) -> np.ndarray:
    """`a` where keep(row, column) holds, else `other` (in float64)."""
    i, j = np.indices(a.shape)
    return np.where(keep(i, j), a.astype(np.float64), other)


def _rows(r: int, c: int, rng) -> tuple:
    return (rng.uniform(-1, 1, (r, c)).astype(np.float32),)


def _tri(op: str, keep):
    return (f"def f(float(R,C) S) -> (Z) {{ Z(i) +=! (j {op} i) ? S(i, j) : 0.0 "
            "where i in 0:R, j in 0:C }", _rows, lambda S: _where(keep, S).sum(1))


# name: (source of `f`, inputs for (rows, columns), NumPy's result)
PROGRAMS = {
    "lower": _tri("<=", lambda i, j: j <= i),
    "strictly_lower": _tri("<", lambda i, j: j < i),
    "upper": _tri(">=", lambda i, j: j >= i),
    "two_sided": (
        "def f(float(R,C) S) -> (Z) { Z(i) +=! (j >= i - 2 && j <= i + 2) ? S(i, j) : 0.0 "
        "where i in 0:R, j in 0:C }",
        _rows, lambda S: _where(lambda i, j: (j >= i - 2) & (j <= i + 2), S).sum(1)),
    "padding": (  # reads under the guard only: X has no column -1 or C
        "def f(float(R,C) X) -> (Z) { Z(i) +=! (j >= 1 && j <= C) ? X(i, j - 1) * 2.0 : 0.0 "
        "where i in 0:R, j in 0:C + 2 }",
        _rows, lambda X: 2 * X.astype(np.float64).sum(1)),
    "modulo": (
        "def f(float(R,C) S) -> (Z) { Z(i) +=! ((i + j) % 3 != 0) ? S(i, j) : 0.0 "
        "where i in 0:R, j in 0:C }",
        _rows, lambda S: _where(lambda i, j: (i + j) % 3 != 0, S).sum(1)),
    "sizes": (  # a guard on the sizes too
        "def f(float(R,C) S) -> (Z) { Z(i) +=! (j < C - 1 && j >= R - 1 - i) ? S(i, j) : 0.0 "
        "where i in 0:R, j in 0:C }",
        _rows, lambda S: _where(lambda i, j: (j < S.shape[1] - 1) & (j >= S.shape[0] - 1 - i),
                                S).sum(1)),
    "mask": (  # a data-dependent condition stays in the value
        "def f(float(R,C) S, float(R,C) M) -> (Z) { Z(i) +=! (M(i, j) > 0.0) ? S(i, j) : 0.0 }",
        lambda r, c, rng: (*_rows(r, c, rng), *_rows(r, c, rng)),
        lambda S, M: np.where(M > 0, S.astype(np.float64), 0).sum(1)),
    "full": (  # no left side: one block reduces it all
        "def f(float(R,C) S) -> (z) { z +=! (j <= i) ? S(i, j) : 0.0 where i in 0:R, j in 0:C }",
        _rows, lambda S: _where(lambda i, j: j <= i, S).sum()),
    "gemv": (
        "def f(float(R,C) A, float(C) x) -> (y) { y(m) +=! (k <= m) ? A(m, k) * x(k) : 0.0 "
        "where m in 0:R, k in 0:C }",
        lambda r, c, rng: (*_rows(r, c, rng), rng.uniform(-1, 1, c).astype(np.float32)),
        lambda A, x: _where(lambda i, j: j <= i, A) @ x),
    "accumulate": (  # `+=`: the guarded sum adds to what is there
        """def f(float(R,C) X) -> (Z) {
    Z(i) = 1.0 where i in 0:R
    Z(i) += (j <= i) ? X(i, j) : 0.0 where i in 0:R, j in 0:C
}""", _rows, lambda X: 1 + _where(lambda i, j: j <= i, X).sum(1)),
    "after_a_max": (  # the second reduction of a row's block
        """def f(float(R,C) X) -> (s) {
    m(i) max=! X(i, j)
    s(i) +=! (j <= i) ? X(i, j) - m(i) : 0.0 where i in 0:R, j in 0:C
}""", _rows, lambda X: _where(lambda i, j: j <= i, X - X.max(1, keepdims=True)).sum(1)),
    "with_follower": (  # the elementwise consumer that joins the row's launch
        """def f(float(R,C) X) -> (Y) {
    s(i) +=! (j <= i) ? X(i, j) : 0.0 where i in 0:R, j in 0:C
    Y(i, j) = X(i, j) - s(i)
}""", _rows, lambda X: X - _where(lambda i, j: j <= i, X).sum(1, keepdims=True)),
    "contraction": (  # thread-mapped tiles, shared memory, register tiles
        "def f(float(R,C) A, float(C,C) B) -> (O) { O(m, n) +=! (k <= m) ? A(m, k) * B(k, n) "
        ": 0.0 where m in 0:R, k in 0:C, n in 0:C }",
        lambda r, c, rng: (*_rows(r, c, rng), *_rows(c, c, rng)),
        lambda A, B: _where(lambda i, j: j <= i, A) @ B),
}

# causal attention as one definition: scores, the masked softmax, the weighted sum; the
# mask is the guard of the sums alone (Ex is computed on the whole square)
CAUSAL = """def causal(float(T,D) Q, float(T,D) K, float(T,E) V) -> (O) {
    Sc(i, j) +=! Q(i, d) * K(j, d)
    Mx(i) max=! (j <= i) ? Sc(i, j) : -1.0e30 where i in 0:T, j in 0:T
    Ex(i, j) = exp(Sc(i, j) - Mx(i))
    Sm(i) +=! (j <= i) ? Ex(i, j) : 0.0 where i in 0:T, j in 0:T
    O(i, e) +=! (j <= i) ? Ex(i, j) * V(j, e) / Sm(i) : 0.0 where i in 0:T, j in 0:T, e in 0:E
}"""


def _causal(Q, K, V) -> np.ndarray:
    t = len(Q)
    scores = Q.astype(np.float64) @ K.T.astype(np.float64)
    scores = np.where(np.tril(np.ones((t, t), bool)), scores, -np.inf)
    e = np.exp(scores - scores.max(1, keepdims=True))
    return e / e.sum(1, keepdims=True) @ V.astype(np.float64)


def _inputs(name: str, rows: int, columns: int) -> tuple:
    rng = np.random.default_rng(rows * 1009 + columns + len(name))
    return PROGRAMS[name][1](rows, columns, rng)


def _check(got, expected, columns: int) -> None:
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5 * max(1, columns))


@emulated
@pytest.mark.parametrize("rows,columns", SHAPES)
@pytest.mark.parametrize("name", PROGRAMS)
def test_guarded_reductions_match_numpy(name, rows, columns):
    source, _, reference = PROGRAMS[name]
    args = _inputs(name, rows, columns)
    _check(tc.define(source, backend=CUDA).f(*args), reference(*args), columns)


@emulated
@pytest.mark.parametrize("name", ["lower", "padding", "sizes", "full"])
def test_shape_generic_guarded_reductions_match_numpy(name):
    """Compiled once for all sizes: the guard is a test on the size values too."""
    source, _, reference = PROGRAMS[name]
    kernel = tc.define(source, backend=CUDA, options=Options(specialize=False)).f
    for rows, columns in [(1, 1), (33, 33), (37, 40)]:
        args = _inputs(name, rows, columns)
        _check(kernel(*args), reference(*args), columns)


@emulated
@pytest.mark.parametrize("t", [1, 31, 32, 33, 37, 1025])
def test_causal_attention_matches_numpy(t):
    """Off by up to 2.5 from 32 rows on before: every row summed every key."""
    rng = np.random.default_rng(t)
    q, k, v = (rng.standard_normal((t, 4)).astype(np.float32) for _ in range(3))
    got = tc.define(CAUSAL, backend=CUDA).causal(q, k, v)
    np.testing.assert_allclose(got, _causal(q, k, v), rtol=1e-4, atol=1e-5)


@emulated
@pytest.mark.parametrize("guard,keep", [
    ("k >= 2 && k < C - 3", lambda k, c: (k >= 2) & (k < c - 3)),  # a bound on k: jammed
    ("k % 3 != 1", lambda k, c: k % 3 != 1),  # holes: a test inside the reduction loop
], ids=["bounds", "holes"])
def test_guarded_contractions_in_register_tiles(guard, keep):
    """32x128 tiles, 16 points a thread: the guard on k alone keeps the jammed reduction
    loop (its bounds are the same for every point) or leaves it for a plain one."""
    source = (f"def f(float(R,C) A, float(C,N) B) -> (O) {{ O(m, n) +=! ({guard}) ? "
              "A(m, k) * B(k, n) : 0.0 where m in 0:R, k in 0:C, n in 0:N }")
    rng = np.random.default_rng(7)
    a = rng.uniform(-1, 1, (32, 37)).astype(np.float32)
    b = rng.uniform(-1, 1, (37, 128)).astype(np.float32)
    kernel = tc.define(source, backend=CUDA, options=Options(tile=(32, 128, 32))).f
    if "%" not in guard:
        assert "16 points jammed into one reduction loop" in kernel.compile(a, b).source
    want = (a.astype(np.float64) * keep(np.arange(37), 37)) @ b.astype(np.float64)
    np.testing.assert_allclose(kernel(a, b), want, rtol=1e-4, atol=1e-4)


def _domain_instances(source: str, entry: str, sizes: dict[str, int], options: Options):
    """(the GPU kernel's loop IR, every instance of each statement its domain holds)."""
    collect: dict[str, str] = {}
    kernel = schedule_definition(check_source(source)[entry], sizes, options, GPU,
                                 collect=collect).kernel
    line = next(x for x in collect["scop"].splitlines() if x.startswith("domain: "))
    domain: dict[str, Counter] = {}

    def point(p: isl.Point) -> None:
        space = p.get_space()
        values = tuple(p.get_coordinate_val(isl.dim_type.set, k).to_python()
                       for k in range(space.dim(isl.dim_type.set)))
        domain.setdefault(space.get_tuple_name(isl.dim_type.set), Counter())[values] += 1

    isl.UnionSet(line[len("domain: "):]).foreach_point(point)
    return kernel, domain


@pytest.mark.parametrize("name", [*PROGRAMS, "causal"])
def test_the_mapping_runs_exactly_the_domain(name):
    """Whatever path each launch takes, the GPU kernel's loops (walked over every block
    and thread) run each statement at each point of its domain once, and nowhere else.
    A block reduction's identity (R<p>, which each thread sets in its own accumulator)
    stands for its init (I<p>) over the left side."""
    source, entry = (CAUSAL, "causal") if name == "causal" else (PROGRAMS[name][0], "f")
    for sizes in ({"R": 37, "C": 37}, {"R": 40, "C": 33}) if name != "causal" \
            else ({"T": 33, "D": 2, "E": 3},):
        kernel, domain = _domain_instances(source, entry, sizes, Options())
        ran = executed_instances(kernel)
        assert {sid for sid in ran if sid[0] in "IS"} <= set(domain), name
        for sid, points in domain.items():
            got = Counter(ran.get(sid, ()))
            if sid.startswith("I") and not got:
                got = Counter(set(ran.get("R" + sid[1:], ())))
            assert got == points, f"{name} {sizes}: {sid} ran {sorted(got - points)[:5]} " \
                                  f"outside its domain, missed {sorted(points - got)[:5]}"


def test_a_shape_generic_full_reduction_runs_exactly_the_domain():
    """Compiled for all sizes, the block's loops and the guard use the size values."""
    kernel, domain = _domain_instances(PROGRAMS["full"][0], "f", {"R": 35, "C": 34},
                                       Options())
    generic = schedule_definition(check_source(PROGRAMS["full"][0])["f"], None,
                                  Options(specialize=False), GPU).kernel
    ran = executed_instances(generic, sizes={"R": 35, "C": 34})
    assert Counter(ran["S0"]) == domain["S0"]


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
def test_guarded_cuda_compiles_with_nvcc():
    """Every program's CUDA (specialized; shape-generic too for a full reduction and a
    guard on the sizes), in one translation unit, compiled for sm_80 and sm_90 as
    tests/backends/test_cuda_codegen.py compiles the corpus."""
    programs = [(name, source, "f") for name, (source, _, _) in PROGRAMS.items()]
    parts = [PRELUDE]
    for name, source, entry in programs + [("causal", CAUSAL, "causal")]:
        sizes = {"T": 33, "D": 4, "E": 4} if entry == "causal" else {"R": 33, "C": 40}
        generic = name in ("full", "sizes")
        for options in (Options(), Options(specialize=False)) if generic else (Options(),):
            case = SimpleNamespace(source=source, entry=entry, shapes=(sizes,))
            text = _source(case, options)
            parts.append(text[len(PRELUDE):].replace("tclang_", f"tclang_g{len(parts)}_"))
    code, errors = _compile("\n".join(parts))
    assert code == 0, errors[-4000:]
