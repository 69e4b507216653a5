"""Timings that hold on a shared machine: interleaved rounds, warm-up, rests, medians.

One implementation for every tool that puts tclang beside a peer (`tclang demo`,
`benchmarks/run.py`): a single "best of five calls, the peer timed right after" told a
user that a 512^3 matmul ran 7.7x faster than NumPy on one run and 0.7x on the next four.
What goes wrong without each rule, measured on the 2-core test machine:

- *Interleaving.* Implementations take turns, one sample each per round, so a burst of
  load from another process hits all of them alike instead of whichever ran then.
- *Warm-up.* Each sample starts with ~50 ms of untimed calls: after a rest this virtual
  machine takes tens of milliseconds to come back to speed (PyTorch's softmax ran 5.6 ms a
  call there against 1.25 after it; tclang's 64 x 128^3 batched matmul 3.6 ms a call over
  its first 25 ms and 1.8 over 60 ms).
- *Rests.* OpenBLAS's threads spin on after a call and slow whatever runs next (a 1024^2
  MLP layer right after NumPy's matmul took 59 ms after a 0.1 s rest, 42 ms after 0.3 s,
  40 ms with no NumPy call before it), so every sample is followed by `gap` seconds of
  sleep and every implementation starts from the same rest.
- *Medians with their spread.* The median of the rounds, and the interquartile range over
  the median beside it, so a reader sees how far to trust a figure; never the best call,
  which rewards whichever implementation was lucky once.

A sample is as many back-to-back calls as take about `least` seconds, the same count for
every implementation (one call for slow kernels), timed after the warm-up.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np


@dataclass
class Timing:
    """The samples of one implementation: seconds per call, one sample per round."""

    samples: list[float] = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(self.samples) if self.samples else float("nan")

    @property
    def spread(self) -> float:
        """The interquartile range over the median (0 with fewer than two samples)."""
        return spread(self.samples)

    def text(self, scale: float = 1e3, digits: int = 2) -> str:
        """'1.23 ±4%': the median (in milliseconds by default) and its spread."""
        return f"{self.median * scale:.{digits}f} ±{self.spread:.0%}"


def spread(samples) -> float:
    """The interquartile range of `samples` over their median: how much a figure moves
    from round to round (0 with fewer than two samples)."""
    if len(samples) < 2:
        return 0.0
    q1, median, q3 = np.percentile(samples, [25, 50, 75])
    return float((q3 - q1) / median) if median > 0 else 0.0


def calls_per_sample(call: Callable[[], object], least: float = 0.02) -> int:
    """Calls for about `least` seconds, from one call's time (at least 1, at most 1000)."""
    start = time.perf_counter()
    call()
    once = max(time.perf_counter() - start, 1e-6)
    return max(1, min(1000, int(least / once)))


def interleaved(calls: dict[str, Callable[[], object]], rounds: int = 9, gap: float = 0.5,
                least: float = 0.02, warm: float = 0.05,
                after_sample: Callable[[str, int], None] | None = None,
                clock: Callable[[], float] = time.perf_counter) -> dict[str, Timing]:
    """Time every call of `calls` in `rounds` interleaved rounds (the module docstring
    says why each rule): per round and call, untimed calls for ~`warm` seconds, then a
    timed sample of as many calls as take ~`least` seconds (counted on the first call of
    `calls`, the same count for every one), then `gap` seconds of rest.
    `after_sample(name, round)` is called after each sample (a progress bar). `clock`:
    `time.thread_time` measures the calling thread's CPU time instead of the wall clock,
    which a busy machine disturbs less, for calls that run on that one thread only."""
    if not calls:
        return {}
    first = next(iter(calls.values()))
    repeats = calls_per_sample(first, least)
    warmups = calls_per_sample(first, warm)
    timings = {name: Timing() for name in calls}
    for k in range(max(1, rounds)):
        for name, call in calls.items():
            for _ in range(warmups):
                call()
            start = clock()
            for _ in range(repeats):
                call()
            timings[name].samples.append((clock() - start) / repeats)
            if gap > 0:
                time.sleep(gap)
            if after_sample is not None:
                after_sample(name, k)
    return timings
