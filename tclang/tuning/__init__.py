"""Autotuning: the search space of a kernel, isolated timed trials, a cost-model-guided
evolutionary search, the SQLite database of tuned options, and the auto-vs-manual
comparison (docs/tuning.md)."""

from __future__ import annotations


def autotune(kernel, *args, **kwargs):
    """tc.autotune: see tclang.tuning.search.autotune."""
    from tclang.tuning.search import autotune as run
    return run(kernel, *args, **kwargs)
