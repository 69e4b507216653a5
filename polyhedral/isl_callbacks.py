"""Python that isl calls: the one way polyhedral/ hands isl a callback.

islpy runs a Python callback (`foreach_*`, `map_schedule_node_bottom_up`, the AST
builder's `set_before_each_for`) from inside isl's C code, and an exception raised there
does not propagate: islpy prints it, tells isl that the callback failed, and isl unwinds
its error path. So Ctrl-C landing in a callback became an `isl.Error` ("call to
isl_ast_build_node_from_schedule failed"), then a TCCompileError, and the interrupt was
lost; and the AST builder's error path after a failed `before_each_for` corrupts the heap
(SIGSEGV, or glibc's "corrupted double-linked list" later; issue 31). No Python may raise
inside isl, so:

- what isl can give as a list is read as one, with no callback at all (`sets`, `maps`,
  `pw_affs`, `descendants`);
- every other callback (`pieces`, `map_bottom_up`, `build_ast`) runs inside a
  `Callbacks` region: the region defers SIGINT (its Python handler swapped, on the main
  thread only, for one that records the signal) and `guard` wraps each callback so that
  whatever it raises is kept and isl gets a harmless answer; when isl has returned, the
  region puts the previous handler back, runs it for a deferred SIGINT
  (KeyboardInterrupt, by default) and raises what a callback raised. A child forked by
  another thread during a region gets the previous handler back at fork (the region never
  ends there).

tests/polyhedral/test_isl_callbacks.py checks that no other module (of polyhedral/,
tclang/ or backends/) calls an isl method that takes a callback.
"""

from __future__ import annotations

import _signal  # signal's own functions, without its enum wrapping: see Callbacks
import os
import threading
from typing import Any, Callable

import islpy as isl


def sets(union: isl.UnionSet) -> list[isl.Set]:
    """The sets of a union set, in isl's order (that of `foreach_set`)."""
    listed = union.get_set_list()
    return [listed.get_at(k) for k in range(listed.n_set())]


def maps(union: isl.UnionMap) -> list[isl.Map]:
    """The maps of a union map, in isl's order (that of `foreach_map`)."""
    listed = union.get_map_list()
    return [listed.get_at(k) for k in range(listed.n_map())]


def pw_affs(union: isl.UnionPwAff) -> list[isl.PwAff]:
    """The piecewise functions of a union one, one per statement space."""
    listed = union.get_pw_aff_list()
    return [listed.get_at(k) for k in range(listed.n_pw_aff())]


def pieces(pa: isl.PwAff) -> list[tuple[isl.Set, isl.Aff]]:
    """(domain, affine function) of each piece: isl lists them only through a callback."""
    found: list[tuple[isl.Set, isl.Aff]] = []
    with Callbacks() as calls:
        pa.foreach_piece(calls.guard(lambda domain, aff: found.append((domain, aff))))
    return found


def descendants(node: isl.ScheduleNode):
    """`node` and every node below it, parents before children (a walk in Python, where
    `foreach_descendant_top_down` would call back from inside isl)."""
    stack = [node]
    while stack:
        current = stack.pop()
        yield current
        stack.extend(current.child(k) for k in reversed(range(current.n_children())))


def map_bottom_up(schedule: isl.Schedule,
                  visit: Callable[[isl.ScheduleNode], isl.ScheduleNode]) -> isl.Schedule:
    """`schedule.map_schedule_node_bottom_up(visit)`, with `visit` guarded: after a failure
    isl gets each node back unchanged and the failure is raised once isl returned."""
    with Callbacks() as calls:
        return schedule.map_schedule_node_bottom_up(calls.guard(visit, lambda node: node))


