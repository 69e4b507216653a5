"""Tuning trials and a schedule degraded by circumstance; trial processes across fork.

A trial's compile can get the scheduler's fallback ("min", or program order) when isl's
time limit runs out on a loaded machine (trials compile two at a time, beside other
work) or its process is killed. That kernel is not the candidate's schedule: before, the
trial timed it as the candidate's and the tuner could store it as the best options. And
`trials._running`, the tuner's trial processes, was inherited by a forked child, whose
`kill_running()` then SIGKILLed the parent's trials.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid

import numpy as np
import pytest

from polyhedral import scheduler
from tclang.tuning import trials
from tclang.tuning.space import SearchSpace

MLP = ("def mlp(float(B,I) X, float(O,I) W, float(O) b) -> (Y) {\n"
       "  Y(i,o) +=! X(i,k) * W(o,k)\n  Y(i,o) = fmax(Y(i,o) + b(o), 0)\n}")


@pytest.fixture
def stalled_scheduler(monkeypatch, tmp_path):
    """isl's scheduler as on a machine under a load spike: "preserve_parallel" runs past
    a short time limit, so compiles fall back to "min" (degraded). A fresh scheduling
    process and no kept answers, before and after."""
    def reset():
        if scheduler._scheduler.pid is not None:
            scheduler._scheduler._stop()
        scheduler._answers.clear()
    real_options = scheduler._set_options

    def stalling(ctx, fusion):
        if fusion == "preserve_parallel":
            time.sleep(60)
        real_options(ctx, fusion)

    monkeypatch.setenv("TCLANG_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(scheduler, "_set_options", stalling)
    monkeypatch.setattr(scheduler, "TIME_LIMIT", 0.3)
    reset()
    yield
    reset()


def test_a_trial_compiled_on_a_degraded_schedule_is_marked_and_never_timed(
        stalled_scheduler):
    """Before: status "ok" with the fallback's time, a candidate for the best."""
    name = f"mlp_{uuid.uuid4().hex[:8]}"  # in no cache of this process or on disk
    source = MLP.replace("mlp", name)
    rng = np.random.default_rng(0)
    inputs = tuple(rng.random(s, np.float32) - 0.5 for s in ((3, 5), (4, 5), (4,)))
    reference = (np.maximum(inputs[0] @ inputs[1].T + inputs[2], 0),)
    task = trials.Task(source, name, "cpu", inputs, reference, time_limit=60.0,
                       min_time=0.01)
    from tclang.lang.frontend import check_source
    space = SearchSpace.of(check_source(source).definitions[0], dict(B=3, I=5, O=4), "cpu",
                           8, 16)
    trial = trials.run_trial(task, space.automatic())
    assert trial.status == "degraded", (trial.status, trial.message)
    assert not trial.ok and trial.seconds is None
    assert "scheduler's fallback" in trial.message and "ran past" in trial.message


def test_a_forked_child_does_not_kill_the_parents_trials():
    """kill_running() in a child forked while a trial runs: the parent's trial lives on.
    Before: the child inherited `_running` and SIGKILLed it."""
    trial = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        with trials._running_lock:
            trials._running.add(trial.pid)
        pid = os.fork()
        if pid == 0:
            try:
                trials.kill_running()
            finally:
                os._exit(0)
        os.waitpid(pid, 0)
        time.sleep(0.2)
        assert trial.poll() is None, "the child killed the parent's trial"
        assert trials._running == {trial.pid}  # the parent's own set is untouched
    finally:
        with trials._running_lock:
            trials._running.discard(trial.pid)
        trial.kill()
        trial.wait()
