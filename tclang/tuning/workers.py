"""GPU trials: spawned worker processes, one per device, each holding its own context.

A CPU trial is a forked child (tclang.tuning.trials). A CUDA context does not survive a
fork: a child forked from a process that holds one cannot use the GPU, and a process that
forks children before it makes one has nothing to share. So a GPU backend's trials run in
long-lived workers started with multiprocessing's "spawn" method, one per device (its
`CUDA_VISIBLE_DEVICES` names that device alone), each making its own context on its first
trial and keeping it, its inputs on the device and its compiled code, from one trial to
the next. What a trial does there is what a forked trial does (`trials._measure`: compile,
check against the automatic schedule's outputs, time); only the timing differs: CUDA
events around batches of calls on device arrays (`time_on_device`), where the CPU and the
emulated GPU take the wall clock.

As with forked trials, a crash or a hang costs one trial: a worker that dies is reported
as "crashed" (its signal or exit status), one past the trial's time limit is killed and
reported as "timeout", and the next trial starts a fresh worker. A worker whose context a
kernel broke (an illegal address leaves a CUDA context unusable) reports its trial and
exits. Workers are also replaced every RECYCLE trials: the emulated backend never unloads
a library, and loaded modules add up. They die with the tuner (each watches its parent,
and an exit hook stops them).

`run_gpu_trial(task, candidate, measure)` is what `trials.run_trial` calls for a GPU backend, so
every user of trials (the tuner's local pool, a concurrent.futures executor, a Dask
worker, `tc.compare`) gets GPU trials the same way: a process-wide pool per backend whose
workers are taken one at a time (a trial waits for a free device).

The spawned worker imports the parent's `__main__` module, as every multiprocessing
"spawn" child does: a script that tunes a GPU kernel keeps its work under
`if __name__ == "__main__":` (a worker that dies while it starts says so).
"""

from __future__ import annotations

import atexit
import contextlib
import multiprocessing
import multiprocessing.util  # noqa: F401 - registers its exit hook (it joins children) now
import os
import queue
import signal
import threading
import time

from tclang.tuning.space import Candidate
from tclang.tuning.trial_records import Trial

GPU_BACKENDS = ("cuda", "cuda-emulated")
STARTUP_LIMIT = 180.0  # seconds for a worker to import tclang and say it is ready
RECYCLE = 100  # trials a worker runs before it is replaced by a fresh one


def is_gpu(backend: str) -> bool:
    return backend in GPU_BACKENDS


def device_count(backend: str) -> int:
    """The devices trials of `backend` can run on: every GPU PyCUDA sees (this process's
    CUDA_VISIBLE_DEVICES), or 1 for the emulated GPU (the CPU, whose timings must not
    overlap)."""
    if backend != "cuda":
        return 1
    from backends.cuda.backend import _device
    cuda, _, _ = _device()
    return max(1, cuda.Device.count())


class WorkerFailed(Exception):
    """A worker could not be started, or died or hung in a trial; the text says how."""


class DeviceWorker:
    """One spawned process bound to one device, and the task it holds."""

    def __init__(self, backend: str, device: int, measure):
        self.backend, self.device = backend, device
        # what a trial runs: trials._measure, or a test's; a module-level function (a
        # spawned child imports it by name)
        self.measure = measure
        self.process = None
        self.conn = None
        self.task = None  # the Task the process holds (sent once, not with every trial)
        self.served = 0

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.is_alive()

    def start(self) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.conn, child = ctx.Pipe()
        env = {}
        if self.backend == "cuda":  # this device alone, as device 0 of the worker
            visible = os.environ.get("CUDA_VISIBLE_DEVICES")
            names = [v.strip() for v in visible.split(",")] if visible else None
            env["CUDA_VISIBLE_DEVICES"] = names[self.device] if names and \
                self.device < len(names) else str(self.device)
        # not a daemon: a daemonic process may not start the compiler's helpers through
        # multiprocessing; close_all (an exit hook) stops it instead
        self.process = ctx.Process(target=serve, args=(child, env, self.measure),
                                   name=f"tclang-trials-{self.backend}-{self.device}",
                                   daemon=False)
        with _children_allowed():
            self.process.start()
        child.close()
        self.task, self.served = None, 0
        if not self.conn.poll(STARTUP_LIMIT):
            self.close()
            raise WorkerFailed(f"the trial worker did not start within {STARTUP_LIMIT:g} s")
        try:
            self.conn.recv()  # ("ready", pid)
        except (EOFError, OSError):
            code = self._ended()
            raise WorkerFailed(
                f"the trial worker died while it started ({code}); a script that tunes a "
                "GPU kernel must keep its work under `if __name__ == \"__main__\":`, since "
                "a spawned worker imports the script's module") from None

    def run(self, task, candidate: Candidate, time_limit: float):
        """The Trial of `candidate` (trials.Trial); WorkerFailed if the process died or hung
        (it is then gone, and the next run starts a fresh one)."""
        if not self.alive:
            self.start()
        try:
            if self.task is not task:
                self.conn.send(("task", task))
                self.task = task
            self.conn.send(("trial", candidate))
        except (OSError, BrokenPipeError):
            raise WorkerFailed(f"the trial process died ({self._ended()})") from None
        if not self.conn.poll(time_limit):
            self.close()
            raise TimeoutError(f"no result within {time_limit:g} s (killed)")
        try:
            kind, trial, usable = self.conn.recv()
        except (EOFError, OSError):
            raise WorkerFailed(f"the trial process {self._ended()}") from None
        except Exception as err:  # noqa: BLE001 - a torn reply is a crash of the worker
            self.close()
            raise WorkerFailed(f"the trial process sent a broken reply ({err!r})") from None
        self.served += 1
        if not usable or self.served >= RECYCLE:  # a broken context, or time for a new one
            self.close()
        return trial

    def _ended(self) -> str:
        """How the process ended (it is closed after)."""
        process = self.process
        if process is not None:
            process.join(2.0)
        code = process.exitcode if process is not None else None
        self.close()
        if code is None:
            return "ended"
        if code < 0:
            return f"died of {signal.Signals(-code).name}"
        return f"exited with status {code}"

    def kill(self) -> None:
        """Kill the process now (Ctrl-C in the tuner): its waiter reports a crash."""
        process = self.process
        if process is not None and process.pid is not None:
            with contextlib.suppress(ProcessLookupError, OSError):
                os.kill(process.pid, signal.SIGKILL)

    def close(self) -> None:
        process, conn = self.process, self.conn
        self.process = self.conn = self.task = None
        if conn is not None:
            with contextlib.suppress(OSError):
                conn.close()
        if process is not None:
            if process.is_alive():
                process.kill()
            process.join(5.0)


