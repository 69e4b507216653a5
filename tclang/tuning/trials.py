"""One tuning trial: compile a candidate, check it, time it, in a process of its own.

A candidate can crash the compiler or the kernel (a bug a tuner is good at finding) or run
for ever (a schedule that is legal and hopeless): each trial runs in a child forked with
os.fork (a daemonic worker, such as a Dask worker, may fork too) under a time limit, and a
crash or a hang costs that one trial. A GPU backend's trials run instead in a spawned
worker per device that holds its own CUDA context (tclang.tuning.workers: a context does
not survive a fork), with the same steps and the same statuses. The child:

1. compiles the candidate (a TCScheduleError, e.g. a loop order that breaks a dependence,
   makes the candidate "refused": counted, never timed);
2. runs it once and compares every output with the reference (the automatic schedule's):
   a mismatch is a compiler bug, saved as a reproducer script and reported, never a winner;
   a compile that got the scheduler's fallback (its time limit ran out under load) is
   "degraded": checked but never timed, since its time is not the candidate's;
3. times it under a machine-wide lock (a record lock on `timing.lock` in the user's private
   cache directory): held shared while compiling and exclusively while timing, so compiles
   run in parallel but a timing never overlaps another timing or a compile on the same
   machine, whichever process or Dask worker of this user runs them. Warm-up, then repeats
   until `min_time` has passed (at least 3): the median. On a real GPU the inputs are on
   the device, the time is CUDA events' around batches of calls, and the lock is the
   device's own (`timing-gpu-<bus id>.lock`, held while timing): compiles run on the CPU
   and do not disturb it.

`run_trial(task, candidate)` is a plain function of picklable arguments: what a
`concurrent.futures` executor or a `dask.distributed.Client` runs on its workers.
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import os
import pickle
import select
import signal
import stat
import statistics
import tempfile
import threading
import time
import traceback
import warnings
from pathlib import Path

import numpy as np

from tclang.bfloat16 import is_bfloat16, to_numpy_float32
from tclang.errors import TCWarning
from tclang.runtime.arguments import call_numpy
from tclang.locks import fork_safe
from tclang.tuning.space import Candidate, SearchSpace, describe
from tclang.tuning.trial_records import STATUSES, Task, Trial  # noqa: F401 (STATUSES: T.STATUSES)

def run_trial(task: Task, candidate: Candidate) -> Trial:
    """Run one trial in a forked child under task.time_limit (a GPU backend's: in its
    device's spawned worker); never raises for what the candidate does (crash, hang,
    wrong result, compile error)."""
    check_machine_lock()  # here, not in the child: one warning per process if it fails
    from tclang.tuning import workers
    if workers.is_gpu(task.backend):
        return workers.run_gpu_trial(task, candidate, _measure)
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        code = 0
        try:
            os.close(read_end)
            signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the tuner's to handle
            faulthandler.disable()  # a crash is reported as this trial's status, not dumped
            _die_with_parent()
            trial = _measure(task, candidate)
            with os.fdopen(write_end, "wb") as pipe:
                pickle.dump(trial, pipe)
        except BaseException:  # noqa: BLE001 - the parent learns it from the missing reply
            code = 1
        finally:
            os._exit(code)
    os.close(write_end)
    with _running_lock:
        _running.add(pid)
    try:
        return _wait(pid, read_end, task.time_limit, candidate)
    finally:
        os.close(read_end)
        with _running_lock:
            _running.discard(pid)


_running: set[int] = set()  # trial processes of this process, for kill_running
_running_lock = fork_safe(threading.Lock())


def _forget_running() -> None:
    """In a forked child: the parent's trial processes are not the child's to kill (a
    kill_running() there SIGKILLed the parent's trials, and its waitpid could not reap
    them)."""
    _running.clear()


os.register_at_fork(after_in_child=_forget_running)


def kill_running() -> None:
    """Kill every trial process this process is waiting for (Ctrl-C in the tuner), GPU
    workers in a trial included: their waiters then report them as crashed, and nobody
    uses those reports."""
    with _running_lock:
        pids = list(_running)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    from tclang.tuning import workers
    workers.kill_running()


def _die_with_parent() -> None:
    """Linux: the trial is killed if the tuner dies (killed, timed out), so no orphan
    keeps computing, or holding the machine lock. Elsewhere nothing is done."""
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() == 1:  # the tuner died before the call above
        os._exit(1)


def _wait(pid: int, fd: int, time_limit: float, candidate: Candidate) -> Trial:
    deadline = time.monotonic() + time_limit
    chunks = []
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                return Trial(candidate, "timeout",
                             message=f"no result within {time_limit:g} s (killed)")
            ready, _, _ = select.select([fd], [], [], min(left, 1.0))
            if ready:
                chunk = os.read(fd, 1 << 20)
                if not chunk:
                    break
                chunks.append(chunk)
    except BaseException:  # Ctrl-C in the tuner: the child goes too
        with contextlib.suppress(ProcessLookupError, ChildProcessError):
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        raise
    _, status = os.waitpid(pid, 0)
    if chunks:
        try:
            return pickle.loads(b"".join(chunks))
        except Exception:  # noqa: BLE001 - a torn reply is a crash of the child
            pass
    if os.WIFSIGNALED(status):
        name = signal.Signals(os.WTERMSIG(status)).name
        return Trial(candidate, "crashed", message=f"the trial process died of {name}")
    return Trial(candidate, "crashed",
                 message=f"the trial process exited with status {os.waitstatus_to_exitcode(status)}")


def _measure(task: Task, candidate: Candidate) -> Trial:
    """Compile, check and time one candidate in this process (a forked trial's child, or
    a GPU worker, which runs many: nothing here may outlive the trial)."""
    from tclang.tuning import workers

    with _cold_compile(task.cold_compile):
        return _measure_here(task, candidate, workers)


@contextlib.contextmanager
def _cold_compile(cold: bool):
    """Neither the disk cache nor this process's memory for the compile (to report a cold
    compile's time); the environment is put back after (a GPU worker goes on)."""
    if not cold:
        yield
        return
    from tclang.driver.compiler import forget_compiled
    from tclang.environment import set_for_a_while
    with set_for_a_while(TCLANG_DISK_CACHE="0"):
        forget_compiled()
        yield


