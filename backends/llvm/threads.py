"""The thread pool behind the generated code's `parallel_for`, and Ctrl-C during a call.

Generated code calls `parallel_for(task, ctx, lo, hi)` for an outermost parallel loop with
enough work. The pool splits [lo, hi) into one contiguous chunk per worker and calls the
task on each through ctypes, which releases the GIL for the native call: the chunks run in
parallel on all cores. The calling thread runs the first chunk itself. Worker count:
`TCLANG_NUM_THREADS`, else the CPUs this process may run on (os.sched_getaffinity).

Ctrl-C: `parallel_for` is a ctypes callback, and an exception raised in a callback is
printed and dropped by ctypes, while the native code goes on (and the workers still write).
So `call` defers SIGINT while the main thread is in a kernel: the signal is only recorded,
every chunk already started is waited for, the rest of the call's parallel loops are
skipped (Ctrl-C is prompt), and once the native call has returned the signal is raised
again for the handler it was meant for: KeyboardInterrupt, never a half-written result.

A process forked from this one has none of the pool's threads: it starts a pool of its own.
"""

from __future__ import annotations

import ctypes
import functools
import os
import threading
from concurrent.futures import ThreadPoolExecutor

from tclang.target import available_cores

try:  # the C functions under `signal`, without its enum conversions (30 us a call -> 1 us)
    import _signal as signal
except ImportError:  # not CPython
    import signal  # type: ignore[no-redef]

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


os.register_at_fork(after_in_child=_pool.cache_clear)  # the parent's threads are not here


class _Call(threading.local):
    """The kernel call of this thread: whether Ctrl-C came during it, and whether its
    remaining parallel loops may then be skipped (KeyboardInterrupt follows)."""
    interrupted = False
    skip_when_interrupted = False


_call = _Call()


def call(function, *args):
    """function(*args) with SIGINT deferred to its return (in the main thread, where Python
    runs signal handlers; a Ctrl-C then reaches the handler the program had)."""
    if threading.current_thread() is not threading.main_thread():
        return function(*args)
    previous = signal.getsignal(signal.SIGINT)
    if not callable(previous):  # ignored, default action, or a handler not set from Python
        return function(*args)
    _call.interrupted = False
    _call.skip_when_interrupted = previous is signal.default_int_handler
    signal.signal(signal.SIGINT, _record_interrupt)
    try:
        return function(*args)
    finally:
        signal.signal(signal.SIGINT, previous)
        if _call.interrupted:
            _call.interrupted = _call.skip_when_interrupted = False
            signal.raise_signal(signal.SIGINT)


def _record_interrupt(signum, frame) -> None:
    _call.interrupted = True


def _skipping() -> bool:
    return _call.interrupted and _call.skip_when_interrupted


def _chunk(task, ctx: int, lo: int, hi: int) -> None:
    task(ctx, lo, hi)


class _Helpers:
    """The chunks given to pool threads, which start none once the caller was interrupted:
    after `join` no thread runs a chunk of this loop, and none will."""

    def __init__(self, task, ctx: int, bounds: list[int]):
        self.task, self.ctx, self.bounds = task, ctx, bounds
        self.done = threading.Condition()
        self.pending, self.closed = len(bounds) - 2, False

    def run(self, k: int) -> None:
        with self.done:
            if self.closed:
                self.pending -= 1
                self.done.notify_all()
                return
        try:
            _chunk(self.task, self.ctx, self.bounds[k], self.bounds[k + 1])
        finally:
            with self.done:
                self.pending -= 1
                self.done.notify_all()

    def join(self) -> None:
        with self.done:
            self.closed = _skipping()
            while self.pending:
                self.done.wait()


def _parallel_for(task_address: int, ctx: int, lo: int, hi: int) -> None:
    if _skipping():
        return
    task = _task(task_address)
    workers = min(available_cores(), hi - lo)
    bounds = [lo + (hi - lo) * k // workers for k in range(workers + 1)]
    helpers = _Helpers(task, ctx, bounds)
    for k in range(1, workers):
        _pool().submit(helpers.run, k)
    _chunk(task, ctx, bounds[0], bounds[1])
    helpers.join()


_callback = PARALLEL_FOR(_parallel_for)  # kept alive for the life of the process


def parallel_for_address() -> int:
    """What kernels receive as `parallel_for`; 0 (run serially) with one core."""
    if available_cores() <= 1:
        return 0
    return ctypes.cast(_callback, ctypes.c_void_p).value
