"""Memory stays bounded in a long-running process: compiled variants are kept in LRU maps
(TCLANG_MAX_VARIANTS), and a variant nobody holds is freed, its machine code with it.

What is measured is what tclang keeps. llvmlite itself leaks ~75 KB per LLVM optimization
run (its PassBuilder's PassInstrumentationCallbacks are never deleted), so the RSS checks
run on kernels loaded from the disk cache, which optimize nothing.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

import tclang as tc

ROOT = Path(__file__).resolve().parents[2]
SOAK = ROOT / "tests" / "soak" / "rss_soak.py"


def soak(count: int, every: int, cache: Path, **env) -> dict[str, list[tuple]]:
    """Run tests/soak/rss_soak.py in a fresh process: workload -> [(kernels, MB, engines)]."""
    environment = dict(os.environ, TCLANG_CACHE_DIR=str(cache), PYTHONPATH=str(ROOT), **env)
    run = subprocess.run([sys.executable, str(SOAK), str(count), str(every)], env=environment,
                         cwd=ROOT, text=True, capture_output=True, timeout=3600)
    assert run.returncode == 0, run.stderr
    curves: dict[str, list[tuple]] = {}
    for line in run.stdout.splitlines():
        name, kernels, mb, engines = line.split()
        curves.setdefault(name, []).append((int(kernels), float(mb), engines))
    return curves


def growth(curve) -> float:
    """MB gained from the first checkpoint to the last."""
    return curve[-1][1] - curve[0][1]


def test_live_engines_and_memory_stay_bounded(tmp_path):
    """150 distinct sources and one kernel at 150 sizes, 16 variants kept: the process
    holds at most the variants its maps keep (the old code kept all 300 engines), and
    loading them all again from the disk cache adds next to nothing (0.0 and 0.4 MB over the
    last 100 of each; the old code grew 5.4 and 6.3 MB)."""
    cold = soak(150, 50, tmp_path, TCLANG_MAX_VARIANTS="16")
    kept = 16 + 2 * 16  # the compiler's recent set, a kernel's compiled and hot maps
    for name in ("sources", "sizes"):
        assert all(int(engines) <= kept for _, _, engines in cold[name]), cold[name]
    replay = soak(150, 50, tmp_path, TCLANG_MAX_VARIANTS="16")
    for name in ("sources", "sizes"):
        assert growth(replay[name]) < 2, replay[name]


def test_an_evicted_variant_runs_again_correctly(monkeypatch):
    monkeypatch.setenv("TCLANG_MAX_VARIANTS", "2")
    mod = tc.define("def plus(float(N) A) -> (B) { B(i) = A(i) + 1 }")
    for n in (3, 4, 5, 3, 6, 4, 3):
        x = np.arange(n, dtype=np.float32)
        np.testing.assert_array_equal(mod.plus(x), x + 1)
        assert len(mod.plus._compiled) <= 2 and len(mod.plus._hot) <= 2


def test_eviction_racing_with_hot_calls(monkeypatch):
    """Threads call one kernel at more sizes than it keeps: entries are evicted while other
    threads read them on the hot path, and every call still returns the right result."""
    monkeypatch.setenv("TCLANG_MAX_VARIANTS", "2")
    mod = tc.define("def twice(float(N) A) -> (B) { B(i) = A(i) * 2 }")
    inputs = [np.arange(n, dtype=np.float32) for n in range(1, 6)]
    errors = []

    def calls(offset):
        try:
            for k in range(40):
                x = inputs[(k + offset) % len(inputs)]
                np.testing.assert_array_equal(mod.twice(x), x * 2)
        except Exception as err:  # reported by the main thread
            errors.append(err)

    threads = [threading.Thread(target=calls, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


def test_a_bad_variant_limit_is_explained(monkeypatch):
    monkeypatch.setenv("TCLANG_MAX_VARIANTS", "lots")
    with pytest.raises(tc.TCError, match="TCLANG_MAX_VARIANTS must be a whole number"):
        tc.define("def f(float(N) A) -> (B) { B(i) = A(i) }")


@pytest.mark.slow
def test_soak_5000_kernels(tmp_path):
    """2,500 distinct sources and one kernel at 2,500 sizes, compiled, then loaded again
    from the disk cache in a second process; the curves go to stdout (pytest -s) and to
    $TCLANG_SOAK_OUT if set. The replay keeps what tclang keeps: it must stay flat (the old
    code grew ~150 MB over each workload's replay)."""
    cold = soak(2500, 250, tmp_path / "cache")
    replay = soak(2500, 250, tmp_path / "cache")
    report = "\n".join(f"{run} {name} {k} {mb:.1f} MB {engines} engines"
                       for run, curves in (("compile", cold), ("replay", replay))
                       for name, curve in curves.items() for k, mb, engines in curve)
    print(report)
    if os.environ.get("TCLANG_SOAK_OUT"):
        Path(os.environ["TCLANG_SOAK_OUT"]).write_text(report + "\n")
    for name in ("sources", "sizes"):
        assert growth(replay[name]) < 30, replay[name]