@contextlib.contextmanager
def _children_allowed():
    """multiprocessing refuses to start a process from a daemonic one (a Pool worker, a
    Dask worker); the worker ends with its parent all the same (`_watch_parent`)."""
    current = multiprocessing.current_process()
    daemon = current._config.get("daemon")
    if daemon:
        current._config["daemon"] = False
    try:
        yield
    finally:
        if daemon:
            current._config["daemon"] = daemon


class DevicePool:
    """The workers of one backend, one per device; a trial takes a free one."""

    def __init__(self, backend: str, devices: int, measure):
        self.backend = backend
        self.workers = [DeviceWorker(backend, k, measure) for k in range(max(1, devices))]
        self.free: queue.Queue = queue.Queue()
        for w in self.workers:
            self.free.put(w)
        self.busy: set = set()
        self.lock = threading.Lock()
        self.broken: str | None = None  # why workers cannot start: said, not retried
        self.failed_starts = 0

    @property
    def size(self) -> int:
        return len(self.workers)

    def run(self, task, candidate: Candidate):
        """One trial on the next free device; a failure of the worker is the trial's."""
        if self.broken:  # two workers in a row died while they started: so will the next
            return Trial(candidate, "crashed", message=self.broken)
        worker = self.free.get()
        with self.lock:
            self.busy.add(worker)
        try:
            starting = not worker.alive
            trial = worker.run(task, candidate, task.time_limit)
            self.failed_starts = 0
            return trial
        except TimeoutError as err:
            return Trial(candidate, "timeout", message=str(err))
        except WorkerFailed as err:
            if starting and not worker.served and "while it started" in str(err):
                self.failed_starts += 1
                if self.failed_starts >= 2:
                    self.broken = str(err)
            return Trial(candidate, "crashed", message=str(err))
        except BaseException:  # Ctrl-C while waiting: the worker's trial is abandoned
            worker.close()
            raise
        finally:
            with self.lock:
                self.busy.discard(worker)
            self.free.put(worker)

    def kill_busy(self) -> None:
        with self.lock:
            busy = list(self.busy)
        for w in busy:
            w.kill()

    def close(self) -> None:
        for w in self.workers:
            w.close()


_pools: dict[str, DevicePool] = {}
_pools_lock = threading.Lock()


def pool(backend: str, measure) -> DevicePool:
    """This process's pool of `backend`'s workers (made on first use), measuring with
    `measure`."""
    with _pools_lock:
        found = _pools.get(backend)
        if found is None:
            found = _pools[backend] = DevicePool(backend, device_count(backend), measure)
        return found


def run_gpu_trial(task, candidate: Candidate, measure):
    """trials.run_trial for a GPU backend: the trial in a spawned worker, which runs
    `measure(task, candidate)` (trials._measure: a module-level function, passed by name)."""
    return pool(task.backend, measure).run(task, candidate)


def kill_running() -> None:
    """Kill every worker that is running a trial of this process (Ctrl-C in the tuner)."""
    with _pools_lock:
        pools = list(_pools.values())
    for p in pools:
        p.kill_busy()


def close_all() -> None:
    """Stop every worker of this process (at exit, and between tests)."""
    with _pools_lock:
        pools = list(_pools.values())
        _pools.clear()
    for p in pools:
        p.close()


# registered after multiprocessing's own hook (imported above), so it runs first: that
# hook joins every non-daemonic child, which a worker only becomes once closed
atexit.register(close_all)


