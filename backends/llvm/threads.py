"""The native thread pool behind the generated code's `parallel_for`: loading it, sizing it,
fork, and what Ctrl-C does during a parallel call.

The pool is native code (parallel_runtime.py builds its LLVM IR), linked into the process
once (loading.py) and kept as long as the process. No Python runs while a
parallel loop runs: helper threads take chunks from an atomic counter and the calling
thread works beside them. Helpers: `TCLANG_NUM_THREADS` - 1, else the CPUs this process may
run on (os.sched_getaffinity) - 1; they start on the first parallel loop.

Ctrl-C: helpers block every signal, so SIGINT reaches Python's handler on the thread that
runs Python, which only records it while native code runs; `parallel_for` joins every
helper before it returns, so the KeyboardInterrupt comes after the call, with no thread
still writing: never a half-written result.

fork: a child has none of the parent's threads; `tclang_pool_forget` runs in it (an
os.register_at_fork hook) and its first parallel loop starts a pool of its own.
"""

from __future__ import annotations

import ctypes
import os
import threading

from backends.llvm.loading import LoadedCode
from tclang.locks import fork_safe
from tclang.machine import available_cores

_lock = fork_safe(threading.Lock())
_runtime: dict[str, int] | None = None  # symbol -> address, once loaded
_kept: list[LoadedCode] = []  # its code runs until the process exits
_EXPORTED = ("tclang_parallel_for", "tclang_pool_configure", "tclang_pool_forget",
             "tclang_pool_stats", "tclang_call")
_LIBC_FUNCTIONS = ("pthread_mutex_init", "pthread_mutex_lock", "pthread_mutex_unlock",
                   "pthread_cond_init", "pthread_cond_wait", "pthread_cond_broadcast",
                   "pthread_create", "pthread_detach", "sigfillset", "pthread_sigmask")


def runtime_object() -> bytes:
    """The runtime module's object code for this host (codegen.runtime_object, made in the
    optimizer process); every kernel's artifact carries a copy, so a disk-cache hit loads
    it without LLVM."""
    from backends.llvm import jit
    return jit.runtime_object()


def _load(object_code: bytes | None) -> dict[str, int]:
    """Link the runtime for the life of the process (its threads run its code until the
    process exits), from `object_code` when given, else from its IR."""
    global _runtime
    with _lock:
        if _runtime is None:
            loaded = LoadedCode(object_code or runtime_object(), _EXPORTED, _LIBC_FUNCTIONS)
            _kept.append(loaded)
            addresses = dict(loaded.addresses)
            ctypes.CFUNCTYPE(None, ctypes.c_int64)(addresses["tclang_pool_configure"])(
                max(0, available_cores() - 1))
            _runtime = addresses
        return _runtime


def _forget_in_child() -> None:
    if _runtime is not None:
        ctypes.CFUNCTYPE(None)(_runtime["tclang_pool_forget"])()


os.register_at_fork(after_in_child=_forget_in_child)  # the parent's threads are not here


def resident(object_code: bytes | None = None) -> dict[str, int]:
    """The runtime's addresses, linked on first use from `object_code` (the runtime's, if
    the caller has it; runtime_object() otherwise)."""
    return _runtime or _load(object_code)


def parallel_for_address(object_code: bytes | None = None) -> int:
    """What kernels receive as `parallel_for`; 0 (run serially) with one core."""
    if available_cores() <= 1:
        return 0
    return resident(object_code)["tclang_parallel_for"]


def statistics() -> dict[str, int]:
    """Counts since the process started: parallel loops run on the pool, and the chunks of
    loops run by their calling thread and by helper threads (for tests and diagnostics)."""
    if _runtime is None:
        return {"loops": 0, "caller_chunks": 0, "helper_chunks": 0}
    counts = (ctypes.c_int64 * 3).from_address(_runtime["tclang_pool_stats"])
    return {"loops": counts[0], "caller_chunks": counts[1], "helper_chunks": counts[2]}
