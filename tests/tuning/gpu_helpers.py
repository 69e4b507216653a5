"""Trial functions the GPU worker tests hand to a spawned worker (it imports them by name):
a candidate with unroll=2 kills its worker, one with unroll=4 hangs it; the others are
measured as usual."""

from __future__ import annotations

import os
import signal
import time


def misbehave(task, candidate):
    from tclang.tuning import trials
    unroll = dict(candidate).get("unroll")
    if unroll == 2:
        os.kill(os.getpid(), signal.SIGSEGV)
    if unroll == 4:
        time.sleep(600)
    return trials._measure(task, candidate)


def worker_pid(task, candidate):
    """An 'ok' trial whose message is the worker's pid and start method's mark."""
    import sys
    from tclang.tuning.trials import Trial
    spawned = any("spawn_main" in a or "multiprocessing" in a for a in sys.argv) or \
        "__mp_main__" in sys.modules
    return Trial(candidate, "ok", seconds=1e-3, message=f"{os.getpid()} {spawned}")
