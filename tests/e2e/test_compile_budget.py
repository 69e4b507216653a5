"""A compile budget, a progress bar, and where a compile's time went (issue 34 items 2, 4).

Before, nothing bounded a compile: a program of many statements spent minutes (hours for
the largest) in the dependences or the band transforms with no word to the user. Now one
wall-clock budget covers a whole compile (tclang/budget.py). Past it, from the schedule
stage on, the kernel takes the cheapest legal schedule and is degraded (never stored,
compiled in full later); before any schedule exists, a TCCompileError names the stage and
what to split. After PROGRESS_AFTER seconds a bar on stderr names the stage.

The stages are made slow here by wrapping one step so that it sleeps until the budget is
spent: the outcome is then the same on a loaded machine as on a quiet one.
"""

from __future__ import annotations

import re
import sys
import time
import uuid

import numpy as np
import pytest

import tclang as tc
from tclang import budget as compile_budget
from tclang.driver import diskcache

MLP = ("def {name}(float(B,I) X, float(O,I) W, float(O) b) -> (Y) {{\n"
       "  Y(i,o) +=! X(i,k) * W(o,k)\n  Y(i,o) = fmax(Y(i,o) + b(o), 0)\n}}")


def fresh_mlp(**options):
    """A kernel no cache holds (its own name), and its inputs."""
    name = f"mlp_{uuid.uuid4().hex[:8]}"
    kernel = tc.define(MLP.format(name=name), options=tc.Options(**options))[name]
    rng = np.random.default_rng(0)
    X, W, b = (rng.random(s, np.float32) - 0.5 for s in ((6, 5), (4, 5), (4,)))
    return name, kernel, (X, W, b), np.maximum(X @ W.T + b, 0)


def spend_the_budget(module, name: str, monkeypatch, after: bool = False) -> None:
    """`module.name` sleeps until the current compile's budget is spent, then runs (or,
    `after`, runs and then sleeps)."""
    real = getattr(module, name)

    def slow(*args, **kwargs):
        if after:
            result = real(*args, **kwargs)
        time.sleep(max(0.0, compile_budget.current().remaining()) + 0.02)
        return result if after else real(*args, **kwargs)

    monkeypatch.setattr(module, name, slow)


@pytest.fixture(autouse=True)
def middle_end_here(monkeypatch):
    """The middle end in this process, as where no helper can be forked (the way
    tclang/driver/middle_end.py takes then): these tests patch its stages and read the bar from
    this process's stderr. The tests that end this file go through the helper."""
    from tclang.driver import middle_end
    from tclang.forked_server import ServerUnavailable

    def unavailable(request, **_):
        raise ServerUnavailable("no helper in these tests")

    monkeypatch.setattr(middle_end._helper, "call", unavailable)
    yield
    monkeypatch.undo()
    middle_end.stop()  # tc.define forked one while the stages were patched: gone with them


@pytest.fixture
def progress(monkeypatch):
    """The bar forced (stderr is no terminal under pytest) and shown from the start."""
    monkeypatch.setenv("TCLANG_PROGRESS", "1")
    monkeypatch.setattr(compile_budget, "PROGRESS_AFTER", 0.0)


@pytest.fixture
def stored(monkeypatch):
    """The keys the disk cache is asked to store."""
    keys, real = [], diskcache.store

    def logged(digest, key, blobs, warn=True):
        keys.append(key)
        return real(digest, key, blobs, warn)

    monkeypatch.setattr(diskcache, "store", logged)
    return keys


def test_a_budget_spent_before_the_schedule_falls_back_to_program_order(
        monkeypatch, capsys, progress, stored):
    """Past the budget when the schedule stage begins: program order (legal whatever the
    dependences), degraded, not stored; the bar named the stage that was running."""
    import polyhedral.pipeline as pipeline
    spend_the_budget(pipeline, "compute_dependences", monkeypatch, after=True)
    name, kernel, args, expected = fresh_mlp(compile_budget=0.5)
    compiled = kernel.compile(*args)
    assert np.allclose(compiled(*args), expected, rtol=1e-5)
    assert compiled.degraded and compiled.strategy == "original"
    assert "compile budget of 0.5 s was spent" in compiled.fallback
    assert not any(dict(k).get("entry") == name for k in stored if isinstance(k[0], tuple))
    err = capsys.readouterr().err
    assert f"compiling {name}: dependences" in err