def _measure_here(task: Task, candidate: Candidate, workers) -> Trial:
    from tclang.errors import TCError, TCScheduleError
    from tclang.runtime.kernels import define_module

    device = task.backend == "cuda"  # real GPU: device arrays, CUDA events, its own lock
    try:
        options = SearchSpace.options(candidate)
        kernel = define_module(task.source, task.backend, options)[task.entry]
        args = workers.device_inputs(task)  # on a real GPU: on the device, once a task
        with _compile_lock(device):  # compiles together, never during a timing
            start = time.perf_counter()
            compiled = kernel.compile(*args)
            compile_seconds = time.perf_counter() - start
            # (the host's own NumPy call writes bfloat16 outputs where NumPy has none)
            outputs = _as_tuple(compiled(*args)) if device else \
                call_numpy(compiled, task.inputs)
            checked = workers.to_host(outputs)
    except TCScheduleError as err:
        return Trial(candidate, "refused", message=str(err).split("\n")[0])
    except TCError as err:
        return Trial(candidate, "error", message=str(err).split("\n")[0])
    except Exception as err:  # noqa: BLE001 - a compiler bug: reported as such
        return Trial(candidate, "error", message=f"internal error: {err!r}; "
                     + traceback.format_exc(limit=-3).replace("\n", " | ")[-300:])
    if task.reference is not None:
        wrong = mismatch(checked, task.reference)
        if wrong:
            where = _save_reproducer(task, candidate, wrong)
            return Trial(candidate, "wrong", compile_seconds=compile_seconds,
                         message=f"{wrong} (a compiler bug; reproducer: {where})")
    if compiled.degraded:  # checked above all the same: a wrong result is a bug either way
        return Trial(candidate, "degraded", compile_seconds=compile_seconds,
                     message="not timed: compiled on the scheduler's fallback "
                             f"({compiled.fallback}), not on this candidate's schedule")
    outs = outputs if len(outputs) > 1 else outputs[0]
    try:
        if device:
            with machine_lock(exclusive=True, name=workers.gpu_lock_name(task)):
                times = workers.time_on_device(lambda: compiled(*args, out=outs),
                                               task.min_time)
        else:
            with machine_lock(exclusive=True):
                times = time_calls(lambda: compiled(*args, out=outs), task.min_time)
    except TCError as err:  # a launch that fails when timed (the device ran out)
        return Trial(candidate, "error", compile_seconds=compile_seconds,
                     message=str(err).split("\n")[0])
    median = statistics.median(times)
    q = np.percentile(times, [25, 75])
    return Trial(candidate, "ok", seconds=median, compile_seconds=compile_seconds,
                 spread=float((q[1] - q[0]) / median) if median else 0.0)


