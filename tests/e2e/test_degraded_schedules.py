"""A schedule degraded by circumstance is never kept as the full one (issue 31 item 8).

When isl's scheduler runs past its time limit (a load spike) or its process is killed,
the compile falls back to "min" or program order. Before, that fallback was stored in the
disk cache (and a call record) under the normal key, and the time-out was remembered for
the process's life: every later process, and the rest of this one, ran the degraded
kernel. Now it stays in memory until `scheduler.RETRY_AFTER`, and the next process
schedules it again.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import numpy as np
import pytest

import tclang as tc
from polyhedral import scheduler
from tclang.driver import diskcache

ROOT = Path(__file__).resolve().parents[2]
MLP = ("def mlp(float(B,I) X, float(O,I) W, float(O) b) -> (Y) {\n"
       "  Y(i,o) +=! X(i,k) * W(o,k)\n  Y(i,o) = fmax(Y(i,o) + b(o), 0)\n}")

COMPILE = """
    import json, sys, time
    import numpy as np
    import tclang as tc
    from polyhedral import scheduler
    from tclang.driver import diskcache

    stored, real_store = [], diskcache.store

    def logged(digest, key, blobs, warn=True):  # what goes to disk, by kind
        stored.append(key[0] if isinstance(key[0], str) else "kernel")
        return real_store(digest, key, blobs, warn)

    diskcache.store = logged
    if sys.argv[1] == "stalled":
        real_options = scheduler._set_options

        def stalling(ctx, fusion):  # isl, on a machine under a load spike
            if fusion == "preserve_parallel":
                time.sleep(60)
            real_options(ctx, fusion)

        scheduler._set_options = stalling
        scheduler.TIME_LIMIT = 0.5
    rng = np.random.default_rng(0)
    X, W, b = (rng.random(s, np.float32) - 0.5 for s in ((3, 5), (4, 5), (4,)))
    kernel = tc.define({mlp!r}).mlp
    right = all(np.allclose(kernel(X, W, b), np.maximum(X @ W.T + b, 0), rtol=1e-5)
                for _ in range(3))
    compiled = kernel.compile(X, W, b)
    print(json.dumps(dict(right=bool(right), cache=compiled.cache, strategy=compiled.strategy,
                          fallback=compiled.fallback, loops=compiled.loops, stored=stored,
                          degraded=getattr(compiled, "degraded", None))))
