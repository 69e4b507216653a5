"""A forked helper process that answers requests: work that may run away (isl's scheduler)
or that leaks native memory (llvmlite's optimizer) runs there, not in the compiler's process.

Guarantees, for every user of ForkedServer:
- The process is forked with os.fork, not multiprocessing.Process: a daemonic process (a
  multiprocessing.Pool worker) may not have multiprocessing children, and a Process object
  belongs to the process that started it.
- Each request carries an id, and replies to earlier requests are dropped: a reply to a
  request the compiler gave up (Ctrl-C while it waited) never answers another request.
- On any BaseException while waiting (time limit, Ctrl-C, the process died) the process is
  killed and reaped; the next request forks a new one.
- A process that dies while it works (the OOM killer's SIGKILL, a crash) is replaced and
  the request sent once more to a fresh one, within what is left of its time limit: a
  memory spike elsewhere on the machine costs one retry, not the compile. A second death
  is ServerDied, which says how the process ended (signal or exit status).
- Ctrl-C reaches the whole process group: the helper ignores it, the compiler decides.
- A Ctrl-C that lands during the fork is raised in the compiler once the helper is known
  (tclang/ctrl_c.py: Python dropped it inside the at-fork hooks).
- The helper ends with the compiler's process: it closes its copy of the parent's end of
  the pipe (else no EOF ever comes) and checks its parent every second (a process forked
  later from the parent may hold that end too). A leftover helper would hold the caller's
  stdout open: a CI job would wait for it.
- A process forked from the compiler (os.fork, a "fork" Pool) starts with no helper of its
  own: it forks its own on first use.
- With `max_requests`, the helper is replaced after that many requests, so whatever it
  accumulates is given back to the system.
"""

from __future__ import annotations

import itertools
import math
import multiprocessing
import os
import signal
import threading
import time
import weakref
from typing import Any, Callable

from tclang import ctrl_c


class ServerError(Exception):
    """The request got no answer; the message says why."""


class ServerTimeout(ServerError):
    """The request ran past its time limit (the helper was killed)."""


class ServerUnavailable(ServerError):
    """The helper process could not be forked (no memory, process limit)."""


class ServerDied(ServerError):
    """The helper process ended while it worked on the request, and so did a fresh one it
    was sent to again. `signal`: the signal that ended the last one (SIGKILL: the OOM
    killer, or someone's kill -9), None if it exited or nobody knows."""

    def __init__(self, message: str, signal: int | None):
        super().__init__(message)
        self.signal = signal


class RequestFailed(ServerError):
    """The handler raised: `kind` is its exception's class name, `message` its text."""

    def __init__(self, kind: str, message: str):
        super().__init__(f"{kind}: {message}")
        self.kind, self.message = kind, message


_servers: weakref.WeakSet = weakref.WeakSet()


def helper_pids() -> list[int]:
    """The helper processes running now, and the helpers they run (the middle end's
    scheduling process, where /proc lists children): tclang fuzz adds their peak memory
    to its worker's, since a program's LLVM and isl work happens in them."""
    pids = [server.pid for server in list(_servers) if server.pid is not None]
    for pid in pids:  # the list grows as it goes: children of children
        try:
            with open(f"/proc/{pid}/task/{pid}/children") as children:
                pids += [int(child) for child in children.read().split()]
        except (OSError, ValueError):
            pass
    return pids