def build_ast(build: isl.AstBuild, schedule: isl.Schedule,
              before_for: Callable[[isl.AstBuild], isl.Id],
              serial: Callable[[isl.AstBuild], isl.Id]) -> isl.AstNode:
    """isl's AST of `schedule`, with `before_for(build)` giving the Id of each `for` as isl
    builds it (polyhedral/lowering.py: whether the loop carries a dependence). A failure
    of `before_for` is raised once isl returned; isl gets `serial(build)` meanwhile (it
    must get an Id: the builder's error path is the one that corrupts the heap)."""
    with Callbacks() as calls:
        # `keep` holds the callback for as long as isl may call it: until this returns
        build, keep = build.set_before_each_for(calls.guard(before_for, serial))
        return build.node_from_schedule(schedule)


class Callbacks:
    """A region of code in which isl may call Python (see the module docstring).

        with Callbacks() as calls:
            build, keep = build.set_before_each_for(calls.guard(before_for, serial))
            tree = build.node_from_schedule(schedule)

    Regions nest (an inner one leaves the handler to the outer). Only the main thread
    swaps the SIGINT handler: Python runs signal handlers there alone, so a callback on
    another thread never sees KeyboardInterrupt, and `signal.signal` works nowhere else.
    The handler is read and swapped with `_signal`, the C module under `signal`: this
    runs for every piece list and AST build of a compile, and `signal.signal`'s
    conversion of handlers to enums cost 10 us a region (0.6 us so)."""

    def __init__(self):
        self._thread = 0  # the thread that swapped the handler, if this region did
        self.failure: BaseException | None = None
        self._interrupt: tuple | None = None  # (signal number, frame) of a deferred SIGINT
        self._previous: Any = None  # the handler put back on exit, if this region swapped

    def guard(self, callback: Callable, fallback: Callable | None = None) -> Callable:
        """`callback` made safe to hand isl: once it (or an earlier one of this region)
        raised, isl gets `fallback(*args)` (None without one: for callbacks whose result
        isl ignores) and the exception waits for the region's end."""
        def guarded(*args):
            if self.failure is None:
                try:
                    return callback(*args)
                except BaseException as err:  # noqa: BLE001 - raised once isl returned
                    self.failure = err
            return None if fallback is None else fallback(*args)
        return guarded

    def __enter__(self) -> "Callbacks":
        if threading.current_thread() is threading.main_thread():
            current = _signal.getsignal(_signal.SIGINT)
            # SIG_DFL and SIG_IGN run no Python; a recorder means an outer region defers
            if callable(current) and not isinstance(getattr(current, "__self__", None),
                                                    Callbacks):
                global _swapped
                try:
                    _signal.signal(_signal.SIGINT, self._record)
                    self._previous = current
                    self._thread = threading.get_ident()
                    _swapped = self
                except ValueError:  # not the main interpreter: no Python handler runs here
                    pass
        return self

    def _record(self, signum: int, frame) -> None:
        """The SIGINT handler inside the region: it only remembers."""
        self._interrupt = (signum, frame)

    def __exit__(self, kind, error, traceback) -> None:
        if self._previous is not None:
            global _swapped
            previous, self._previous = self._previous, None
            _signal.signal(_signal.SIGINT, previous)
            _swapped = None
            if self._interrupt is not None:  # what the user's Ctrl-C does, isl left
                previous(*self._interrupt)
        if self.failure is not None:
            failure, self.failure = self.failure, None
            raise failure


_swapped: Callbacks | None = None  # the region whose recorder is the SIGINT handler now


def _give_ctrl_c_back_in_child() -> None:
    """In a child forked by another thread while the main thread was in a region: that
    region never ends here (its thread is not in the child), so its recorder would stay
    the SIGINT handler for the child's life: every Ctrl-C recorded and dropped, every later
    region deferring to it. The handler it replaced is put back; an interrupt it recorded
    was the parent's."""
    global _swapped
    region, _swapped = _swapped, None
    if region is None or region._previous is None or region._thread == threading.get_ident():
        _swapped = region  # the forking thread is the region's: it ends in the child too
        return
    previous, region._previous, region._interrupt = region._previous, None, None
    try:
        _signal.signal(_signal.SIGINT, previous)
    except ValueError:  # not the main interpreter
        pass


os.register_at_fork(after_in_child=_give_ctrl_c_back_in_child)
