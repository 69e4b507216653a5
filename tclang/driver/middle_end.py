"""The polyhedral middle end of a compile, run in a helper process that is replaced every
MIDDLE_END_MAX_COMPILES compilations: what keeps a compiling process's memory flat.

islpy leaks native memory on every call that hands an isl object to a function that takes
it (isl's `__isl_take`: union, intersect, coalesce, compute_flow, most of what a compile
does). Its generated wrapper copies such an argument into a new C++ wrapper object, passes
the copy to isl and then lets go of the wrapper without deleting it (islpy's gen_wrap.py,
`auto_arg_....release()`, as of islpy 2026.2): 32 bytes of heap per argument, plus a
count on the isl context that never drops again (so no context such a call touched is ever
freed: polyhedral/isl_context.py). A compilation makes hundreds of these calls: ~4 KB for
a two-statement kernel, ~25 KB for a matmul, an MLP layer or a softmax, for as long as the
process compiles (measured: 4.3 KB a kernel over 2,000 distinct two-statement kernels,
linear). Nothing in Python can free that memory; a process gives it back by ending.

So `compile_definition` schedules in a forked helper (tclang/forked_server.py): it sends
the checked definition, sizes, options, target and layouts, pickled, with its TCLANG_*
environment (the middle end reads TCLANG_VERIFY), and gets the ScheduledKernel back. An
exception raised there is raised here as the same exception. Ctrl-C kills the helper (isl
cannot be interrupted in a call; now the compile can). The work stays in this process
where no process can be forked, where TCLANG_DUMP names a polyhedral stage (the dumps go
to this process's stderr), and where the request or the answer cannot be pickled (computed
here again: the exact result or exception); explain and export schedule here too, once
for the asking (tclang/runtime/kernels.py, tclang/export/cuda.py).

The helper is forked from this process: it runs the code this process had at that moment.
A test that patches a polyhedral module stops it before and after (`stop`).
"""

from __future__ import annotations

import importlib
import os
import pickle
import signal
import sys
import traceback

from tclang import budget as compile_budget
from tclang.errors import TCCompileError, TCError
from tclang.forked_server import (ForkedServer, RequestFailed, ServerDied, ServerError,
                                  ServerUnavailable)
from tclang.stages import Stages, requested

MIDDLE_END_MAX_COMPILES = 200
"""Compilations one helper runs before it is replaced: it grows by islpy's leak (~5 MB
over 200 matmul compilations), then gives it all back. A fork costs a few milliseconds
(the helper's own scheduling process is forked again with it), nothing over 200 compiles."""

POLYHEDRAL_STAGES = frozenset(("passes", "scop", "dependences", "schedule", "transform",
                               "loops"))


def schedule(defn, sizes, options, target, layouts, meanwhile=None):
    """polyhedral.pipeline.schedule_stages(defn, sizes, options, target, layouts, stages)
    inside the compile's budget (open: the compile door's), run in the helper process (in
    this one where it cannot be, see the module's docstring). `meanwhile()` runs in this
    process while the helper schedules (ForkedServer.call)."""
    def inline():
        from polyhedral.pipeline import STAGE_FAILURES, schedule_stages
        return schedule_stages(defn, sizes, options, target, layouts,
                               Stages(defn.name, STAGE_FAILURES))

    if requested() & POLYHEDRAL_STAGES:
        return inline()
    if _helper.pid is None and _threaded():  # see _threaded: the helper inherits it
        importlib.import_module("polyhedral.pipeline")
    environment = {k: v for k, v in os.environ.items() if k.startswith("TCLANG_")}
    try:
        request = pickle.dumps((defn, sizes, options, target, layouts, environment,
                                compile_budget.handed_over()),
                               protocol=pickle.HIGHEST_PROTOCOL)
    except (pickle.PicklingError, TypeError, AttributeError, RecursionError):
        return inline()
    try:
        answer = _helper.call(request, meanwhile=meanwhile)
    except (ServerUnavailable, RequestFailed):  # no helper, or its own code failed: here
        return inline()
    except ServerDied as died:  # twice in a row: the server tried a fresh process once
        if died.signal == signal.SIGKILL:  # the OOM killer, not isl: nothing to report
            raise TCCompileError(
                f"{died} while scheduling {defn.name}: out of memory? (the OOM killer ends "
                "processes with SIGKILL; `dmesg` says whether it did) Free memory, or split "
                "the definition into smaller ones") from None
        raise TCCompileError(f"{died} while scheduling {defn.name} (the polyhedral "
                             "middle end): please report it with the definition") from None
    except ServerError as failure:  # isl crashed (an abort, a signal) or was killed
        raise TCCompileError(f"{failure} while scheduling {defn.name} (the polyhedral "
                             "middle end): please report it with the definition") from None
    try:
        status, payload = pickle.loads(answer)
    except Exception:  # noqa: BLE001 - a class that does not load back: computed here
        return inline()
    if status == "ok":
        compile_budget.take_back(payload)
        return payload
    if status == "raised":
        error, where = payload
        if not isinstance(error, TCError) and hasattr(error, "add_note"):  # a bug: where
            error.add_note(f"raised in the middle end's process:\n{where}")  # (3.11+)
        raise error
    return inline()  # "unpicklable": the result or the exception, made again here