def test_a_kernel_degraded_again_at_its_retry_waits_twice_as_long(monkeypatch):
    """A program whose dependences alone spend the budget must not cost the process the
    whole budget again every RETRY_AFTER: each retry that degrades again doubles the
    wait."""
    import polyhedral.pipeline as pipeline
    from polyhedral.scheduler import RETRY_AFTER
    spend_the_budget(pipeline, "compute_dependences", monkeypatch, after=True)
    _, kernel, args, expected = fresh_mlp(compile_budget=0.3)
    first = kernel.compile(*args).compiled
    assert first.retry_at - first.made_at == pytest.approx(RETRY_AFTER, abs=1)
    first.retry_at = time.monotonic() - 1  # its retry has come: compiled again
    second = kernel.compile(*args).compiled
    assert second is not first and second.retry_at is not None
    assert second.retry_at - second.made_at == pytest.approx(2 * RETRY_AFTER, abs=1)
    assert np.allclose(kernel(*args), expected, rtol=1e-5)


def test_a_budget_spent_in_the_transforms_keeps_the_schedule_untransformed(
        monkeypatch, capsys, progress, stored):
    """The band walk checks the deadline: past it, isl's schedule as it came (neither
    tiled nor transformed), degraded, not stored."""
    import polyhedral.pipeline as pipeline
    spend_the_budget(pipeline, "fuse_rows", monkeypatch)
    name, kernel, args, expected = fresh_mlp(compile_budget=0.5)
    compiled = kernel.compile(*args)
    assert np.allclose(compiled(*args), expected, rtol=1e-5)
    assert compiled.degraded and compiled.strategy == "preserve_parallel"
    assert "neither tiled nor transformed" in compiled.fallback
    assert not any(dict(k).get("entry") == name for k in stored if isinstance(k[0], tuple))
    assert f"compiling {name}: transform" in capsys.readouterr().err
    assert compiled.compiled.retry_at > time.monotonic()  # compiled in full again after it


def test_a_budget_spent_once_the_schedule_is_made_finishes_it(monkeypatch, stored):
    """Spent when the transforms are done: the loops and the code are made in the grace
    (a schedule exists; failing then would waste it), the kernel full and stored."""
    import polyhedral.pipeline as pipeline
    spend_the_budget(pipeline, "graft_copies", monkeypatch, after=True)
    name, kernel, args, expected = fresh_mlp(compile_budget=0.5)
    compiled = kernel.compile(*args)
    assert not compiled.degraded and compiled.fallback is None
    assert np.allclose(compiled(*args), expected, rtol=1e-5)
    assert any(dict(k).get("entry") == name for k in stored if isinstance(k[0], tuple))


@pytest.mark.parametrize("module, step, stage", [
    ("polyhedral.pipeline", "build_scop", "scop"),  # the check between stages
    ("polyhedral.dependences", "_dataflow", "dependences"),  # the check in the loop
])
def test_a_budget_spent_before_any_schedule_is_a_compile_error_naming_the_stage(
        monkeypatch, capsys, progress, module, step, stage):
    """No schedule to fall back on yet: a TCCompileError that says which stage, what to
    split and how to give more time, with the bar on stderr before it."""
    import importlib
    spend_the_budget(importlib.import_module(module), step, monkeypatch)
    monkeypatch.setenv("TCLANG_COMPILE_BUDGET", "0.5")  # the environment's budget
    name, kernel, args, _ = fresh_mlp()
    with pytest.raises(tc.TCCompileError) as caught:
        kernel.compile(*args)
    message = str(caught.value)
    assert f"ran past its compile budget of 0.5 s in the {stage} stage" in message
    assert "split the definition" in message and "TCLANG_COMPILE_BUDGET" in message
    assert f"compiling {name}: {stage}" in capsys.readouterr().err


def test_the_budget_is_an_option_and_a_variable_checked_when_given(monkeypatch):
    with pytest.raises(tc.TCScheduleError, match="compile_budget must be a positive"):
        tc.Options(compile_budget=0)
    with pytest.raises(tc.TCScheduleError, match="compile_budget must be a positive"):
        tc.Options(compile_budget="10")
    # it changes how long a compile may take, never what a full one makes
    assert tc.Options(compile_budget=5).key() == tc.Options().key()
    monkeypatch.setenv("TCLANG_COMPILE_BUDGET", "soon")
    _, kernel, args, _ = fresh_mlp()
    with pytest.raises(tc.TCConfigError, match="TCLANG_COMPILE_BUDGET must be a finite number above 0"):
        kernel.compile(*args)
    monkeypatch.setenv("TCLANG_COMPILE_BUDGET", "2.5")
    assert compile_budget.seconds_for(tc.Options()) == 2.5
    assert compile_budget.seconds_for(tc.Options(compile_budget=7)) == 7


