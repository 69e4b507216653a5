"""Ctrl-C at random moments of cold compiles, run as a script (tests/e2e/test_interrupts_fork.py).

    python -m tests.e2e.random_interrupts compile SEED COUNT MAX_DELAY [FROM]
    python -m tests.e2e.random_interrupts check COUNT

`compile`: for each of the first COUNT corpus cases, SIGINT after a delay drawn from
[0, MAX_DELAY) seconds (seeded) while the case compiles for the CPU, counted from the
start of the compile or, with FROM = "loops", from the start of the loops stage (isl's
AST builder calling Python for each loop: where the interrupts did their harm); then the
case is compiled again, with no interrupt, and its result compared with NumPy's. A compile
may finish or raise KeyboardInterrupt; any other exception is counted as lost. It prints
one JSON line. `check`, in another process on the same cache directory: every case runs from
what the first process cached, right. A crash (SIGSEGV, glibc's heap checks) shows as the
process's exit status: that is why these are scripts.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sys
import warnings

import tclang as tc
from tests import corpus


def _settle() -> None:
    """A Python call: Python runs a pending signal handler at the next one at the latest."""


class _Timers:
    """The SIGINT of the compile under way, after a random delay counted from now or from
    the start of the loops stage. A kernel timer (SIGALRM) marks the moment, and its
    handler sends SIGINT at once: Python runs both handlers where the main thread runs
    Python next, as it runs a terminal's Ctrl-C, inside an isl callback if isl is working.
    (A Python thread sending SIGINT needs the GIL, which the compiling thread holds while
    isl works: its signals came between isl's calls, hardly ever inside one.)"""

    def __init__(self, rng: random.Random, max_delay: float):
        self.rng, self.max_delay = rng, max_delay
        self.armed = False  # whether the loops stage starts one
        signal.signal(signal.SIGALRM, lambda signum, frame: signal.raise_signal(signal.SIGINT))

    def start(self) -> None:
        signal.setitimer(signal.ITIMER_REAL, max(1e-6, self.rng.uniform(0, self.max_delay)))

    def stop(self) -> None:
        signal.setitimer(signal.ITIMER_REAL, 0)
        _settle()  # a SIGALRM just before is handled here, in the caller's try


def _started_by_loops(timers: _Timers) -> None:
    from polyhedral import pipeline
    real = pipeline.lower_to_loops

    def lower_to_loops(*args, **kwargs):
        if timers.armed:
            timers.start()
        return real(*args, **kwargs)
    pipeline.lower_to_loops = lower_to_loops


def compile_interrupted(seed: int, count: int, max_delay: float, start: str) -> dict:
    timers = _Timers(random.Random(seed), max_delay)
    if start == "loops":
        _started_by_loops(timers)
    warm = corpus.CASES_BY_NAME["fcrelu_mlp2"]  # islpy, LLVM and both helpers loaded
    corpus.run_case(warm, warm.shapes[0], "cpu")
    outcome = {"interrupted": 0, "finished": 0, "lost": []}
    for case in corpus.CASES[:count]:
        inputs = corpus.make_inputs(case, case.shapes[0])
        try:
            try:
                if start == "loops":
                    timers.armed = True
                else:
                    timers.start()
                tc.define(case.source, backend="cpu")[case.entry].compile(*inputs)
            finally:
                timers.armed = False
                timers.stop()
            outcome["finished"] += 1
        except KeyboardInterrupt:
            outcome["interrupted"] += 1
        except Exception as err:  # noqa: BLE001 - the interrupt turned into something else
            outcome["lost"].append(f"{case.name}: {type(err).__name__}: {err}")
        kernel = tc.define(case.source, backend="cpu")[case.entry]
        corpus.assert_close(*corpus.check_call(case, kernel, inputs), case)
    return outcome


def check_cached(count: int) -> dict:
    """Every case from the disk cache (or the call records) of the interrupted run."""
    for case in corpus.CASES[:count]:
        inputs = corpus.make_inputs(case, case.shapes[0])
        kernel = tc.define(case.source, backend="cpu")[case.entry]
        corpus.assert_close(*corpus.check_call(case, kernel, inputs), case)
    return {"checked": count}


if __name__ == "__main__":
    warnings.simplefilter("ignore", tc.TCWarning)  # the corpus's case that warns
    if sys.argv[1] == "compile":
        result = compile_interrupted(int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]),
                                     sys.argv[5] if len(sys.argv) > 5 else "compile")
    else:
        result = check_cached(int(sys.argv[2]))
    print(json.dumps(result), flush=True)