class ForkedServer:
    """`call(request)` runs `handler(request)` in the helper process and returns its result.
    Requests and results go through a pipe (pickled). Meant for module-level instances: each
    registers an at-fork hook for the life of the process."""

    def __init__(self, handler: Callable[[Any], Any], name: str,
                 max_requests: int | None = None, prepare: Callable[[], Any] | None = None):
        """`prepare()` runs in each new helper before its first request (loading what the
        requests will need while the caller still works on other things); an exception
        from it is dropped: the request that needs what failed reports it."""
        self.handler, self.name, self.max_requests = handler, name, max_requests
        self.prepare = prepare
        self.lock = threading.Lock()  # one request at a time; compilations may be threaded
        self.pid = self.conn = None
        self.served = 0
        _servers.add(self)
        self.requests = itertools.count()
        os.register_at_fork(after_in_child=self._forget)

    def start(self) -> None:
        """Fork the helper now, if none runs, so that it prepares while the caller works;
        ServerUnavailable where it cannot be forked."""
        with self.lock:
            self._running()

    def call(self, request: Any, limit: float | None = None,
             meanwhile: Callable[[], Any] | None = None) -> Any:
        """The handler's result; ServerError when there is none (RequestFailed when the
        handler raised, ServerDied when two processes in a row died working on it).
        `limit` is in seconds of wall-clock time, None for no limit. `meanwhile()` runs
        here once the request is sent, while the helper works on it (what the caller will
        need next, loaded in the time it would wait); an exception from it is dropped."""
        deadline = None if limit is None else time.monotonic() + limit
        with self.lock:
            try:
                status, payload = self._attempt(request, deadline, limit, meanwhile)
            except _Died as died:  # a fresh process, sent the same request once more
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise ServerTimeout(f"the {self.name} ran past {limit:g} s (its process "
                                        f"died: {died.how})") from None
                try:
                    status, payload = self._attempt(request, deadline, limit)
                except _Died as again:
                    raise ServerDied(f"the {self.name} process died ({died.how}), and so did "
                                     f"a fresh one ({again.how})", again.signal) from None
            self.served += 1
            if self.max_requests is not None and self.served >= self.max_requests:
                self._stop()
            if status == "error":
                raise RequestFailed(*payload)
            return payload

    def _attempt(self, request: Any, deadline: float | None, limit: float | None,
                 meanwhile: Callable[[], Any] | None = None) -> tuple[str, Any]:
        """One try: (status, payload) from a running process; _Died if it died on it."""
        self._running()
        request_id = next(self.requests)
        try:
            self.conn.send((request_id, request, limit))
            if meanwhile is not None:
                try:
                    meanwhile()
                except Exception:  # noqa: BLE001 - what it loads fails again where needed
                    pass
            return self._reply(request_id, deadline, limit)
        except (EOFError, OSError):  # its end of the pipe closed: it ended
            raise _Died(*self._ended()) from None
        except BaseException:  # past the limit, or Ctrl-C: work abandoned
            self._stop()
            raise

    def _running(self) -> None:
        if self.pid is not None and self._exited():
            self._drop()
        if self.pid is None:
            self._start()

    def _reply(self, request_id: int, deadline: float | None,
               limit: float | None) -> tuple[str, Any]:
        """The reply to `request_id`; replies to earlier requests are dropped."""
        while True:
            wait = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not self.conn.poll(wait):
                raise ServerTimeout(f"the {self.name} ran past {limit:g} s")
            answer, status, payload = self.conn.recv()
            if answer == request_id:
                return status, payload

    def _start(self) -> None:
        conn, child = multiprocessing.Pipe()
        parent = os.getpid()
        with ctrl_c.Held():  # a Ctrl-C during the fork: raised once the helper is known
            try:
                pid = os.fork()
            except OSError as err:
                conn.close()
                child.close()
                raise ServerUnavailable(f"the {self.name} process could not start: "
                                        f"{err}") from None
            if pid == 0:
                code = 0
                try:
                    _serve(self.handler, child, conn, parent, self.prepare)
                except BaseException:
                    code = 1
                finally:
                    os._exit(code)
            child.close()
            self.pid, self.conn, self.served = pid, conn, 0

    def _exited(self) -> bool:
        """Whether the process ended (it is reaped here: its pid may not be signalled again)."""
        try:
            return os.waitpid(self.pid, os.WNOHANG)[0] != 0
        except ChildProcessError:  # reaped by someone else (os.wait in the application)
            return True

    def _stop(self) -> None:
        try:
            os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass  # reaped by someone else
        self._drop()

    def _ended(self) -> tuple[str, int | None]:
        """How the process that closed its end of the pipe ended ("killed by SIGKILL,
        signal 9", "exited with status 1", "how, unknown"), and its signal; it is reaped,
        after a second at most (then killed: it closed the pipe but lingered)."""
        status = None
        try:
            for _ in range(100):
                done, status = os.waitpid(self.pid, os.WNOHANG)
                if done:
                    break
                status = None
                time.sleep(0.01)
        except ChildProcessError:
            pass  # reaped by someone else (os.wait in the application)
        if status is None:
            self._stop()
            return "how, unknown", None
        self._drop()
        if os.WIFSIGNALED(status):
            number = os.WTERMSIG(status)
            try:
                name = signal.Signals(number).name
            except ValueError:
                name = "an unknown signal"
            return f"killed by {name}, signal {number}", number
        return f"exited with status {os.waitstatus_to_exitcode(status)}", None

    def _drop(self) -> None:
        self.conn.close()
        self.pid = self.conn = None

    def _forget(self) -> None:
        """In a forked child: the helper is the parent's, and so is the lock's holder if a
        thread of the parent held it; the child forks its own helper on first use."""
        if self.conn is not None:
            self.conn.close()
        self.lock = threading.Lock()
        self.pid = self.conn = None


class _Died(Exception):
    """The process ended while working on a request: `how`, and the `signal` that ended it."""

    def __init__(self, how: str, signal: int | None):
        super().__init__(how)
        self.how, self.signal = how, signal


_ALARM_GRACE = 2.0
"""A request with a time limit ends its helper by SIGALRM (whose default action ends the
process) at twice the limit, plus a second: the parent kills it at the limit, but a parent
that died meanwhile (a fuzz worker ended as hung, a Python killed) cannot, and the helper
sees its parent go only between requests. An LLVM optimization that would not end ran on
for an hour in such an orphan."""


def _serve(handler, conn, parent_end, parent: int, prepare) -> None:
    """The helper's loop: (request id, request) in, (request id, "ok", result) or (request
    id, "error", (exception class name, text)) out, until the parent goes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    parent_end.close()
    # a process this helper forks (the middle end's scheduling process) must not hold the
    # pipe: the compiler would see no EOF when this helper dies while that one works on
    os.register_at_fork(after_in_child=conn.close)
    if prepare is not None:
        try:
            prepare()
        except Exception:
            pass  # the request that needs it fails, and says why
    while True:
        try:
            while not conn.poll(1.0):
                if os.getppid() != parent:
                    return
            request_id, request, limit = conn.recv()
        except (EOFError, OSError):
            return  # the compiler's process has gone
        if limit is not None:  # see _ALARM_GRACE
            signal.alarm(math.ceil(limit * _ALARM_GRACE) + 1)
        try:
            conn.send((request_id, "ok", handler(request)))
        except Exception as err:  # reported to the parent, which decides
            conn.send((request_id, "error", (type(err).__name__, str(err))))
        finally:
            signal.alarm(0)
