"""`tclang demo` and benchmarks/run.py time with one implementation (tclang.tools.timing):
interleaved rounds, warm-up, a rest after every sample, medians with their spread."""

from __future__ import annotations

import re
import sys
from pathlib import Path

from tclang.cli import main

ROOT = Path(__file__).resolve().parents[2]


def test_interleaved_takes_turns_and_rests_after_every_sample(monkeypatch):
    import tclang.tools.timing as timing
    events = []
    monkeypatch.setattr(timing.time, "sleep", lambda s: events.append(("rest", s)))
    calls = {"a": lambda: events.append("a"), "b": lambda: events.append("b")}
    result = timing.interleaved(calls, rounds=3, gap=0.25, least=0.0, warm=0.0)
    timed = [e for e in events if e in ("a", "b") or e[0] == "rest"]
    # after the two calibration calls: per round, a's sample, a rest, b's sample, a rest
    order = [e if isinstance(e, str) else "rest" for e in timed[2:]]
    assert order == ["a", "a", "rest", "b", "b", "rest"] * 3  # one warm-up, one timed
    assert all(e[1] == 0.25 for e in events if isinstance(e, tuple))
    assert [len(t.samples) for t in result.values()] == [3, 3]


def test_interleaved_reads_the_clock_it_is_given():
    """benchmarks/generality.py times the calling thread's CPU time (time.thread_time)."""
    import itertools

    import tclang.tools.timing as timing
    ticks = itertools.count()
    result = timing.interleaved({"a": lambda: None}, rounds=2, gap=0.0, least=0.0,
                                warm=0.0, clock=lambda: float(next(ticks)))
    assert result["a"].samples == [1.0, 1.0]  # one call a sample, one tick between reads


def test_spread_and_median():
    import tclang.tools.timing as timing
    t = timing.Timing([1.0, 2.0, 3.0, 4.0, 100.0])
    assert t.median == 3.0 and abs(t.spread - 2 / 3) < 1e-12  # (4 - 2) / 3
    assert t.text(scale=1, digits=1) == "3.0 ±67%"
    assert timing.spread([5.0]) == 0.0


def test_benchmarks_use_the_package_timing():
    import tclang.tools.timing as timing
    sys.path.insert(0, str(ROOT))
    try:
        from benchmarks import run as bench
    finally:
        sys.path.remove(str(ROOT))
    assert bench.interleaved is timing.interleaved
    assert not hasattr(bench, "_repeats")  # no second implementation


def test_demo_shows_spreads_and_tells_compiled_from_cached(capsys):
    args = ["demo", "--size", "24", "--rounds", "3", "--gap", "0"]
    assert main(args) == 0
    first = capsys.readouterr().out
    assert main(args) == 0
    second = capsys.readouterr().out
    rows = [line for line in first.splitlines() if line.startswith("| matmul")]
    assert rows and re.search(r"\| [\d.]+ ±\d+% \| [\d.]+ ±\d+% \| [\d.]+x ±\d+% \|$", rows[0])
    assert "median" in first and "load average" in first
    for name in ("matmul", "mlp_layer", "softmax"):
        row = next(line for line in second.splitlines() if line.startswith(f"| {name} "))
        assert "loaded from the" in row and "cache" in row, row
    # the session's cache directory is fresh (tests/conftest.py): the first run compiled
    assert all(", compiled |" in line for line in first.splitlines()
               if line.startswith(("| matmul", "| mlp_layer", "| softmax")))