def test_no_bar_and_no_note_for_a_quick_compile(monkeypatch, capsys):
    """A normal operator meets neither the budget nor the bar (PROGRESS_AFTER)."""
    monkeypatch.setenv("TCLANG_PROGRESS", "1")
    _, kernel, args, expected = fresh_mlp()
    compiled = kernel.compile(*args)
    assert not compiled.degraded and np.allclose(compiled(*args), expected, rtol=1e-5)
    if sum(compiled.timings.values()) < compile_budget.PROGRESS_AFTER / 2:
        assert "compiling" not in capsys.readouterr().err


def test_a_slow_compile_says_where_its_time_went(monkeypatch, capsys):
    """Over SLOW_COMPILE seconds, one line on stderr: each stage's time, largest first."""
    monkeypatch.setattr(compile_budget, "SLOW_COMPILE", 0.0)
    name, kernel, args, _ = fresh_mlp()
    kernel.compile(*args)
    err = capsys.readouterr().err
    line = next(line for line in err.splitlines() if line.startswith("tclang: compiling"))
    assert line.startswith(f"tclang: compiling {name} took ")
    for stage in ("dependences", "schedule", "transform", "loops", "code"):
        assert f"{stage} " in line
    monkeypatch.setenv("TCLANG_PROGRESS", "0")  # silenced
    kernel2 = fresh_mlp()[1]
    kernel2.compile(*args)
    assert "tclang: compiling" not in capsys.readouterr().err


def test_explain_timings_of_a_cached_kernel_times_a_compile(tmp_path, capsys):
    """Before, a kernel from a cache showed only "(loaded from the compile cache: nothing
    was compiled)" (a memory hit) or its load time (a disk hit)."""
    from tclang.cli import main
    name = f"mm_{uuid.uuid4().hex[:8]}"
    source = f"def {name}(float(M,K) A, float(K,N) B) -> (C) {{ C(m,n) +=! A(m,k) * B(k,n) }}"
    path = tmp_path / "mm.tc"
    path.write_text(source)
    argv = ["tclang", "explain", str(path), "--sizes", "M=8,N=7,K=5", "--stage", "timings"]
    for _ in range(2):  # compiled, then from the cache
        monkeypatch = pytest.MonkeyPatch()
        monkeypatch.setattr(sys, "argv", argv)
        try:
            assert main() == 0
        finally:
            monkeypatch.undo()
        out = capsys.readouterr().out
        for stage in ("passes", "scop", "dependences", "schedule", "transform", "loops",
                      "code"):
            assert f"{stage}:" in out, out
    # explain compiles afresh (tools2, tclang/cli/commands.py _explain): the second run, whose
    # kernel both caches hold, times a whole compile too, never a cache's load
    assert "cache load" not in out.split("== compile time")[1]


def test_a_budget_spent_in_the_middle_ends_process_comes_back_as_raised(monkeypatch,
                                                                       fresh_middle_end):
    """Through the helper (forked after the patch): the compiler's deadline continues
    there, and the BudgetExceeded it raises comes back with its stage and message (it is
    pickled; its constructor takes a live Budget, which does not travel)."""
    monkeypatch.undo()  # the helper, not this process
    import polyhedral.dependences as dependences
    spend_the_budget(dependences, "_dataflow", monkeypatch)
    name, kernel, args, expected = fresh_mlp(compile_budget=0.5)
    with pytest.raises(compile_budget.BudgetExceeded) as raised:
        kernel.compile(*args)
    assert raised.value.stage == "dependences" and raised.value.seconds == 0.5
    assert "in the dependences stage" in str(raised.value)


def test_a_fallback_taken_in_the_middle_ends_process_is_the_compilers(monkeypatch, stored,
                                                                     fresh_middle_end):
    """Through the helper: past the budget in the schedule stage, program order comes
    back degraded, the compiler's budget knows it fell back (its note says so), and
    nothing is stored."""
    monkeypatch.undo()
    monkeypatch.setattr(diskcache, "store", lambda digest, key, blobs, warn=True: (
        stored.append(key), True)[1])
    import polyhedral.pipeline as pipeline
    spend_the_budget(pipeline, "compute_dependences", monkeypatch, after=True)
    name, kernel, args, expected = fresh_mlp(compile_budget=0.5)
    compiled = kernel.compile(*args)
    np.testing.assert_allclose(kernel(*args), expected, rtol=1e-5)
    assert compiled.degraded and "budget" in (compiled.fallback or "")
    assert not any(key[1] == ("entry", name) for key in stored if len(key) > 1)


