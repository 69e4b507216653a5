"""What scheduling hands back to the compiler: the kernel in loop IR and the report of how
it was scheduled.

Why a module of its own, without isl: the middle end schedules in a helper process
(tclang/driver/middle_end.py) and pickles a ScheduledKernel back. Unpickling it imports the
modules its classes live in; here, that is the loop IR and these dataclasses, so the
compiling process never loads islpy (~80 ms of a cold compile) for an answer it only reads.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from polyhedral import loop_ir as L
from polyhedral.bounds_runtime import BoundsCondition

UNTILED = 1 << 30  # a "tile" larger than any loop: the member stays whole


@dataclass
class BandReport:
    """What the passes did to one band, for explain output and tests: `tile` the size of
    each member (UNTILED: kept whole), `indices` the index each member runs over (names
    joined by "/" where statements differ), `reason` why it was tiled so, or not at all."""

    members: int
    tile: tuple[int, ...] | None
    order: tuple[int, ...]
    indices: tuple[str, ...] = ()
    reason: str = ""
    extents: tuple[int | None, ...] = ()  # each member's, where known


@dataclass(frozen=True)
class ScheduledKernel:
    kernel: L.Kernel
    schedule: str  # the final isl schedule tree, as text
    strategy: str  # the fusion strategy that produced it (" + rows": rows fused after it)
    fallback: str | None  # why the requested strategy was not used
    bounds: tuple[BoundsCondition, ...]  # shape-generic kernels: sizes that break a read
    bands: tuple[BandReport, ...] = ()
    timings: dict[str, float] = field(default_factory=dict, compare=False)
    stored_terms: tuple[str, ...] = ()  # temporaries of tclang/lang/passes/stored_terms.py
    # a degraded schedule (polyhedral/scheduler.py): when to try the full one again
    retry_at: float | None = None