def start() -> None:
    """Fork the helper now, if none runs: it imports isl and the polyhedral layer (~80 ms)
    while this process still parses and checks the source (tc.define calls this before it
    parses). This process then never imports them for a compile: the answer it unpickles
    is loop IR (polyhedral/scheduled.py). Nothing happens where TCLANG_DUMP asks for a
    polyhedral stage (scheduled here) or no process can be forked (the first compile
    schedules here)."""
    if requested() & POLYHEDRAL_STAGES or _threaded():
        return
    try:
        _helper.start()
    except ServerUnavailable:
        pass


def _threaded() -> bool:
    """Whether other Python threads run in this process. A child forked while another
    thread imports a module waits for that module's lock for ever (its holder does not
    exist in the child), and the helper imports the polyhedral layer after the fork: so
    where other threads run, the helper is forked at the first compile, after this process
    imported that layer itself (`schedule`), and imports nothing."""
    return len(sys._current_frames()) > 1


def stop() -> None:
    """End the helper now (the next compile forks a new one): for tests whose patches
    must reach the process that runs them, and leave with them."""
    if _helper.pid is not None:
        _helper._stop()


def _answer(request: bytes) -> bytes:
    """In the helper: (status, payload) pickled; "ok" with the ScheduledKernel, "raised"
    with the exception and its traceback, "unpicklable" when neither can be sent."""
    from polyhedral.pipeline import STAGE_FAILURES, schedule_stages
    defn, sizes, options, target, layouts, environment, budget = pickle.loads(request)
    _use_environment(environment)
    try:
        with compile_budget.continuing(budget):  # the compiler's deadline, continued
            stages = Stages(defn.name, STAGE_FAILURES)
            answer = ("ok", schedule_stages(defn, sizes, options, target, layouts, stages))
    except Exception as err:  # noqa: BLE001 - raised again in the compiler's process
        answer = ("raised", (err, traceback.format_exc()))
    try:
        return pickle.dumps(answer, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:  # noqa: BLE001 - the caller computes it again in its process
        return pickle.dumps(("unpicklable", None))


def _use_environment(environment: dict[str, str]) -> None:
    """The caller's TCLANG_* variables now, not those of the moment of the fork."""
    for name in [n for n in os.environ if n.startswith("TCLANG_")]:
        if name not in environment:
            del os.environ[name]
    os.environ.update(environment)


def _prepare() -> None:
    """In each new helper: room on the stack for the deepest definition the parser
    accepts, for good (this process only schedules, on one thread); and the processes it
    forks (isl's scheduler, polyhedral/scheduler.py) are killed with it."""
    from tclang.lang.parser import FRAMES_PER_LEVEL, MAX_HEIGHT
    sys.setrecursionlimit(max(sys.getrecursionlimit(), FRAMES_PER_LEVEL * MAX_HEIGHT + 1000))
    helper = os.getpid()
    os.register_at_fork(after_in_child=lambda: _die_with(helper))
    importlib.import_module("polyhedral.pipeline")  # isl and the passes, before a request


def _die_with(parent: int) -> None:
    """In a process this helper forked: SIGKILL when the helper ends. Ctrl-C kills the
    helper, maybe while its scheduling process runs a blown-up ILP that would otherwise go
    on for minutes (isl cannot be interrupted; the 1-second parent check of
    tclang/forked_server.py runs only between requests). Linux only (prctl); elsewhere
    that check is all there is."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes
    import signal
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # it ended before the prctl
        os._exit(0)


_helper = ForkedServer(_answer, "polyhedral middle end", max_requests=MIDDLE_END_MAX_COMPILES,
                       prepare=_prepare)
