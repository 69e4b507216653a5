"""Every knob of tclang.Options has an effect you can see, and results do not change."""

from __future__ import annotations

import numpy as np

import tclang as tc
from polyhedral import loop_ir as L
from polyhedral.pipeline import schedule_definition
from tclang.lang.frontend import check_source
from tclang.target import Target

SCALE = "def f(float(N, M) X) -> (Y) { Y(i, j) = X(i, j) * 2.0 + 1.0 }"
MATMUL = "def mm(float(M,K) A, float(K,N) B) -> (C) { C(m, n) +=! A(m, k) * B(k, n) }"


def loops(kernel):
    return [n for n in L.walk_nodes(kernel.body) if isinstance(n, L.For)]


def test_parallel_false_marks_no_loop_parallel():
    defn = check_source(SCALE).definitions[0]
    cpu = Target("cpu", "threads", cores=4)
    assert any(f.parallel for f in loops(schedule_definition(defn, dict(N=64, M=64),
                                                             tc.Options(), cpu).kernel))
    off = schedule_definition(defn, dict(N=64, M=64), tc.Options(parallel=False), cpu).kernel
    assert not any(f.parallel for f in loops(off))


def test_parallel_true_threads_even_small_loops(monkeypatch, chunk_threads):
    monkeypatch.setenv("TCLANG_NUM_THREADS", "2")
    x = np.ones((8, 8), np.float32)
    tc.define(SCALE).f(x)
    assert not chunk_threads()  # too little work for threads
    np.testing.assert_array_equal(tc.define(SCALE, options=tc.Options(parallel=True)).f(x),
                                  x * 2 + 1)
    # handed to the pool (whether a helper wakes before the caller took all 8 rows varies)
    assert "pool" in chunk_threads()


def test_vectorize_false_and_vector_width():
    x = np.ones((16, 1024), np.float32)
    plain = tc.define(SCALE, options=tc.Options(vectorize=False)).f.compile(x)
    assert "x float>" not in plain.stages["llvm-opt"]
    wide = tc.define(SCALE, options=tc.Options(vector_width=4)).f.compile(x)
    assert "llvm.loop.vectorize.width" in wide.source and "<4 x float>" in wide.stages["llvm-opt"]


def test_unroll_hint_reaches_the_code():
    x = np.ones((16, 64), np.float32)
    k = tc.define(SCALE, options=tc.Options(unroll=4)).f.compile(x)
    assert "llvm.loop.unroll.count" in k.source and "unroll 4" in k.loops


def test_gpu_knobs_block_grid_shared_private():
    a, b = np.ones((64, 64), np.float32), np.ones((64, 64), np.float32)
    for options in (tc.Options(block=(16, 4), grid=(2, 2)), tc.Options(shared_memory=False),
                    tc.Options(private_memory=False)):
        k = tc.define(MATMUL, backend="cuda-emulated", options=options).mm.compile(a, b)
        np.testing.assert_array_equal(k(a, b), a @ b)
        if options.block:
            assert "block(16, 4)" in k.loops and "grid(2, 2)" in k.loops
        if options.shared_memory is False:
            assert "__shared__" not in k.loops
        if options.private_memory is False:
            assert "accumulates in a register" not in k.source
    default = tc.define(MATMUL, backend="cuda-emulated").mm.compile(a, b)
    assert "tile of the sum" in default.loops and "__shared__" in default.source