def _compile_lock(device: bool):
    """The machine lock, shared, while a candidate compiles and runs once: a CPU (or
    emulated GPU) timing waits for it. A real GPU's timing does not (a compile runs on the
    CPU), so its trials take none."""
    return contextlib.nullcontext() if device else machine_lock(exclusive=False)


def time_calls(call, min_time: float) -> list[float]:
    """Wall-clock seconds of calls: a warm-up (caches, pages, the thread pool), then calls
    until `min_time` has passed and at least 3 were made."""
    call()
    times: list[float] = []
    spent = 0.0
    while len(times) < 3 or (spent < min_time and len(times) < 1000):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
        spent += times[-1]
    return times


def _as_tuple(result) -> tuple:
    return tuple(result) if isinstance(result, (tuple, list)) else (result,)


def mismatch(outputs: tuple, reference: tuple) -> str:
    """'' if the outputs agree with the reference within rounding, else what differs."""
    for k, (out, ref) in enumerate(zip(outputs, reference)):
        out, ref = np.asarray(out), np.asarray(ref)
        if out.shape != ref.shape:
            return f"output {k} has shape {out.shape}, not {ref.shape}"
        narrow = is_bfloat16(ref.dtype)
        if narrow:  # compared as float32 values; a flip of the last of 8 bits is rounding
            out, ref = to_numpy_float32(out), to_numpy_float32(ref)
        if not np.issubdtype(ref.dtype, np.floating):
            if not np.array_equal(out, ref):
                return f"output {k} differs from the automatic schedule's"
            continue
        if not np.array_equal(np.isnan(out), np.isnan(ref)):
            return f"output {k} has NaN where the automatic schedule's has none (or back)"
        finite = np.isfinite(ref)
        scale = float(np.max(np.abs(ref[finite]), initial=0.0)) or 1.0
        # reductions may be reordered by either schedule: rounding differs, nothing more
        tolerance = (1.6e-2 if narrow else 1e-3 if ref.dtype.itemsize <= 4 else 1e-9) * scale
        error = float(np.max(np.abs(out[finite] - ref[finite]), initial=0.0))
        if error > tolerance or not np.array_equal(out[~finite], ref[~finite]):
            return f"output {k} differs from the automatic schedule's by {error:.3g}"
    return ""


