"""Ctrl-C that Python would drop still comes out of a compile (tclang/ctrl_c.py, issue 31).

Python runs a SIGINT handler at the next bytecode of the main thread; inside an at-fork
hook, a finalizer or a weakref callback its KeyboardInterrupt is printed as "Exception
ignored" and dropped. `tclang fuzz` found compiles interrupted 0.04-0.13 s in (while the
middle end's helper was forked) that never raised: each test here puts a Ctrl-C in such
a place on purpose (`signal.raise_signal` runs the handler before it returns).
"""

from __future__ import annotations

import gc
import os
import signal
import sys

import numpy as np
import pytest

import tclang as tc
from tclang import ctrl_c
from tclang.driver import middle_end
from tclang.forked_server import ForkedServer

_IN_THE_NEXT_FORK: list[str] = []  # which process gets a Ctrl-C inside its at-fork hooks


def _ctrl_c_inside_a_fork_hook() -> None:
    if _IN_THE_NEXT_FORK and _IN_THE_NEXT_FORK[0] == "parent":
        _IN_THE_NEXT_FORK.clear()
        signal.raise_signal(signal.SIGINT)  # raised inside the hook: dropped by Python


os.register_at_fork(after_in_parent=_ctrl_c_inside_a_fork_hook)


class _DropsCtrlC:
    """Ctrl-C while Python runs a finalizer: its KeyboardInterrupt is dropped."""

    def __del__(self):
        signal.raise_signal(signal.SIGINT)


@pytest.fixture(autouse=True)
def _default_handler():
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    hook = sys.unraisablehook
    yield
    _IN_THE_NEXT_FORK.clear()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert sys.unraisablehook is hook


def test_ctrl_c_while_a_helper_is_forked_raises_once_the_helper_is_known():
    """It was dropped inside logging's at-fork hook, and the request went on."""
    server = ForkedServer(lambda request: request * 2, "doubler")
    try:
        _IN_THE_NEXT_FORK.append("parent")
        with pytest.raises(KeyboardInterrupt):
            server.call(21)
        assert server.pid is not None  # the helper was kept: it serves the next request
        assert server.call(21) == 42
    finally:
        server._stop() if server.pid is not None else None


def test_ctrl_c_dropped_in_a_finalizer_comes_out_at_the_next_checkpoint():
    after = []
    with pytest.raises(KeyboardInterrupt):
        with ctrl_c.Compiling():
            _DropsCtrlC()  # collected at once: the KeyboardInterrupt raised in __del__
            after.append("went on")
            ctrl_c.checkpoint()
            after.append("past the checkpoint")
    assert after == ["went on"]
    with pytest.raises(KeyboardInterrupt):
        with ctrl_c.Compiling():  # no checkpoint: at the end
            _DropsCtrlC()


def test_a_finalizer_that_fails_otherwise_is_reported_as_before(monkeypatch):
    class Fails:
        def __del__(self):
            raise ValueError("in __del__")
    seen = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: seen.append(u.exc_value))
    with ctrl_c.Compiling():
        Fails()
        ctrl_c.checkpoint()
    assert [type(e) for e in seen] == [ValueError]


def test_ctrl_c_turned_into_another_exception_comes_out_as_keyboard_interrupt():
    with pytest.raises(KeyboardInterrupt):
        with ctrl_c.Compiling():
            try:
                signal.raise_signal(signal.SIGINT)
            except KeyboardInterrupt:
                raise ValueError("caught too much") from None


def test_a_users_handler_runs_once_and_regions_nest():
    seen = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: seen.append(signum))
    try:
        with ctrl_c.Compiling():
            with ctrl_c.Compiling(), ctrl_c.Held():
                signal.raise_signal(signal.SIGINT)
                assert seen == []  # held
            assert seen == [signal.SIGINT]
        assert seen == [signal.SIGINT]  # returned: nothing left to deliver
    finally:
        signal.signal(signal.SIGINT, previous)


def test_ctrl_c_dropped_during_a_compile_raises_and_the_next_compile_is_right(
        monkeypatch, tmp_path):
    monkeypatch.setenv("TCLANG_CACHE_DIR", str(tmp_path))
    from tclang.driver.compiler import forget_compiled
    forget_compiled()
    real = middle_end.schedule

    def schedule(*args):
        scheduled = real(*args)
        _DropsCtrlC()
        gc.collect()
        return scheduled
    monkeypatch.setattr(middle_end, "schedule", schedule)
    source = "def f(float(N) X) -> (Y) { Y(i) = X(i) * 3.0 + 1.0 }"
    x = np.arange(5, dtype=np.float32)
    with pytest.raises(KeyboardInterrupt):
        tc.define(source).f(x)
    monkeypatch.setattr(middle_end, "schedule", real)
    np.testing.assert_array_equal(tc.define(source).f(x), x * 3 + 1)
    forget_compiled()
    np.testing.assert_array_equal(tc.define(source).f(x), x * 3 + 1)  # from the disk


def test_ctrl_c_dropped_while_define_checks_comes_out_of_define(monkeypatch):
    import tclang
    real = tclang._module

    def module(*args):
        _DropsCtrlC()
        return real(*args)
    monkeypatch.setattr(tclang, "_module", module)
    with pytest.raises(KeyboardInterrupt):
        tc.define("def g(float(N) X) -> (Y) { Y(i) = X(i) + 2.0 }")


def test_a_fork_safe_lock_dies_without_running_python():
    """A WeakSet ran its `_remove` for every lock that died (two per kernel): a Ctrl-C
    landing there was dropped ("Exception ignored in ..._remove")."""
    import threading

    from tclang import locks
    lock = locks.fork_safe(threading.Lock())
    assert all(ref.__callback__ is None for ref in locks._locks)
    assert any(ref() is lock for ref in locks._locks)
    live = sum(ref() is not None for ref in locks._locks)
    for _ in range(locks._sweep_at + 1):  # the dead are swept as the list grows
        locks.fork_safe(threading.Lock())
    assert len(locks._locks) <= max(64, 2 * (live + 1))
    assert any(ref() is lock for ref in locks._locks)
