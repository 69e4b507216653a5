"""Ctrl-C during a compile comes out of it as KeyboardInterrupt, always.

Python runs a SIGINT handler at the next bytecode of the main thread, wherever that is.
Where it is code whose exceptions Python cannot raise (an at-fork hook: os.fork runs
logging's `_releaseLock` and tclang's own; a weakref callback or `weakref.finalize`, as
a WeakSet's and tclang's loaded code use; a `__del__`), the KeyboardInterrupt is printed
as "Exception ignored in ..." and dropped, and the compile went on as if no Ctrl-C had
come (issue 31: `tclang fuzz` found Ctrl-Cs 0.04-0.13 s into a compile, while the middle
end's helper was forked, that never raised). Two defences, both on the main thread only
(Python runs its handlers there alone) and only where SIGINT's handler is Python's
(SIG_DFL and SIG_IGN run no Python, so lose nothing):

- `Held()` around an os.fork (tclang/forked_server.py): SIGINT's handler only records
  until the parent knows its child; then the handler is put back and run for a recorded
  SIGINT. The child keeps the recorder until it sets a handler of its own.
- `Compiling()` around a compile (tclang/driver/compiler.py) and `tc.define`'s check: a
  KeyboardInterrupt that Python dropped (sys.unraisablehook hears of it, and says
  nothing) is raised again at the compile's next `checkpoint()` (between its stages:
  nothing may raise inside the hook, and a signal sent from it is handled inside it too);
  and a Ctrl-C whose exception did not leave the region (dropped where no hook hears of
  it, or turned into another exception by code that catches too much) is delivered when
  the region ends. Between regions, tclang's own locks die without running Python
  (tclang/locks.py keeps weak references with no callback, not a WeakSet).

polyhedral/isl_callbacks.py defers SIGINT the same way while isl calls Python. Each of
these regions swaps the handler only if the current one is a plain Python handler or
another region's, and puts back what it found: they nest in any order.
"""

from __future__ import annotations

import signal
import sys
import threading
from typing import Any


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


class Held:
    """SIGINT recorded, not handled, until `release()` (or the end of the `with`):

        with Held():
            pid = os.fork()
            if pid == 0:
                ...  # the child: never leaves the block (os._exit)
            self.pid = pid  # known before a KeyboardInterrupt at the block's end
    """

    def __init__(self):
        self._previous: Any = None
        self._interrupt: tuple | None = None

    def __enter__(self) -> "Held":
        if _main_thread():
            current = signal.getsignal(signal.SIGINT)
            if callable(current):
                try:  # a SIGINT already pending runs `current` here, before the swap
                    signal.signal(signal.SIGINT, self._record)
                    self._previous = current
                except ValueError:  # not the main interpreter: no Python handler runs
                    pass
        return self

    def _record(self, signum: int, frame) -> None:
        self._interrupt = (signum, frame)

    def release(self) -> None:
        """The handler back, and run for a SIGINT that came meanwhile (once)."""
        if self._previous is None:
            return
        previous, self._previous = self._previous, None
        signal.signal(signal.SIGINT, previous)  # a pending SIGINT is recorded first
        if self._interrupt is not None:
            interrupt, self._interrupt = self._interrupt, None
            previous(*interrupt)

    def __exit__(self, kind, error, traceback) -> None:
        self.release()


class Compiling:
    """The region of one compile (see the module docstring). Nested regions leave the
    watching to the outermost."""

    _active: "Compiling | None" = None

    def __init__(self):
        self._previous: Any = None  # the handler found (and put back at the end)
        self._hook: Any = None  # sys.unraisablehook found
        self._closing = False
        self._pending: tuple | None = None  # a SIGINT whose handler raised, until delivered
        self._raised: BaseException | None = None  # what that handler raised
        self._dropped = False  # and Python dropped it

    def __enter__(self) -> "Compiling":
        if Compiling._active is not None or not _main_thread():
            return self
        current = signal.getsignal(signal.SIGINT)
        if not callable(current):
            return self
        try:
            signal.signal(signal.SIGINT, self._handler)
        except ValueError:  # not the main interpreter
            return self
        self._previous = current
        self._hook, sys.unraisablehook = sys.unraisablehook, self._unraisable
        Compiling._active = self
        return self

    def _handler(self, signum: int, frame) -> None:
        self._pending = (signum, frame)
        if self._closing:  # the handler runs for it once the region is left
            return
        try:
            self._previous(signum, frame)
        except BaseException as err:
            self._raised = err
            raise
        self._pending = None  # it returned: nothing left to deliver

    def _unraisable(self, unraisable) -> None:
        if self._raised is not None and unraisable.exc_value is self._raised:
            self._dropped = True  # by Python (a finalizer, an at-fork hook): delivered
            return  # at the next checkpoint (nothing may raise in this hook)
        (self._hook or sys.__unraisablehook__)(unraisable)

    def checkpoint(self) -> None:
        """KeyboardInterrupt here if a Ctrl-C's exception was dropped by Python."""
        if self._dropped and self._pending is not None:
            self._dropped, self._raised = False, None
            pending, self._pending = self._pending, None
            self._handler(*pending)

    def __exit__(self, kind, error, traceback) -> None:
        if self._previous is None:
            return
        previous = self._previous
        self._closing = True
        try:
            signal.signal(signal.SIGINT, previous)  # a pending SIGINT runs _handler first
        finally:
            if sys.unraisablehook == self._unraisable:
                sys.unraisablehook = self._hook
            Compiling._active = None
            self._previous = self._hook = None
        if self._pending is None:
            return
        if error is not None and (error is self._raised or isinstance(error, KeyboardInterrupt)):
            return  # it came out
        pending, self._pending = self._pending, None
        previous(*pending)  # KeyboardInterrupt, by default: from the compile's end


def checkpoint() -> None:
    """Where a compile may stop (between its stages): a Ctrl-C whose KeyboardInterrupt
    Python dropped since the compile began is raised here."""
    region = Compiling._active
    if region is not None and _main_thread():
        region.checkpoint()
