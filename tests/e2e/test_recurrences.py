"""Issue 35 item 2: recurrences (scans). A statement reads its own target at points it
wrote earlier in the lexicographic order of its left-side indices: prefix sums, running
maxima, per-row scans, a forward substitution, an RNN-style cell, sums reading the points
before the one they reduce into; on every backend against
NumPy at size-1, odd and prime extents. The scheduler keeps the carrying loop sequential and
the others parallel; a read at a later point, or at one nothing wrote, is a located error."""

from __future__ import annotations

import numpy as np
import pytest

import tclang as tc
from polyhedral import loop_ir as L
from tclang.errors import TCSemanticError

BACKENDS = ["cpu", "reference", "cuda-emulated"]
EXTENTS = [1, 2, 5, 7, 13]
EMULATED = [1, 2, 7]  # g++ builds each specialized kernel: fewer shapes keep this fast

SOURCE = """
def cumsum(float(N) X) -> (O) { O(i) = (i == 0) ? X(0) : O(i - 1) + X(i) }
def runmax(float(N) X) -> (O) { O(i) = (i == 0) ? X(0) : fmax(O(i - 1), X(i)) }
def rowscan(float(R, N) X) -> (O) { O(r, i) = (i == 0) ? X(r, 0) : O(r, i - 1) + X(r, i) }
def colscan(float(N, R) X) -> (O) { O(i, r) = (i == 0) ? X(0, r) : O(i - 1, r) + X(i, r) }
def fib(float(N) X) -> (O) { O(i) = (i < 2) ? X(i) : O(i - 1) + 0.5 * O(i - 2) where i in 0:N }
def after(float(N) X) -> (O) {
    O(i) = X(i)
    O(i) = O(i - 1) * 0.5 + X(i) where i in 1:N
}
def icount(int32(N) X) -> (O) { O(i) = (i == 0) ? X(0) : O(i - 1) + X(i) }
def trsv(float(N, N) L, float(N) b) -> (x) {
    P(i, j) = (j == 0) ? b(i) : P(i, j - 1) - L(i, j - 1) * P(j - 1, j - 1) / L(j - 1, j - 1)
        where j in 0:i + 1
    x(i) = P(i, i) / L(i, i)
}
def fsum(float(N, N) L, float(N) b) -> (x) {
    x(i) +=! (k == i) ? b(i) / L(i, i) : -L(i, k) / L(i, i) * x(k) where k in 0:i + 1
}
def fsplit(float(N, N) L, float(N) b) -> (x) {
    x(i) = b(i) / L(i, i)
    x(i) += -L(i, k) / L(i, i) * x(k) where k in 0:i
}
def rowsum(float(R, N) X, float(N, N) W) -> (O) {
    O(r, i) +=! (k == i) ? X(r, i) : 0.5 * W(i, k) * tanh(O(r, k)) where k in 0:i + 1
}
def upd(float(N) X) -> (O) {
    O(i) = X(i)
    O(i) += (i >= 1) ? O(i - 1) : 0.0
}
def rowmax(float(R, N) X) -> (O) {
    O(r, i) max=! (k == i) ? X(r, i) : 0.5 * O(r, k) where i in 0:N, k in 0:i + 1
}
def heap(float(R, N) X) -> (O) {
    O(r, i) = (i >= 1) ? 0.5 * O(r, (i - 1) / 2) + X(r, i) : X(r, i)
}
def prodrec(float(N) X) -> (O) {
    O(i) *=! (k == i) ? X(i) : 1.0 + 0.25 * tanh(O(k)) where i in 0:N, k in 0:i + 1
}
def halve(float(N) X) -> (O) { O(i) = (i >= 4) ? fmax(O(i / 2), O(i % 4)) + X(i) : X(i) }
def rnn(float(T, H) X, float(H, H) W) -> (S) {
    S(t, h) = (t == 0) ? tanh(X(0, h))
        : tanh(X(t, h) + S(t - 1, 0) * W(h, 0) + S(t - 1, H - 1) * W(h, H - 1))
}
"""


def _numpy_fib(x):
    o = x.astype(np.float64).copy()
    for i in range(2, len(x)):
        o[i] = o[i - 1] + 0.5 * o[i - 2]
    return o


