"""Scatters on CPU threads (polyhedral/scatter_loops.py, `parallel_nest`): a histogram,
scatter-add, -max and -min of many updates into a small target (at most 4096 elements)
run their loop in parallel, each chunk into a privatized copy merged once; a larger target
keeps the sequential nest. Against NumPy's `np.add.at` / `np.maximum.at` /
`np.minimum.at` with two threads, many collisions and none, odd, prime and size-1
extents; `reorder_reductions=False` keeps the sequential nest; out-of-range ids raise and
write nothing outside the target."""

from __future__ import annotations

import numpy as np
import pytest

import tclang as tc

SOURCE = """
def hist(int32(N) Ids, float(B) Like) -> (float(B) H) { H(Ids(i)) +=! 1.0 }
def add(int32(N) Idx, float(N) X, float(M) Like) -> (float(M) O) { O(Idx(i)) +=! X(i) }
def add_int(int32(N) Idx, int32(N) X, int32(M) Like) -> (int32(M) O) { O(Idx(i)) +=! X(i) }
def add_long(int32(N) Idx, int64(N) X, int64(M) Start) -> (int64(M) O) {
  O(m) = Start(m)
  O(Idx(i)) += X(i)
}
def smax(int32(N) Idx, float(N) X, float(M) Like) -> (float(M) O) { O(Idx(i)) max=! X(i) }
def dmax(int32(N) Idx, double(N) X, double(M) Like) -> (double(M) O) { O(Idx(i)) max=! X(i) }
def imin(int32(N) Idx, int32(N) X, int32(M) Like) -> (int32(M) O) { O(Idx(i)) min=! X(i) * 2 }
def embed_grad(int32(B, L) Ids, float(B, L, D) dO, float(E, D) Table) -> (float(E, D) G) {
  G(Ids(b, l), d) +=! dO(b, l, d)
}
"""

N = 40009  # prime, over the threshold of a parallel scatter (1 << 15 updates)
BINS = [1, 7, 997, 4096, 4099, 100003]  # on threads up to 4096 elements, sequential above


@pytest.fixture(autouse=True)
def two_threads(monkeypatch):
    monkeypatch.setenv("TCLANG_NUM_THREADS", "2")


@pytest.fixture(scope="module")
def module():
    """Specialized for every size set (a target extent known only at run time, as a
    kernel generic in it has, keeps the sequential nest: test_a_shape_generic_...)."""
    return tc.define(SOURCE, options=tc.Options(specialize=True))


def scatter_loop(compiled) -> str:
    """The loop IR's line of the outermost loop over the scatter's (S1's) first index."""
    return next(line for line in compiled.loops.splitlines() if "for (int s1_0 " in line)


def test_a_large_histogram_runs_its_scatter_loop_on_threads(module, chunk_threads):
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 1000, 10**6).astype(np.int32)
    compiled = module.hist.compile(ids, np.zeros(1000, np.float32))
    assert "parallel, reduction" in scatter_loop(compiled)
    expected = np.bincount(ids, minlength=1000).astype(np.float32)
    np.testing.assert_array_equal(compiled(ids, np.zeros(1000, np.float32)), expected)
    assert "pool" in chunk_threads()


@pytest.mark.parametrize("bins", BINS)
def test_sums_match_add_at(module, bins):
    rng = np.random.default_rng(bins)
    idx = rng.integers(0, bins, N).astype(np.int32)
    x = rng.standard_normal(N).astype(np.float32)
    compiled = module.add.compile(idx, x, np.zeros(bins, np.float32))
    assert ("parallel, reduction" in scatter_loop(compiled)) == (bins <= 4096)
    expected = np.zeros(bins)
    np.add.at(expected, idx, x.astype(np.float64))
    got = module.add(idx, x, np.zeros(bins, np.float32))
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-3)
    xi = rng.integers(-1000, 1000, N).astype(np.int32)
    expected = np.zeros(bins, np.int32)
    np.add.at(expected, idx, xi)
    np.testing.assert_array_equal(module.add_int(idx, xi, np.zeros(bins, np.int32)), expected)
    xl = rng.integers(-2**40, 2**40, N).astype(np.int64)
    start = rng.integers(-2**40, 2**40, bins).astype(np.int64)
    expected = start.copy()
    np.add.at(expected, idx, xl)
    np.testing.assert_array_equal(module.add_long(idx, xl, start), expected)


@pytest.mark.parametrize("bins", BINS)
def test_max_and_min_match_numpy(module, bins):
    rng = np.random.default_rng(bins + 1)
    idx = rng.integers(0, bins, N).astype(np.int32)
    x = rng.standard_normal(N).astype(np.float32)
    expected = np.full(bins, -np.inf, np.float32)
    np.maximum.at(expected, idx, x)
    np.testing.assert_array_equal(module.smax(idx, x, np.zeros(bins, np.float32)), expected)
    xd = rng.standard_normal(N)
    expected = np.full(bins, -np.inf)
    np.maximum.at(expected, idx, xd)
    np.testing.assert_array_equal(module.dmax(idx, xd, np.zeros(bins)), expected)
    xi = rng.integers(-10**6, 10**6, N).astype(np.int32)
    expected = np.full(bins, np.iinfo(np.int32).max, np.int32)
    np.minimum.at(expected, idx, xi * 2)
    np.testing.assert_array_equal(module.imin(idx, xi, np.zeros(bins, np.int32)), expected)