"""


def run_compile(cache: Path, how: str) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT), TCLANG_CACHE_DIR=str(cache))
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(COMPILE.format(mlp=MLP)),
                           how], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def test_a_timed_out_schedule_is_not_stored_and_the_next_process_schedules_in_full(tmp_path):
    """Before: the first process stored its "min" kernel (and a call record) under the
    normal key, and the second ran it from the disk cache."""
    degraded = run_compile(tmp_path, "stalled")
    assert degraded["right"] and degraded["strategy"] == "min"
    assert "preserve_parallel: the scheduler ran past" in degraded["fallback"]
    assert "kernel" not in degraded["stored"] and "call-record" not in degraded["stored"]
    assert degraded["degraded"] is True
    full = run_compile(tmp_path, "normal")  # a fresh process, the normal time limit
    assert full["right"] and full["cache"] == "compiled"
    assert full["strategy"].startswith("preserve_parallel") and full["fallback"] is None
    assert full["degraded"] is False and full["loops"] != degraded["loops"]
    assert "kernel" in full["stored"] and "call-record" in full["stored"]


@pytest.fixture
def fresh_scheduler():
    """A scheduling process forked after the test's patches, and none of their answers
    (nor the process) left for the next test; the same for the middle end's process
    (tclang/driver/middle_end.py), which compiles with the code it was forked with."""
    from tclang.driver import middle_end

    def reset():
        middle_end.stop()
        if scheduler._scheduler.pid is not None:
            scheduler._scheduler._stop()
        scheduler._answers.clear()
    reset()
    yield reset
    reset()


def test_a_degraded_kernel_is_compiled_again_once_its_retry_comes(monkeypatch,
                                                                   fresh_scheduler):
    """In one process: the kernel on the "min" fallback runs (right) until RETRY_AFTER,
    with no disk entry nor call record; then the next call schedules it in full. Before:
    "min" for the life of the process (the time-out was kept as isl's answer)."""
    real_options, stored = scheduler._set_options, []
    real_store = diskcache.store

    def stalling(ctx, fusion):
        if fusion == "preserve_parallel":
            time.sleep(60)
        real_options(ctx, fusion)

    monkeypatch.setattr(scheduler, "_set_options", stalling)
    monkeypatch.setattr(scheduler, "TIME_LIMIT", 0.3)
    monkeypatch.setattr(scheduler, "RETRY_AFTER", 1.0, raising=False)
    monkeypatch.setattr(diskcache, "store", lambda digest, key, blobs, warn=True: (
        stored.append(key[0] if isinstance(key[0], str) else "kernel"),
        real_store(digest, key, blobs, warn)))
    rng = np.random.default_rng(1)
    X, W, b = (rng.random(s, np.float32) - 0.5 for s in ((3, 5), (4, 5), (4,)))
    expected = np.maximum(X @ W.T + b, 0)
    name = f"mlp_{uuid.uuid4().hex[:8]}"  # compiled here, by no earlier test
    kernel = tc.define(MLP.replace("mlp", name))[name]
    np.testing.assert_allclose(kernel(X, W, b), expected, rtol=1e-5)
    first = kernel.compile(X, W, b)
    assert first.strategy == "min" and "the scheduler ran past" in first.fallback
    monkeypatch.setattr(scheduler, "_set_options", real_options)  # the spike is over
    monkeypatch.setattr(scheduler, "TIME_LIMIT", 30.0)  # a limit a loaded machine meets
    fresh_scheduler()  # its processes have the stall: the next ones will not
    for _ in range(3):  # before the retry: the same kernel, from memory
        np.testing.assert_allclose(kernel(X, W, b), expected, rtol=1e-5)
        assert kernel.compile(X, W, b) is first
    assert "kernel" not in stored and "call-record" not in stored
    time.sleep(1.1)
    np.testing.assert_allclose(kernel(X, W, b), expected, rtol=1e-5)
    again = kernel.compile(X, W, b)
    assert again.strategy.startswith("preserve_parallel") and again.fallback is None
    assert not again.degraded and "kernel" in stored and "call-record" in stored
    np.testing.assert_allclose(kernel(X, W, b), expected, rtol=1e-5)  # the fast path


def _kills_first_requests(deaths, real):
    def handler(request):
        with deaths.get_lock():
            die = deaths.value > 0
            deaths.value -= die
        if die:
            os.kill(os.getpid(), 9)
        return real(request)
    return handler


@pytest.mark.parametrize("deaths, strategy", [(1, "preserve_parallel"), (2, "min")])
def test_a_killed_scheduling_process(monkeypatch, fresh_scheduler, deaths, strategy):
    """Killed once (the OOM killer), a fresh process answers in full; killed twice, the
    "min" fallback is degraded (retried later), not final."""
    from polyhedral.pipeline import schedule_definition
    from tclang.lang.frontend import check_source
    from tclang.target import Target
    count = multiprocessing.Value("i", deaths)
    monkeypatch.setattr(scheduler._scheduler, "handler",
                        _kills_first_requests(count, scheduler._scheduler.handler))
    defn = check_source(MLP).definitions[0]
    cpu = Target("cpu", "threads", cores=4, vector_bytes=32)
    result = schedule_definition(defn, dict(B=3, I=5, O=4), tc.Options(), cpu)
    assert result.strategy.startswith(strategy) and count.value == 0
    assert (result.retry_at is not None) == (strategy == "min")
    if strategy == "min":
        assert "killed by SIGKILL, signal 9" in result.fallback


@pytest.mark.parametrize("target", ["cpu", "cuda"])
def test_export_refuses_a_degraded_schedule_and_exports_the_fallback_asked_for(
        monkeypatch, fresh_scheduler, tmp_path, target):
    """Before: `export` wrote the "min" fallback of a load spike into the library, for
    good and without a word. Now a TCCompileError that says the scheduler gave no full
    schedule, and nothing written; asked for on purpose (fusion="min") it exports.
    (target "cuda" is refused before nvcc, so it needs no CUDA toolkit.)"""
    real_options = scheduler._set_options

    def stalling(ctx, fusion):
        if fusion == "preserve_parallel":
            time.sleep(60)
        real_options(ctx, fusion)

    monkeypatch.setenv("TCLANG_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(scheduler, "_set_options", stalling)
    monkeypatch.setattr(scheduler, "TIME_LIMIT", 0.3)
    fresh_scheduler()  # a scheduling process forked with the stall
    name = f"mlp_{uuid.uuid4().hex[:8]}"
    source = MLP.replace("mlp", name)
    folder = tmp_path / "lib"
    with pytest.raises(tc.TCCompileError, match=r"not exported: the scheduler gave no full "
                       r"schedule this time \(preserve_parallel: the scheduler ran past"):
        tc.define(source)[name].export(folder, dict(B=3, I=5, O=4), target=target)
    assert not folder.exists() or not any(folder.iterdir())
    if target == "cpu":
        lib = tc.define(source, options=tc.Options(fusion="min"))[name].export(
            folder, dict(B=3, I=5, O=4))
        assert lib.library.exists()
