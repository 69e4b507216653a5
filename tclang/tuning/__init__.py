"""Autotuning: the search space of a kernel, isolated timed trials, a cost-model-guided
evolutionary search, the SQLite database of tuned options, and the auto-vs-manual
comparison (docs/tuning.md). The public entry points are `tc.autotune` and `tc.compare`."""