def test_no_collisions(module):
    """Every id once (a permutation): each element gets exactly its one update."""
    rng = np.random.default_rng(3)
    idx = rng.permutation(N).astype(np.int32)
    x = rng.standard_normal(N).astype(np.float32)
    expected = np.zeros(N, np.float32)
    expected[idx] = x
    np.testing.assert_array_equal(module.add(idx, x, np.zeros(N, np.float32)), expected)
    expected = np.full(N, -np.inf, np.float32)
    expected[idx] = x
    np.testing.assert_array_equal(module.smax(idx, x, np.zeros(N, np.float32)), expected)


def test_an_embedding_backward_into_a_small_table_runs_on_threads(module):
    """13 x 3 elements, 38481 updates: privatized copies; sums as np.add.at's."""
    rng = np.random.default_rng(11)
    ids = rng.integers(0, 13, (101, 127)).astype(np.int32)
    grad = rng.standard_normal((101, 127, 3)).astype(np.float32)
    compiled = module.embed_grad.compile(ids, grad, np.zeros((13, 3), np.float32))
    assert "parallel, reduction" in scatter_loop(compiled)
    expected = np.zeros((13, 3))
    np.add.at(expected, ids, grad.astype(np.float64))
    np.testing.assert_allclose(compiled(ids, grad, np.zeros((13, 3), np.float32)), expected,
                               rtol=1e-4, atol=1e-3)


def test_an_embedding_backward_into_a_large_table_stays_sequential(module):
    """5003 x 131 elements: too large to privatize; the nest in index order, so the sums
    are np.add.at's (sequential, in that order) bit for bit."""
    rng = np.random.default_rng(131)
    ids = rng.integers(0, 5003, (31, 29)).astype(np.int32)
    grad = rng.standard_normal((31, 29, 131)).astype(np.float32)
    compiled = module.embed_grad.compile(ids, grad, np.zeros((5003, 131), np.float32))
    assert "parallel" not in scatter_loop(compiled)
    expected = np.zeros((5003, 131), np.float32)
    np.add.at(expected, ids, grad)
    np.testing.assert_array_equal(compiled(ids, grad, np.zeros((5003, 131), np.float32)),
                                  expected)


def test_without_reordering_the_scatter_stays_sequential_and_deterministic():
    m = tc.define(SOURCE, options=tc.Options(reorder_reductions=False))
    rng = np.random.default_rng(5)
    idx = rng.integers(0, 7, N).astype(np.int32)
    x = (rng.standard_normal(N) * 1e4).astype(np.float32)
    compiled = m.add.compile(idx, x, np.zeros(7, np.float32))
    assert "parallel" not in scatter_loop(compiled)
    expected = np.zeros(7, np.float32)
    np.add.at(expected, idx, x)  # sequential, in index order: what the loops do
    for _ in range(3):
        np.testing.assert_array_equal(compiled(idx, x, np.zeros(7, np.float32)), expected)
    ids = rng.integers(0, 3, (64, 100)).astype(np.int32)
    grad = rng.standard_normal((64, 100, 31)).astype(np.float32)
    compiled = m.embed_grad.compile(ids, grad, np.zeros((3, 31), np.float32))
    assert "parallel" not in scatter_loop(compiled)


def test_a_small_scatter_keeps_the_sequential_nest(module):
    """Below the threshold (at known sizes) the loop IR is the sequential one."""
    idx = np.arange(100, dtype=np.int32) % 7
    compiled = module.add.compile(idx, np.ones(100, np.float32), np.zeros(7, np.float32))
    assert "parallel" not in scatter_loop(compiled)


@pytest.mark.parametrize("bins", [997, 4096])
@pytest.mark.parametrize("bad", [-1, 1])
def test_an_id_out_of_range_raises_and_writes_nothing_outside(module, bins, bad):
    ids = np.random.default_rng(bins).integers(0, bins, 10**5).astype(np.int32)
    ids[len(ids) // 2] = bad * bins if bad > 0 else bad
    room = np.full(bins + 2, 7.0, np.float32)  # the target and one sentinel on each side
    with pytest.raises(tc.TCIndexError, match=r"H\(Ids\(i\)\) \+=! 1\.0"):
        module.hist(ids, np.zeros(bins, np.float32), out=room[1:-1])
    assert room[0] == 7.0 and room[-1] == 7.0


def test_a_shape_generic_scatter_stays_sequential():
    """Sizes known only at run time: the target's size is unknown, the nest sequential."""
    m = tc.define(SOURCE, options=tc.Options(specialize=False))
    rng = np.random.default_rng(9)
    for n, rows in ((3, 2), (17, 1), (N, 997)):
        ids = rng.integers(0, rows, n).astype(np.int32)
        expected = np.bincount(ids, minlength=rows).astype(np.float32)
        np.testing.assert_array_equal(m.hist(ids, np.zeros(rows, np.float32)), expected)
    assert "parallel" not in scatter_loop(m.hist.compile(ids, np.zeros(rows, np.float32)))


def test_a_kernel_generic_in_the_number_of_updates_runs_on_threads():
    """A second number of ids makes the kernel generic in N (Options(specialize="auto")):
    the target's 1000 elements are still known, the loop still parallel."""
    m = tc.define(SOURCE)
    rng = np.random.default_rng(13)
    for n in (N, 65537, 3):
        ids = rng.integers(0, 1000, n).astype(np.int32)
        expected = np.bincount(ids, minlength=1000).astype(np.float32)
        np.testing.assert_array_equal(m.hist(ids, np.zeros(1000, np.float32)), expected)
    compiled = m.hist.compile(ids, np.zeros(1000, np.float32))
    assert "generic in N" in repr(compiled)
    assert "parallel, reduction" in scatter_loop(compiled)
