"""The thread pool behind the generated code's `parallel_for`.

Generated code calls `parallel_for(task, ctx, lo, hi)` for an outermost parallel loop with
enough work. The pool splits [lo, hi) into one contiguous chunk per worker and calls the
task on each through ctypes, which releases the GIL for the native call: the chunks run in
parallel on all cores. The calling thread runs the first chunk itself. Worker count:
`TCLANG_NUM_THREADS`, else the CPUs this process may run on (os.sched_getaffinity).
"""

from __future__ import annotations

import ctypes
import functools
import threading
from concurrent.futures import ThreadPoolExecutor

from tclang.target import available_cores

TASK = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64)
PARALLEL_FOR = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                                ctypes.c_int64)


@functools.lru_cache(maxsize=256)
def _task(address: int):
    """The callable for an outlined loop body. A wrapper is its address and nothing more,
    so one cached for the code of a freed engine is still right for whatever code is at
    that address now; the bound only keeps the cache from growing with every kernel."""
    return TASK(address)


@functools.lru_cache(maxsize=1)
def _pool() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=max(1, available_cores() - 1),
                              thread_name_prefix="tclang")


workers_seen: set[int] = set()  # thread ids that ran a chunk (for tests and explain)


def _chunk(task, ctx: int, lo: int, hi: int) -> None:
    workers_seen.add(threading.get_ident())
    task(ctx, lo, hi)


def _parallel_for(task_address: int, ctx: int, lo: int, hi: int) -> None:
    task = _task(task_address)
    workers = min(available_cores(), hi - lo)
    bounds = [lo + (hi - lo) * k // workers for k in range(workers + 1)]
    futures = [_pool().submit(_chunk, task, ctx, bounds[k], bounds[k + 1])
               for k in range(1, workers)]
    _chunk(task, ctx, bounds[0], bounds[1])
    for f in futures:
        f.result()


_callback = PARALLEL_FOR(_parallel_for)  # kept alive for the life of the process


def parallel_for_address() -> int:
    """What kernels receive as `parallel_for`; 0 (run serially) with one core."""
    if available_cores() <= 1:
        return 0
    return ctypes.cast(_callback, ctypes.c_void_p).value
