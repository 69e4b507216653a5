"""GPU tuning on the emulated GPU (CI has no GPU): trials in spawned workers, one per
device, that outlive a trial; a crash or a hang costs one trial and a fresh worker; the
CUDA knobs in the space; tc.autotune, tc.compare and `tclang tune/compare --backend`
end to end, the tuned options checked against NumPy. The real GPU's path is in
tests/e2e/test_cuda_gpu.py (marked gpu)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

import tclang as tc
from tclang.cli import main
from tclang.tuning import trials, workers
from tclang.tuning.space import SearchSpace, describe
from tclang.tuning.trials import Task

MATMUL = "def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }"
CONV = """def conv2d(float(N, C, H, W) I, float(M, C, KH, KW) Wt) -> (O) {
    O(n, m, h, w) +=! I(n, c, h + kh, w + kw) * Wt(m, c, kh, kw)
}"""
EXAMPLE = str(Path(__file__).resolve().parents[2] / "examples" / "operators.tc")
FAST = {"min_time": 0.01, "progress": False, "seed": 0, "time_limit": 120}


def matmul_inputs(m=24, k=17, n=40):
    rng = np.random.default_rng(0)
    return rng.random((m, k), np.float32), rng.random((k, n), np.float32)


def conv_reference(x, w):
    n, c, h, wd = x.shape
    m, _, kh, kw = w.shape
    out = np.zeros((n, m, h - kh + 1, wd - kw + 1), np.float64)
    for i in range(kh):
        for j in range(kw):
            patch = x[:, :, i:i + h - kh + 1, j:j + wd - kw + 1].astype(np.float64)
            out += np.einsum("nchw,mc->nmhw", patch, w[:, :, i, j].astype(np.float64))
    return out


def test_autotune_on_the_emulated_gpu_runs_trials_in_a_spawned_worker(tmp_path):
    A, B = matmul_inputs()
    kernel = tc.define(MATMUL, "cuda-emulated").mm
    result = tc.autotune(kernel, A, B, budget=4, database=tmp_path / "t.sqlite", **FAST)
    assert result.stored and result.counts()["ok"] >= 4
    assert not result.counts()["crashed"] and not result.counts()["wrong"]
    assert result.best_seconds <= result.automatic_seconds
    pool = workers.pool("cuda-emulated", trials._measure)
    assert pool.size == 1 and pool.workers[0].alive  # kept for the next tuning
    assert pool.workers[0].process.pid != os.getpid()
    assert pool.workers[0].process._start_method == "spawn" or \
        type(pool.workers[0].process).__name__ == "SpawnProcess"
    tuned = tc.define(MATMUL, "cuda-emulated", result.best).mm(A, B)
    np.testing.assert_allclose(tuned, A @ B, rtol=1e-5, atol=1e-5)
    # stored for the backend: options="tuned" compiles them
    os.environ["TCLANG_TUNING_DB"] = str(tmp_path / "t.sqlite")
    try:
        again = tc.define(MATMUL, "cuda-emulated", options="tuned").mm.compile(A, B)
        assert again.options == result.best
    finally:
        del os.environ["TCLANG_TUNING_DB"]


def test_autotune_a_convolution_on_the_emulated_gpu_with_gpu_knobs(tmp_path):
    rng = np.random.default_rng(1)
    x = rng.random((2, 4, 8, 8), np.float32)
    w = rng.random((6, 4, 3, 3), np.float32)
    kernel = tc.define(CONV, "cuda-emulated").conv2d
    result = tc.autotune(kernel, x, w, budget=5, strategy="random",
                         database=tmp_path / "t.sqlite", **FAST)
    assert result.counts()["ok"] >= 5 and not result.counts()["wrong"]
    knobs = {k for t in result.trials for k, v in t.candidate if v is not None}
    # the CUDA knobs are in the space (5 random draws over fusion, tile, loop order,
    # unroll and these need not land on one), and the trials drew from nothing else
    from tclang.tuning.space import SearchSpace
    space = dict(SearchSpace.of(kernel.definition, dict(N=2, C=4, H=8, W=8, M=6, KH=3, KW=3),
                                "cuda-emulated").choices)
    assert {"block", "shared_memory", "private_memory"} <= set(space)
    assert knobs <= set(space)
    assert not knobs & {"parallel", "vector_width", "register_tile", "pack"}  # CPU ones not
    out = tc.define(CONV, "cuda-emulated", result.best).conv2d(x, w)
    np.testing.assert_allclose(out, conv_reference(x, w), rtol=1e-4, atol=1e-4)


def test_the_time_budget_stops_the_search(tmp_path):
    A, B = matmul_inputs()
    kernel = tc.define(MATMUL, "cuda-emulated").mm
    result = tc.autotune(kernel, A, B, budget=500, time_budget=0.5,
                         database=tmp_path / "t.sqlite", **FAST)
    assert 1 <= len(result.trials) < 500
    with pytest.raises(tc.TCError, match="time_budget"):
        tc.autotune(kernel, A, B, time_budget=0, **FAST)


def test_a_crashing_and_a_hanging_worker_cost_one_trial_each():
    """The worker dies (SIGSEGV) or hangs past the time limit: that trial is "crashed" or
    "timeout", the worker is replaced, and the next trial runs in a fresh one."""
    from tests.tuning import gpu_helpers
    A, B = matmul_inputs()
    reference = (A @ B,)
    task = Task(MATMUL, "mm", "cuda-emulated", (A, B), reference, time_limit=20,
                min_time=0.01)
    pool = workers.DevicePool("cuda-emulated", 1, measure=gpu_helpers.misbehave)
    try:
        first = pool.run(task, (("unroll", 8),))
        assert first.status == "ok", first.message
        pid = pool.workers[0].process.pid
        crashed = pool.run(task, (("unroll", 2),))
        assert crashed.status == "crashed" and "SIGSEGV" in crashed.message
        again = pool.run(task, (("unroll", 1),))
        assert again.status == "ok" and pool.workers[0].process.pid != pid
        hung = pool.run(Task(MATMUL, "mm", "cuda-emulated", (A, B), reference,
                             time_limit=3, min_time=0.01), (("unroll", 4),))
        assert hung.status == "timeout" and "killed" in hung.message
        assert not pool.workers[0].alive
        assert pool.run(task, (("unroll", 16),)).status == "ok"
    finally:
        pool.close()


def test_a_worker_holds_the_task_and_serves_many_trials():
    from tests.tuning import gpu_helpers
    A, B = matmul_inputs()
    task = Task(MATMUL, "mm", "cuda-emulated", (A, B), None)
    pool = workers.DevicePool("cuda-emulated", 1, measure=gpu_helpers.worker_pid)
    try:
        seen = {pool.run(task, (("unroll", u),)).message for u in (1, 2, 4)}
        assert len(seen) == 1  # one process for all three
        pid, spawned = seen.pop().split()
        assert int(pid) != os.getpid() and spawned == "True"
    finally:
        pool.close()


def test_a_worker_that_cannot_start_says_why_and_is_not_retried_forever(monkeypatch):
    pool = workers.DevicePool("cuda-emulated", 1, trials._measure)

    def dies(self):
        raise workers.WorkerFailed("the trial worker died while it started (exited with "
                                   "status 1); ... `if __name__ == \"__main__\":` ...")

    monkeypatch.setattr(workers.DeviceWorker, "start", dies)
    task = Task(MATMUL, "mm", "cuda-emulated", matmul_inputs(), None)
    statuses = [pool.run(task, (("unroll", 1),)) for _ in range(4)]
    assert all(t.status == "crashed" and "__main__" in t.message for t in statuses)
    assert pool.broken


def test_the_gpu_space_has_the_cuda_knobs_and_tiles_made_for_the_block():
    kernel = tc.define(MATMUL, "cuda-emulated").mm
    space = SearchSpace.of(kernel.definition, {"M": 4096, "K": 4096, "N": 4096}, "cuda")
    assert {"block", "shared_memory", "private_memory", "tile", "unroll"} <= set(space.knobs)
    assert not {"parallel", "vector_width", "register_tile", "pack"} & set(space.knobs)
    assert space.mapped() == [1, 0]  # n on x, m on y
    rng = np.random.default_rng(0)
    for _ in range(200):
        blocks = dict(space.choices)["block"][1:]
        block = blocks[int(rng.integers(len(blocks)))]
        tile = space.gpu_tiles(block, rng)
        px, py = tile[1] // block[0], tile[0] // block[1]
        assert tile[1] == block[0] * px and tile[0] == block[1] * py
        assert px * py <= 16 and tile[2] in (8, 16, 32, 64)
    lengths = set()
    for _ in range(100):
        point = space.random(rng)
        lengths.add(len(space.features(point)))
        # every point is a knob string that parses back to its options
        text = describe(point)
        assert text == "automatic" or tc.Options.parse(text) == SearchSpace.options(point)
    assert len(lengths) == 1


def test_compare_on_the_emulated_gpu():
    A, B = matmul_inputs(32, 16, 48)
    kernel = tc.define(MATMUL, "cuda-emulated").mm
    result = tc.compare(kernel, A, B, manual=["tile=16x64x16,block=16x4",
                                             "block=32x2,shared_memory=off"],
                        tune=2, rounds=2, progress=False, min_time=0.01,
                        peers=("numpy",))
    labels = [r.label for r in result.rows]
    assert labels[:3] == ["automatic", "manual: tile=16x64x16,block=16x4",
                          "manual: block=32x2,shared_memory=off"]
    assert labels[3].startswith("tuned (2 trials)") and labels[4] == "numpy"
    assert all(r.status == "ok" and len(r.samples) == 2 for r in result.rows), \
        [(r.label, r.status, r.message) for r in result.rows]
    assert result.limits is None  # the CPU's sgemm and triad are no roofline for a GPU
    assert "| automatic |" in result.table()


def test_tclang_tune_and_compare_take_backend_cuda_emulated(tmp_path, capsys):
    db = str(tmp_path / "t.sqlite")
    sizes = "M=16,K=8,N=24"
    code = main(["tune", EXAMPLE, "--entry", "matmul", "--sizes", sizes, "--backend",
                 "cuda-emulated", "--budget", "3", "--time-limit", "120", "--database", db,
                 "--time-budget", "300"])
    out = capsys.readouterr().out
    assert code == 0 and "tuned matmul" in out and "--backend cuda-emulated --tuned" in out
    code = main(["compare", EXAMPLE, "--entry", "matmul", "--sizes", sizes, "--backend",
                 "cuda-emulated", "--manual", "block=16x4,private_memory=off", "--tuned",
                 "--database", db, "--rounds", "1", "--peers", "numpy", "--out",
                 str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "manual: block=16x4,private_memory=off" in out and "tuned (stored)" in out


def test_trials_of_a_gpu_backend_never_fork(monkeypatch):
    """run_trial sends a GPU backend's trial to its worker (a forked child cannot use a
    CUDA context), whoever calls it: an executor, Dask, tc.compare."""
    def no_fork():
        raise AssertionError("a GPU trial forked")

    monkeypatch.setattr(trials.os, "fork", no_fork)
    A, B = matmul_inputs()
    task = Task(MATMUL, "mm", "cuda-emulated", (A, B), (A @ B,), min_time=0.01)
    assert trials.run_trial(task, (("unroll", 2),)).status == "ok"


def test_device_timing_batches_calls_between_cuda_events(monkeypatch):
    """time_on_device with a stand-in for pycuda.driver (CI has no GPU): a warm-up and a
    synchronize, then batches of as many calls as last a millisecond on the device's clock,
    each batch's time divided by its calls, until min_time has passed (3 batches at
    least)."""
    import sys
    import types

    clock = {"device": 0.0, "synced": 0}

    class Event:
        def record(self):
            self.at = clock["device"]

        def synchronize(self):
            pass

        def time_since(self, start):
            return (self.at - start.at) * 1e3  # milliseconds, as CUDA says

    class Context:
        @staticmethod
        def synchronize():
            clock["synced"] += 1

    driver = types.SimpleNamespace(Event=Event, Context=Context)
    monkeypatch.setitem(sys.modules, "pycuda", types.SimpleNamespace(driver=driver))
    monkeypatch.setitem(sys.modules, "pycuda.driver", driver)
    calls = []

    def launch():  # 50 µs of device time a call
        calls.append(1)
        clock["device"] += 50e-6

    times = workers.time_on_device(launch, min_time=0.01)
    assert clock["synced"] == 1 and len(times) >= 3
    assert all(abs(t - 50e-6) < 1e-9 for t in times)
    batch = (len(calls) - 2) / len(times)  # the warm-up and the one that sizes batches
    assert batch == 20  # 1 ms / 50 µs
    assert sum(times) * batch >= 0.01


def test_what_only_a_real_gpu_uses_stays_off_the_emulated_path():
    task = Task(MATMUL, "mm", "cuda-emulated", matmul_inputs(), None)
    assert workers.device_count("cuda-emulated") == 1
    assert workers.gpu_lock_name(task) is None
    assert workers.device_inputs(task) is task.inputs  # host arrays, as the CPU's
    assert workers.is_gpu("cuda") and workers.is_gpu("cuda-emulated")
    assert not workers.is_gpu("cpu")