# ---- programs of more than SPLIT_STATEMENTS statements, scheduled in groups -------------

CHAIN = 200  # in-place updates: about 7 groups (polyhedral/statement_groups.py)


def fresh_chain(**options):
    """A 200-statement chain no cache holds (its own name), its inputs and NumPy's
    result."""
    from benchmarks.many_statements import expected, inputs, source
    name = f"chain_{uuid.uuid4().hex[:8]}"
    text = source(CHAIN, "inplace").replace("def many(", f"def {name}(", 1)
    kernel = tc.define(text, options=tc.Options(**options))[name]
    arrays = inputs(CHAIN, "inplace")
    return name, kernel, arrays, expected(CHAIN, "inplace", arrays)


def spent_at_call(module, name: str, monkeypatch, call: int = 1) -> list:
    """`module.name`'s `call`-th call (in this compile) runs and then spends the current
    compile's budget (its deadline moved to now: the same as a sleep, without its wait, so
    that the stages before need no margin on a loaded machine). The calls are counted in
    the list returned."""
    real, calls = getattr(module, name), []

    def spending(*args, **kwargs):
        result = real(*args, **kwargs)
        calls.append(name)
        if len(calls) == call:
            compile_budget.current().deadline = time.monotonic()
        return result

    monkeypatch.setattr(module, name, spending)
    return calls


def test_a_grouped_program_past_its_budget_schedules_its_later_groups_in_program_order(
        monkeypatch, capsys, progress, stored):
    """Spent once isl has scheduled the first group: each group left is not given to isl
    but runs in program order (said once for them all), fused back all the same (169
    loops of their own cost LLVM 2 s here, 14 s for 1,000 statements), and the kernel is
    right, degraded and not stored; the bar named the schedule stage."""
    from polyhedral import loop_ir as L
    from polyhedral import scheduler
    calls = spent_at_call(scheduler, "_in_worker", monkeypatch)
    name, kernel, args, expected = fresh_chain()
    compiled = kernel.compile(*args)
    assert len(calls) == 1  # no group after the first went to isl
    np.testing.assert_allclose(compiled(*args), expected, rtol=1e-5)
    assert compiled.degraded and compiled.strategy == "preserve_parallel / original"
    assert compiled.fallback.count("was spent") == 2  # preserve_parallel, min: once each
    assert re.match(r"statements S\d+\.\.S199: preserve_parallel: not tried", compiled.fallback)
    loops = [n for n in L.walk_nodes(compiled.loop_ir.body) if isinstance(n, L.For)]
    assert len(loops) <= 2  # isl's loop of the first group, one for the rest
    assert not any(dict(k).get("entry") == name for k in stored if isinstance(k[0], tuple))
    assert compiled.compiled.retry_at > time.monotonic()
    assert f"compiling {name}: schedule" in capsys.readouterr().err


def test_a_grouped_program_past_its_budget_in_the_dependences_is_a_compile_error(
        monkeypatch):
    """The per-statement dependence loop checks the deadline at every statement: spent at
    the 50th of 200, the next one raises, naming the stage."""
    from polyhedral import dependences
    calls = spent_at_call(dependences, "_dataflow", monkeypatch, call=50)
    _, kernel, args, _ = fresh_chain(compile_budget=30)
    with pytest.raises(tc.TCCompileError, match="in the dependences stage") as caught:
        kernel.compile(*args)
    assert len(calls) == 50 and "split the definition" in str(caught.value)


@pytest.mark.parametrize("seconds", [0.02, 0.3, 1.0])
def test_a_tiny_budget_on_a_grouped_program_is_a_defined_outcome(monkeypatch,
                                                               fresh_middle_end, seconds):
    """No patches, through the middle end's helper: whatever stage the budget runs out
    in (it depends on the machine's speed and load), a 200-statement chain either
    compiles (degraded where the budget ran out from the schedule on) and is right, or is
    a TCCompileError naming a stage before the schedule ("start": spent before the first
    stage, on handing the definition to the helper)."""
    monkeypatch.undo()  # the helper, not this process
    _, kernel, args, expected = fresh_chain(compile_budget=seconds)
    try:
        compiled = kernel.compile(*args)
    except tc.TCCompileError as error:
        assert any(f"in the {stage} stage" in str(error)
                   for stage in ("start", "passes", "scop", "dependences")), str(error)
        return
    np.testing.assert_allclose(compiled(*args), expected, rtol=1e-5)
    if compiled.degraded:
        assert "budget" in compiled.fallback
