"""tc.autotune end to end: trials in their own processes (crash, hang, wrong result), the
tuning database (a second process compiles from it without searching; two tuners on one
file), executors (concurrent.futures, dask.distributed), Ctrl-C."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import os
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import tclang as tc
from tclang.tuning import search, trials
from tclang.driver.tuning_database import TuningDatabase
from tclang.tuning.space import SearchSpace

ROOT = Path(__file__).resolve().parents[2]
MATMUL = "def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }"


def inputs(seed=0, m=24, k=17, n=40):
    rng = np.random.default_rng(seed)
    return rng.random((m, k), np.float32), rng.random((k, n), np.float32)


def quick(kernel, *args, **kwargs):
    kwargs = {"budget": 3, "min_time": 0.01, "progress": False, "seed": 0,
              "time_limit": 60, **kwargs}
    return tc.autotune(kernel, *args, **kwargs)


def test_tuning_stores_options_that_a_second_process_compiles_without_searching(tmp_path):
    db = tmp_path / "tuning.sqlite"
    A, B = inputs()
    result = quick(tc.define(MATMUL).mm, A, B, database=db, budget=4)
    assert result.stored and result.counts()["ok"] >= 4
    assert result.best_seconds <= result.automatic_seconds  # the automatic one competes
    expected = result.best.to_dict()
    script = f"""
        import json, sys, warnings
        import numpy as np
        import tclang as tc
        warnings.simplefilter("error")
        rng = np.random.default_rng(0)
        A, B = rng.random((24, 17), np.float32), rng.random((17, 40), np.float32)
        compiled = tc.define({MATMUL!r}, options="tuned").mm.compile(A, B)
        assert np.allclose(compiled(A, B), A @ B, rtol=1e-5)
        print(json.dumps(compiled.options.to_dict()))
        print(any(m.startswith("tclang.tuning.search") or m.startswith("tclang.tuning.trials")
                  for m in sys.modules))
    """
    env = dict(os.environ, PYTHONPATH=str(ROOT), TCLANG_TUNING_DB=str(db))
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    options, searched = done.stdout.split("\n")[:2]
    import json
    assert json.loads(options) == expected
    assert searched == "False"  # compiled from the database: no search ran


def test_options_tuned_elsewhere_are_ignored_with_a_warning(tmp_path, monkeypatch):
    db = TuningDatabase(tmp_path / "t.sqlite")
    A, B = inputs()
    mod = tc.define(MATMUL)
    from tclang.driver.cachekey import canonical_source
    from tclang.driver.tuning_database import kernel_key
    from tclang.runtime.arguments import bind_arguments
    key = kernel_key(canonical_source(mod.mm.definition), "mm",
                     bind_arguments(mod.mm.definition, (A, B)).shape_key(), "cpu")
    db.offer_best(key, "another-machine", "mm", (), tc.Options(unroll=2), 1e-3, 2e-3, 5)
    monkeypatch.setenv("TCLANG_TUNING_DB", str(db.path))
    with pytest.warns(tc.TCWarning, match="tuned on another machine"):
        compiled = tc.define(MATMUL, options="tuned").mm.compile(A, B)
    assert compiled.options == tc.Options()


def test_a_wrong_result_is_a_reported_compiler_bug_never_the_winner(tmp_path, monkeypatch):
    real = trials._measure
    automatic = None

    def wrong_unless_automatic(task, candidate):
        if candidate != automatic:  # as if the candidate's code computed something else
            task = dataclasses.replace(task, reference=tuple(r + 1 for r in task.reference))
        return real(task, candidate)

    A, B = inputs()
    kernel = tc.define(MATMUL).mm
    from tclang.runtime.arguments import bind_arguments
    automatic = SearchSpace.of(kernel.definition, dict(bind_arguments(
        kernel.definition, (A, B)).sizes), "cpu").automatic()
    monkeypatch.setattr(trials, "_measure", wrong_unless_automatic)
    result = quick(kernel, A, B, budget=2, store=False, reproducer_dir=str(tmp_path))
    assert result.counts()["wrong"] >= 1
    assert result.best == tc.Options()
    scripts = list(tmp_path.glob("wrong-mm-*.py"))
    assert scripts and "tc.Options(" in scripts[0].read_text()
    assert "COMPILER BUG" in str(result)


def test_a_crashing_and_a_hanging_candidate_cost_one_trial_each(monkeypatch):
    real_measure, real_run = trials._measure, trials.run_trial
    A, B = inputs()
    kernel = tc.define(MATMUL).mm
    from tclang.runtime.arguments import bind_arguments
    automatic = SearchSpace.of(kernel.definition, dict(bind_arguments(
        kernel.definition, (A, B)).sizes), "cpu").automatic()
    roles: dict = {}  # candidate -> its fate, decided in the tuner before the fork
    lock = threading.Lock()

    def assigning(task, candidate):  # the tuner's side: the first two others misbehave
        with lock:
            if candidate != automatic and candidate not in roles:
                roles[candidate] = ("hang", "crash", "ok", "ok")[min(len(roles), 2)]
        if roles.get(candidate) == "hang":  # killed after 3 s, not the minute the others get
            task = dataclasses.replace(task, time_limit=3)
        return real_run(task, candidate)

    def sabotaged(task, candidate):  # the trial's forked process
        if roles.get(candidate) == "hang":
            time.sleep(3600)
        if roles.get(candidate) == "crash":
            os.abort()
        return real_measure(task, candidate)

    monkeypatch.setattr(trials, "run_trial", assigning)
    monkeypatch.setattr(trials, "_measure", sabotaged)
    start = time.monotonic()
    result = quick(kernel, A, B, budget=3, store=False, jobs=2)
    counts = result.counts()
    assert counts["timeout"] == 1 and counts["crashed"] == 1 and counts["ok"] >= 3
    assert time.monotonic() - start < 60
    crash = next(t for t in result.trials if t.status == "crashed")
    assert "SIGABRT" in crash.message
    hang = next(t for t in result.trials if t.status == "timeout")
    assert "no result within 3 s" in hang.message


def test_an_illegal_loop_order_is_refused_and_never_timed():
    source = "def total(float(N, M) A) -> (s) {\n  s +=! A(i, j)\n}"
    a = np.random.default_rng(0).random((5, 7), np.float32)
    task = trials.Task(source, "total", "cpu", (a,), (np.float32(a.sum()),), min_time=0.01)
    in_order = (("reorder_reductions", False),)
    assert trials.run_trial(task, in_order).status == "ok"
    bad = trials.run_trial(task, (("loop_order", (1, 0)),) + in_order)
    assert bad.status == "refused" and bad.seconds is None
    assert "dependence on s" in bad.message


def test_tuning_on_a_concurrent_futures_executor():
    A, B = inputs(1)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        result = quick(tc.define(MATMUL).mm, A, B, executor=pool, store=False)
        assert not pool._shutdown  # the caller's executor is the caller's to shut down
    assert result.counts()["ok"] >= 3


def test_tuning_on_a_dask_local_cluster_of_two_worker_processes(tmp_path):
    distributed = pytest.importorskip("distributed")
    A, B = inputs(2)
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=None) as cluster, \
            distributed.Client(cluster) as client:
        result = quick(tc.define(MATMUL).mm, A, B, executor=client,
                       database=tmp_path / "t.sqlite")
    assert result.counts()["ok"] >= 3 and result.stored
    rows = sqlite3.connect(tmp_path / "t.sqlite").execute("SELECT count(*) FROM trials")
    assert rows.fetchone()[0] == len(result.trials)


TUNER = """
    import sys
    import numpy as np
    import tclang as tc
    rng = np.random.default_rng(0)  # the same kernel and shapes in both tuners
    A, B = rng.random((24, 17), np.float32), rng.random((17, 40), np.float32)
    r = tc.autotune(tc.define({mm!r}).mm, A, B, budget=3, min_time=0.01, progress=False,
                    seed=int(sys.argv[2]), database=sys.argv[1], jobs=1)
    print(len(r.trials), r.best_seconds)
