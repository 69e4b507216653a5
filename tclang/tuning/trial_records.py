"""A tuning trial's records: what every trial of one tuning needs (`Task`) and what one
trial found (`Trial`). Plain data, shared by the forked trials (trials.py) and the GPU
workers that run them in spawned processes (workers.py), neither of which imports the other
for them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from tclang.tuning.space import Candidate

STATUSES = ("ok", "refused", "wrong", "error", "crashed", "timeout", "degraded")
""""degraded": the candidate compiled on the scheduler's fallback (its time limit ran out
on a loaded machine, or its process died: CompiledKernel.degraded), so what would be timed
is not the candidate's schedule; never timed, never a best."""


@dataclass(frozen=True)
class Task:
    """What every trial of one tuning needs (picklable: it travels to executor workers)."""

    source: str
    entry: str
    backend: str
    inputs: tuple
    reference: tuple | None  # the automatic schedule's outputs; None: nothing to check
    time_limit: float = 60.0  # seconds for the whole trial: compile, check and timing
    min_time: float = 0.2  # seconds of timed runs (after warm-up)
    reproducer_dir: str | None = None
    cold_compile: bool = False  # compile without the disk cache (to report compile time)


@dataclass
class Trial:
    candidate: Candidate
    status: str  # one of STATUSES
    seconds: float | None = None  # median time of one call
    compile_seconds: float | None = None
    message: str = ""
    spread: float | None = None  # interquartile range / median of the timed calls
    host: str = field(default_factory=lambda: os.uname().nodename)

    @property
    def ok(self) -> bool:
        return self.status == "ok"
