"""Where a TCError leaves the public API: without tclang's frames.

A user who calls `tc.define` or a kernel with bad input should see their own line and the
message, not twenty frames of Lark, isl and tclang. The error classes themselves
(tclang/errors.py) know nothing of this; this module, one floor above them and beside
tclang/environment.py (TCLANG_TRACEBACK=full keeps every frame), cuts the traceback.
"""

from __future__ import annotations

import functools
import os

from tclang import environment
from tclang.errors import TCError


def _internal_roots() -> tuple[str, ...]:
    """Where the frames that a user's traceback leaves out live: tclang's packages and the
    libraries under them (the standard library, site-packages: Lark, islpy, llvmlite)."""
    import sysconfig
    here = os.path.dirname(os.path.abspath(__file__))
    top = os.path.dirname(here)
    roots = [here + os.sep, os.path.join(top, "polyhedral") + os.sep,
             os.path.join(top, "backends") + os.sep]
    for name in ("stdlib", "platstdlib", "purelib", "platlib"):
        path = sysconfig.get_paths().get(name)
        if path:
            roots.append(os.path.abspath(path) + os.sep)
    return tuple(roots)


_ROOTS: tuple[str, ...] | None = None


def full_tracebacks() -> bool:
    """TCLANG_TRACEBACK=full: errors keep every frame (read at each error, not cached)."""
    return environment.choice("TCLANG_TRACEBACK", ("full",)) == "full"


def hide_internal_frames(err: BaseException) -> None:
    """Cut tclang's frames (and those of the libraries it called) from `err`'s traceback,
    and the internal exception it was raised from: called where a TCError leaves the
    public API, so the user sees their own line and the message. The traceback there
    holds only frames below the boundary, so what stays is the user's code that tclang
    called back, if any. Python 3.11 and newer: the boundary then re-raises with a bare
    `raise`, which adds no frame of its own."""
    global _ROOTS
    tb = err.__traceback__
    if full_tracebacks() or tb is None:
        return
    if _ROOTS is None:
        _ROOTS = _internal_roots()
    if err.internal_traceback is None:
        err.internal_traceback = tb
    kept = []
    while tb is not None:
        name = tb.tb_frame.f_code.co_filename
        if not (name.startswith("<") or os.path.abspath(name).startswith(_ROOTS)):
            kept.append(tb)
        tb = tb.tb_next
    tb = None
    for t in reversed(kept):
        tb = type(t)(tb, t.tb_frame, t.tb_lasti, t.tb_lineno)
    err.with_traceback(tb)
    err.__cause__ = None
    err.__suppress_context__ = True


def api_boundary(function):
    """Wrap a public function: a TCError raised out of it shows the caller's frame and
    the message, not tclang's frames (hide_internal_frames). Other exceptions are bugs
    and keep every frame. (The hot kernel calls inline the same try/except: a wrapper's
    extra call would cost more than the call itself.)"""
    @functools.wraps(function)
    def boundary(*args, **kwargs):
        try:
            return function(*args, **kwargs)
        except TCError as err:
            hide_internal_frames(err)
            raise
    return boundary