def _save_reproducer(task: Task, candidate: Candidate, what: str) -> str:
    """A script that shows the mismatch: the source, the options, the inputs' shapes."""
    folder = Path(task.reproducer_dir) if task.reproducer_dir else _reproducer_folder()
    folder.mkdir(parents=True, exist_ok=True)
    options = SearchSpace.options(candidate).to_dict()
    stamp = f"{int(time.time())}-{os.getpid()}"
    path = folder / f"wrong-{task.entry}-{stamp}.py"
    inputs = [(a.shape, str(a.dtype)) for a in task.inputs]
    np.savez(folder / f"wrong-{task.entry}-{stamp}.npz", *task.inputs)
    path.write_text(f'''"""A tuning candidate whose result differed from the automatic schedule's:
{what}. Options: {describe(candidate)}. Please report it with this file."""
import numpy as np
import tclang as tc

SOURCE = {task.source!r}
OPTIONS = tc.Options(**{json.dumps(options)})
saved = np.load({str(path.with_suffix(".npz"))!r})
inputs = [saved[f"arr_{{k}}"] for k in range({len(inputs)})]  # {inputs}
expected = tc.define(SOURCE, {task.backend!r})[{task.entry!r}](*inputs)
got = tc.define(SOURCE, {task.backend!r}, OPTIONS)[{task.entry!r}](*inputs)
for e, g in zip(expected if isinstance(expected, tuple) else (expected,),
                got if isinstance(got, tuple) else (got,)):
    print("max difference", np.max(np.abs(np.asarray(e, np.float64) - g)))
''')
    return str(path)


def _reproducer_folder() -> Path:
    """`tuning-bugs` in the user's private cache directory; where that is refused, a fresh
    private temporary directory (never a fixed name in /tmp, which another user could have
    made or pointed elsewhere with a symlink)."""
    from tclang.driver.diskcache import cache_dir
    try:
        return Path(cache_dir()) / "tuning-bugs"
    except OSError:
        return Path(tempfile.mkdtemp(prefix="tclang-tuning-bugs-"))


LOCK_NAME = "timing.lock"
_lock_warned = False  # the lock could not be used and this process said so


@contextlib.contextmanager
def machine_lock(exclusive: bool, name: str | None = None):
    """A machine-wide reader-writer lock (a record lock on one file for the user): a trial
    holds it shared while it compiles and exclusively while it times, so timings never
    overlap each other or another trial's compile, on this machine, whichever process runs
    them. Without a usable lock file (see `_open_lock`) trials run unlocked, after one
    warning.

    POSIX record locks (lockf), not flock: a compile forks helper processes (the scheduler,
    the LLVM optimizer) that would inherit an flock and keep it after the trial released
    it; a record lock belongs to the process that took it and is never inherited.

    `name`: another lock file in the same directory (a GPU's own: see workers.gpu_lock_name)."""
    import fcntl
    fd = _open_lock(name or LOCK_NAME)
    if fd is None:
        yield
        return
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        yield
    finally:
        os.close(fd)  # releases the lock


def check_machine_lock() -> None:
    """Open the lock file once and close it: warns (once per process) if it is unusable,
    before trials fork, so their children do not each say it again."""
    fd = _open_lock()
    if fd is not None:
        os.close(fd)


def _open_lock(name: str = LOCK_NAME) -> int | None:
    """`timing.lock` in the private cache directory (tclang.driver.diskcache.cache_dir: created
    0700, refused if others could write it), opened without following a symlink, not
    inherited by programs a compile runs, and refused unless it is a regular file of this
    user's: a fixed name in /tmp let another user hold the lock (every trial timed out) or
    plant a symlink (tclang created a file where it pointed). None, after one warning,
    when there is no such file: running without the lock is only less exact."""
    from tclang.driver.diskcache import cache_dir
    path = name
    try:
        path = os.path.join(cache_dir(), name)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as err:  # including an untrusted cache directory; ELOOP: a symlink
        _no_lock(path, str(err) if err.strerror is None else err.strerror)
        return None
    info = os.fstat(fd)
    if info.st_uid != os.getuid() or not stat.S_ISREG(info.st_mode):
        os.close(fd)
        _no_lock(path, f"not a regular file of this user (uid {info.st_uid})")
        return None
    return fd


def _no_lock(path: str, reason: str) -> None:
    """Warn that trials run unlocked, once per process (a trial's child inherits that it
    was said)."""
    global _lock_warned
    if _lock_warned:
        return
    _lock_warned = True
    warnings.warn(TCWarning(f"the tuning timing lock {path} cannot be used ({reason}): "
                            "trials run without it, so a timing may overlap another "
                            "trial's compile or timing on this machine"), stacklevel=5)
