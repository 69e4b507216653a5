"""The tuner's space holds the knobs that changed guarded reductions' speed (issue 33), and
a winner that does not repeat when timed again beside the automatic schedule is not stored
as the best (tclang/tuning/search.py, `_confirmed`). The timer is mocked: no trial runs."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import tclang as tc
from tclang.tuning import search, trials
from tclang.driver.tuning_database import TuningDatabase, kernel_key, machine_id
from tclang.tuning.space import SearchSpace

TRACE = "def trace(float(B,N,N) A) -> (T) { T(b) +=! A(b,i,i) }"
ASSIGN = "def copy(float(N) A) -> (B) { B(i) = A(i) }"


def space_of(source: str, sizes: dict) -> SearchSpace:
    from tclang.lang.frontend import check_source
    return SearchSpace.of(check_source(source).definitions[0], sizes, "cpu")


def test_one_reduction_with_a_bang_has_fusion_in_its_space_and_vectorize_too():
    knobs = space_of(TRACE, dict(B=4, N=5)).knobs
    assert "fusion" in knobs and "vectorize" in knobs
    assert "fusion" not in space_of(ASSIGN, dict(N=4)).knobs  # one statement: nothing to fuse
    assert dict(space_of(TRACE, dict(B=4, N=5)).choices)["vectorize"] == (None, False)


def _fake_timer(monkeypatch, times):
    """trials.run_trial replaced: each candidate's next time from `times(candidate, k)`,
    k counting that candidate's trials; every call recorded."""
    calls: list = []
    lock = threading.Lock()

    def run_trial(task, candidate):
        with lock:
            k = sum(1 for c in calls if c == candidate)
            calls.append(candidate)
        return trials.Trial(candidate, "ok", seconds=times(candidate, k))

    monkeypatch.setattr(trials, "run_trial", run_trial)
    return calls


def _tune(tmp_path, monkeypatch, times):
    kernel = tc.define(TRACE).trace
    a = np.zeros((8, 9, 9), np.float32)
    space = space_of(TRACE, dict(B=8, N=9))
    calls = _fake_timer(monkeypatch, lambda c, k: times(c == space.automatic(), k))
    db = tmp_path / "tuning.sqlite"
    result = tc.autotune(kernel, a, budget=6, progress=False, seed=1, database=str(db),
                         jobs=1)
    return result, calls, space, db


def test_a_winner_by_noise_is_not_stored(tmp_path, monkeypatch):
    # every other point is as fast as automatic, except for one lucky first sample each
    result, calls, space, db = _tune(
        tmp_path, monkeypatch, lambda automatic, k: 1.0 if automatic or k > 0 else 0.5)
    assert result.best == tc.Options()
    assert result.best_seconds == result.automatic_seconds == 1.0
    assert calls.count(space.automatic()) >= 1 + search.CONFIRM_ROUNDS
    assert result.stored and _stored(db)["options"] == tc.Options()


def _stored(db) -> dict:
    from tclang.runtime.arguments import bind_arguments
    from tclang.driver.cachekey import canonical_source
    from tclang.driver.compiler import compile_target
    kernel = tc.define(TRACE).trace
    shapes = bind_arguments(kernel.definition, (np.zeros((8, 9, 9), np.float32),)).shape_key()
    key = kernel_key(canonical_source(kernel.definition), "trace", shapes, "cpu")
    return TuningDatabase(str(db)).best(key, machine_id(compile_target("cpu", tc.Options())))


def test_a_winner_that_repeats_is_kept(tmp_path, monkeypatch):
    result, calls, space, db = _tune(
        tmp_path, monkeypatch, lambda automatic, k: 1.0 if automatic else 0.5)
    assert result.best != tc.Options()
    assert result.best_seconds == pytest.approx(0.5)
    assert result.automatic_seconds == pytest.approx(1.0)
    assert _stored(db)["options"] == result.best


def test_confirmed_takes_the_medians_of_every_retiming(monkeypatch):
    space = space_of(TRACE, dict(B=8, N=9))
    other = tuple((k, "min" if k == "fusion" else None) for k, _ in space.automatic())
    found = {space.automatic(): 1.0, other: 0.9}
    seq = iter([0.95, 1.0, 0.97, 1.0])  # other, automatic, other, automatic

    class Runner:
        def run(self, batch):
            yield trials.Trial(batch[0], "ok", seconds=next(seq))

    class Search:
        pass
    s = Search()
    s.space = space
    final = search._confirmed(s, Runner(), found)
    assert final == {other: 0.95, space.automatic(): 1.0}  # 0.95 * 1.02 < 1.0: kept