def _numpy_after(x):
    o = x.astype(np.float64).copy()
    for i in range(1, len(x)):
        o[i] = o[i - 1] * 0.5 + x[i]
    return o


def _numpy_rnn(x, w):
    s = np.zeros_like(x, dtype=np.float64)
    s[0] = np.tanh(x[0])
    for t in range(1, len(x)):
        s[t] = np.tanh(x[t] + s[t - 1, 0] * w[:, 0] + s[t - 1, -1] * w[:, -1])
    return s


@pytest.fixture(scope="module", params=BACKENDS)
def backend_module(request):
    return request.param, tc.define(SOURCE, backend=request.param)


@pytest.fixture
def module(backend_module, n):
    backend, defined = backend_module
    if backend == "cuda-emulated" and n not in EMULATED:
        pytest.skip("the emulated GPU runs the size-1, even and odd-prime extents")
    return defined


def _close(actual, expected):
    np.testing.assert_allclose(actual, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("n", EXTENTS)
def test_one_dimensional_scans(module, n):
    x = np.random.default_rng(n).standard_normal(n).astype(np.float32)
    _close(module.cumsum(x), np.cumsum(x))
    np.testing.assert_array_equal(module.runmax(x), np.maximum.accumulate(x))
    _close(module.fib(x), _numpy_fib(x))
    _close(module.after(x), _numpy_after(x))
    ints = np.arange(n, dtype=np.int32) - 3
    counted = module.icount(ints)
    assert counted.dtype == np.int32
    np.testing.assert_array_equal(counted, np.cumsum(ints))


@pytest.mark.parametrize("n", EXTENTS)
def test_scans_along_rows_and_columns(module, n):
    x = np.random.default_rng(n + 1).standard_normal((3, n)).astype(np.float32)
    _close(module.rowscan(x), np.cumsum(x, 1))
    _close(module.colscan(np.ascontiguousarray(x.T)), np.cumsum(x.T, 0))


@pytest.mark.parametrize("n", EXTENTS)
def test_forward_substitution_and_rnn(module, n):
    rng = np.random.default_rng(n + 2)
    lower = (np.tril(rng.standard_normal((n, n))) + 4 * np.eye(n)).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    np.testing.assert_allclose(module.trsv(lower, b), np.linalg.solve(lower, b), rtol=1e-3,
                               atol=1e-4)
    x = rng.standard_normal((n, 3)).astype(np.float32)
    w = (0.5 * rng.standard_normal((3, 3))).astype(np.float32)
    _close(module.rnn(x, w), _numpy_rnn(x, w))


def _numpy_rowsum(x, w):
    o = np.zeros(x.shape, np.float64)
    for i in range(x.shape[1]):
        o[:, i] = x[:, i] + (0.5 * w[i, :i] * np.tanh(o[:, :i])).sum(1)
    return o


def _numpy_rowmax(x):
    o = np.zeros(x.shape, np.float64)
    for i in range(x.shape[1]):
        o[:, i] = np.max(np.concatenate([x[:, i:i + 1], 0.5 * o[:, :i]], 1), 1)
    return o


@pytest.mark.parametrize("n", EXTENTS)
def test_sums_that_read_earlier_points_of_their_target(module, n):
    """A reduction may read earlier points of what it reduces into (each is finished before
    the next starts): the forward substitution as one sum or as an update, per-row sums
    and maxima, on every backend, against NumPy."""
    rng = np.random.default_rng(n + 3)
    lower = (np.tril(rng.standard_normal((n, n))) + 4 * np.eye(n)).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    solved = np.linalg.solve(lower.astype(np.float64), b)
    np.testing.assert_allclose(module.fsum(lower, b), solved, rtol=1e-3, atol=1e-4)
    np.testing.assert_allclose(module.fsplit(lower, b), solved, rtol=1e-3, atol=1e-4)
    x = rng.standard_normal((3, n)).astype(np.float32)
    w = rng.uniform(-1, 1, (n, n)).astype(np.float32)
    _close(module.rowsum(x, w), _numpy_rowsum(x, w))
    _close(module.rowmax(x), _numpy_rowmax(x))
    _close(module.upd(b), np.cumsum(b))  # `+=` over no index: each point's sum is final


def _numpy_heap(x):
    o = x.astype(np.float64).copy()
    for i in range(1, x.shape[1]):
        o[:, i] = 0.5 * o[:, (i - 1) // 2] + x[:, i]
    return o


def _numpy_halve(x):
    o = x.astype(np.float64).copy()
    for i in range(4, len(x)):
        o[i] = max(o[i // 2], o[i % 4]) + x[i]
    return o


def _numpy_prodrec(x):
    o = x.astype(np.float64).copy()
    for i in range(len(x)):
        o[i] = x[i] * np.prod(1 + 0.25 * np.tanh(o[:i]))
    return o


@pytest.mark.parametrize("n", EXTENTS)
def test_a_product_reading_earlier_points_of_its_target(module, n):
    x = np.random.default_rng(n + 5).uniform(0.5, 1.5, n).astype(np.float32)
    _close(module.prodrec(x), _numpy_prodrec(x))


@pytest.mark.parametrize("n", EXTENTS)
def test_reads_through_a_quotient_or_remainder(module, n):
    """A tree laid out in an array: each point reads its parent O((i - 1) / 2), or O(i / 2)
    and O(i % 4), points written earlier (isl checks it with the division's existential)."""
    x = np.random.default_rng(n + 4).standard_normal((3, n)).astype(np.float32)
    _close(module.heap(x), _numpy_heap(x))
    _close(module.halve(x[0]), _numpy_halve(x[0]))


@pytest.mark.parametrize("options", [tc.Options(fusion="max"), tc.Options(vectorize=False),
                                     tc.Options(reorder_reductions=False),
                                     tc.Options(specialize=False)], ids=str)
def test_a_sum_reading_earlier_points_under_every_schedule(options):
    """Where the reduction's own iterations are free to reorder, every update of a point
    must still come before the points that read it (the fence of dependences.py). Without
    it the loops around the update were marked parallel: threads read points whose sums
    were not done (at 257, wrong by 0.02 under `fusion="min"` in one run, `vectorize=False`
    in another)."""
    n = 257
    rng = np.random.default_rng(5)
    lower = (np.tril(rng.standard_normal((n, n))) * 0.1 + 4 * np.eye(n)).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    module = tc.define(SOURCE, options=options)
    solved = np.linalg.solve(lower.astype(np.float64), b)
    for name in ("fsum", "fsplit"):
        kernel = getattr(module, name)
        np.testing.assert_allclose(kernel(lower, b), solved, rtol=1e-4, atol=1e-5)
        ir = kernel.compile(lower, b).loop_ir
        updates = {s.id for s in ir.statements if s.kind == "reduce"}
        assert not any(loop.parallel for loop in _loops_around(ir.body, updates))


def _loops_around(node, statements, loops=()):
    """The loops around every run of the given statements."""
    if isinstance(node, L.For):
        return _loops_around(node.body, statements, loops + (node,))
    if isinstance(node, L.Run):
        return list(loops) if node.statement in statements else []
    found = []
    for child in (getattr(node, "body", None), getattr(node, "then", None),
                  getattr(node, "other", None)):
        for c in (child if isinstance(child, tuple) else (child,) if child else ()):
            found += _loops_around(c, statements, loops)
    return found


@pytest.mark.parametrize("specialize", [True, False])
def test_shape_generic_and_specialized_agree(specialize):
    fn = tc.define(SOURCE, options=tc.Options(specialize=specialize)).rowscan
    for shape in [(1, 1), (4, 9), (2, 1000)]:
        x = np.random.default_rng(shape[1]).standard_normal(shape).astype(np.float32)
        _close(fn(x), np.cumsum(x, 1))


def _loops(kernel):
    return [n for n in L.walk_nodes(kernel.body) if isinstance(n, L.For)]


def _loop_of(kernel, index_of_statement: int):
    """The loops whose variable the statement's given left-side index reads."""
    found = []
    for loop in _loops(kernel):
        for run in L.walk_nodes(loop.body):
            if isinstance(run, L.Run) and loop.var in _vars(run.indices[index_of_statement]):
                found.append(loop)
                break
    return found


def _vars(expr) -> set[str]:
    if isinstance(expr, L.Var):
        return {expr.name}
    return set().union(*(_vars(a) for a in getattr(expr, "args", ()))) if \
        hasattr(expr, "args") else set()


def test_rows_parallel_and_the_scan_loop_sequential():
    """Per-row scans run rows in parallel; the loops of the scanned index stay sequential."""
    compiled = tc.define(SOURCE).rowscan.compile(np.zeros((64, 101), np.float32))
    assert "coincident: [ 1, 0 ]" in compiled.schedule  # isl: r parallel, i carries
    kernel = compiled.loop_ir
    assert any(loop.parallel for loop in _loop_of(kernel, 0))
    assert _loop_of(kernel, 1) and not any(loop.parallel or loop.vectorize
                                           for loop in _loop_of(kernel, 1))


def test_column_scans_vectorize_across_columns():
    """A scan down the columns: the row loop sequential, the stride-1 column loop parallel
    and vectorized (and its tiles spread over threads)."""
    kernel = tc.define(SOURCE).colscan.compile(np.zeros((101, 256), np.float32)).loop_ir
    assert not any(loop.parallel for loop in _loop_of(kernel, 0))
    columns = _loop_of(kernel, 1)
    assert any(loop.vectorize for loop in columns) and any(loop.parallel for loop in columns)


ERRORS = [
    ("def f(float(N) X) -> (O) {\n  O(i) = O(i - 1) + X(i)\n}", 2, 10,
     "no statement writes (at i = 0)"),
    ("def f(float(N, N) L) -> (P) {\n  P(i, j) = (i == 0 || j == 0) ? L(i, j)\n"
     "    : P(j, j - 1) + L(i, j) where j in 0:N\n}", 3, 7,
     "at the same time or later (at "),
    ("def f(float(N) X) -> (O) {\n  O(i) = (i < 1) ? X(i) : O(i - 1) + O(i - 2) "
     "where i in 0:N\n}", 2, 38, "no statement writes (at i = 1)"),
    ("def f(float(N) X) -> (O) {\n  O(i) = X(i)\n  O(i) = O(N - 1 - i)\n}", 3, 10,
     "at the same time or later (at i = "),
    ("def f(float(N) X) -> (O) {\n  O(i) +=! X(i) * O(k) where k in 0:i + 1\n}", 2, 19,
     "at the same time or later (at i = 0, k = 0)"),
]
LANGUAGE_ERRORS = [  # found by the front end, before any isl
    ("def f(float(N) X, int32(N) I) -> (O) {\n  O(i) +=! X(k) * O(I(k)) where k in 0:i\n}",
     2, 19, "data-dependent point"),
    ("def f(float(N) X) -> (O) {\n  O(i) = X(i)\n  O(i) +=! X(k) * O(i) where k in 0:N\n}",
     3, 19, "reduces into O and also reads it"),
    ("def f(float(N) X) -> (O) {\n  O(i) = X(i)\n  O(i) += O(i + 1) * X(k) where k in 0:N\n}",
     3, 11, "only earlier points"),
]


@pytest.mark.parametrize("source,line,column,words", LANGUAGE_ERRORS)
def test_sums_reading_their_target_wrongly_are_refused(source, line, column, words):
    """A reduction may read earlier points of its target, not a data-dependent one, not
    the point it reduces into, not a later one: located at the read, with a hint."""
    with pytest.raises(TCSemanticError) as info:
        tc.define(source)
    err = info.value
    assert (err.line, err.column) == (line, column), str(err)
    assert words in err.message and err.hint


@pytest.mark.parametrize("source,line,column,words", ERRORS)
def test_refused_recurrences_point_at_the_read(source, line, column, words):
    """Refusals found only on the scop (isl): located at the read, with what to write."""
    with pytest.raises(TCSemanticError) as info:
        tc.define(source).f(np.ones(5, np.float32) if "N, N" not in source
                            else np.ones((5, 5), np.float32))
    err = info.value
    assert (err.line, err.column) == (line, column), str(err)
    assert words in err.message and err.hint and "^" in str(err)