"""


def test_two_tuners_on_one_database_leave_it_valid(tmp_path):
    db = tmp_path / "shared.sqlite"
    script = tmp_path / "tuner.py"
    script.write_text(textwrap.dedent(TUNER.format(mm=MATMUL)))
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    tuners = [subprocess.Popen([sys.executable, str(script), str(db), str(seed)], env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
              for seed in (1, 2)]
    outs = [t.communicate(timeout=300) for t in tuners]
    assert all(t.returncode == 0 for t in tuners), [o[1][-2000:] for o in outs]
    counts = [int(o[0].split()[0]) for o in outs]
    best = min(float(o[0].split()[1]) for o in outs)
    conn = sqlite3.connect(db)
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    assert conn.execute("SELECT count(*) FROM trials").fetchone()[0] == sum(counts)
    rows = conn.execute("SELECT seconds, trials FROM best").fetchall()
    assert len(rows) == 1 and rows[0][1] == sum(counts)
    assert rows[0][0] == pytest.approx(best)  # the faster tuner's best stayed


def test_ctrl_c_keeps_the_best_found(monkeypatch, tmp_path):
    real = search._Search.record

    def interrupted_after_three(self, trial):
        real(self, trial)
        if len(self.trials) == 3:
            raise KeyboardInterrupt

    monkeypatch.setattr(search._Search, "record", interrupted_after_three)
    A, B = inputs(3)
    result = quick(tc.define(MATMUL).mm, A, B, budget=20, jobs=1,
                   database=tmp_path / "t.sqlite")
    assert result.interrupted and len(result.trials) == 3 and result.stored
    assert result.best_seconds == min(t.seconds for t in result.trials if t.ok)


def test_bad_arguments_are_refused_before_any_trial():
    A, B = inputs()
    with pytest.raises(tc.TCArgumentError):
        quick(tc.define(MATMUL).mm, A, A)
    with pytest.raises(tc.TCError, match="strategy"):
        quick(tc.define(MATMUL).mm, A, B, strategy="annealing")