def _forget_pools() -> None:
    """In a forked child: the parent's workers are not the child's (their pipes are the
    parent's); a child that runs GPU trials starts workers of its own."""
    _pools.clear()


os.register_at_fork(after_in_child=_forget_pools)


# ---- in the worker ---------------------------------------------------------------------

def serve(conn, env: dict, measure) -> None:
    """The worker's loop: hold the task, run each candidate's trial, send it back, and say
    whether this process can go on (its CUDA context survived)."""
    os.environ.update(env)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the tuner's to handle
    import faulthandler
    faulthandler.disable()  # a crash is reported as the trial's status, not dumped
    _watch_parent(os.getppid())
    conn.send(("ready", os.getpid()))
    task = None
    while True:
        try:
            kind, payload = conn.recv()
        except (EOFError, OSError):
            return
        if kind == "task":
            task = payload
            _DeviceInputs.forget()
            continue
        try:
            trial = measure(task, payload)
        except Exception as err:  # noqa: BLE001 - measure catches the candidate's own errors
            trial = Trial(payload, "error", message=f"internal error in the trial "
                                                    f"worker: {err!r}")
        conn.send(("trial", trial, _usable(task)))


def _watch_parent(parent: int) -> None:
    """End this worker when the tuner's process ends (killed, crashed), even in the middle
    of a trial. Not PR_SET_PDEATHSIG as a forked trial does: that follows the thread that
    started the process, and a tuner starts its workers from a pool thread that ends with
    the tuning, while the workers serve the next one."""
    def watch():
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, name="tclang-parent-watch", daemon=True).start()


def _usable(task) -> bool:
    """Whether this worker's CUDA context still works (an illegal address in a kernel
    leaves it unusable: every later call would fail)."""
    if task is None or task.backend != "cuda":
        return True
    try:
        import pycuda.driver as cuda
        cuda.Context.synchronize()
        return True
    except Exception:  # noqa: BLE001 - any failure: a fresh worker for the next trial
        return False


class _DeviceInputs:
    """A task's inputs copied to the device once per worker, as PyCUDA GPUArrays (the
    kernels run on them in place, so a timing is the kernel's, not the copies')."""

    task = None
    arrays: tuple = ()

    @classmethod
    def of(cls, task) -> tuple:
        if cls.task is not task:
            import numpy as np

            from backends.cuda.backend import _device
            _device()  # this worker's context, made current (a first trial has none yet)
            from pycuda import gpuarray
            cls.arrays = ()
            cls.arrays = tuple(gpuarray.to_gpu(np.ascontiguousarray(a)) for a in task.inputs)
            cls.task = task
        return cls.arrays

    @classmethod
    def forget(cls) -> None:
        cls.task, cls.arrays = None, ()


def device_inputs(task) -> tuple:
    """The arguments a trial of `task` runs on: device arrays for the GPU, else the host
    arrays themselves (the emulated GPU and the CPU run on host memory)."""
    if task.backend == "cuda":
        return _DeviceInputs.of(task)
    return task.inputs


def to_host(outputs: tuple) -> tuple:
    """Device outputs copied back for the check (host arrays are returned as they are)."""
    return tuple(o.get() if hasattr(o, "get") and hasattr(o, "gpudata") else o
                 for o in outputs)


BATCH_SECONDS = 1e-3  # a timed batch of calls lasts at least this long on the device


def time_on_device(call, min_time: float) -> list[float]:
    """Seconds per call of `call` (a launch on device arrays), from CUDA events around
    batches of calls: after a warm-up call and a synchronize, each batch takes as many
    calls as last BATCH_SECONDS (so the launches queue back to back and the time is the
    device's, not Python's), until `min_time` has passed and at least 3 batches ran."""
    import pycuda.driver as cuda
    call()
    cuda.Context.synchronize()
    start, end = cuda.Event(), cuda.Event()
    start.record()
    call()
    end.record()
    end.synchronize()
    one = max(end.time_since(start) / 1e3, 1e-7)
    calls = max(1, min(1000, int(BATCH_SECONDS / one)))
    times: list[float] = []
    spent, began = 0.0, time.monotonic()
    while len(times) < 3 or (spent < min_time and len(times) < 1000):
        start.record()
        for _ in range(calls):
            call()
        end.record()
        end.synchronize()
        seconds = end.time_since(start) / 1e3
        times.append(seconds / calls)
        spent += seconds
        if time.monotonic() - began > 10 * max(min_time, 1.0):
            break  # a host that cannot keep up: enough samples
    return times


def gpu_lock_name(task) -> str | None:
    """The timing lock of the device a real-GPU trial runs on (its PCI bus id: the same
    file for every process of this user timing on that GPU); None elsewhere."""
    if task.backend != "cuda":
        return None
    from backends.cuda.backend import _device
    _, device, _ = _device()
    try:
        bus = device.pci_bus_id()
    except Exception:  # noqa: BLE001 - an old driver: the visible index is the best name
        bus = os.environ.get("CUDA_VISIBLE_DEVICES", "0")
    return "timing-gpu-" + "".join(c if c.isalnum() else "_" for c in bus) + ".lock"
