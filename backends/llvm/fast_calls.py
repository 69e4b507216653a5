"""A specialized kernel as a Python builtin function over `tclang_call`
(call_trampoline.py): `call(*arrays)` runs the kernel on the arrays' data and returns 0,
or the error record as bytes.

The builtin is made with CPython's own PyCFunction_NewEx from a method definition that
points at the trampoline, with a per-kernel state array as its `self`. This relies on two
field offsets of CPython objects on a 64-bit build: where an ndarray keeps its data
pointer (pointers.py verifies it on sample arrays) and where a ctypes array keeps its
buffer (verified here). Where either cannot be verified (another interpreter, a
free-threaded or 32-bit build), `builtin_call` returns None and the kernel is called
through ctypes, as before.
"""

from __future__ import annotations

import ctypes
import platform
import sys

import numpy as np

from backends.llvm.call_trampoline import SELF_DATA_OFFSET, STATE
from backends.llvm.pointers import DATA_OFFSET, FIELDS_VERIFIED

METH_FASTCALL = 0x0080


class _MethodDef(ctypes.Structure):
    _fields_ = [("ml_name", ctypes.c_char_p), ("ml_meth", ctypes.c_void_p),
                ("ml_flags", ctypes.c_int), ("ml_doc", ctypes.c_char_p)]


def _verified() -> bool:
    if platform.python_implementation() != "CPython" or sys.maxsize <= 2**32 \
            or DATA_OFFSET is None or getattr(sys, "_is_gil_enabled", lambda: True)() is False:
        return False
    sample = (ctypes.c_int64 * len(STATE))()
    return ctypes.c_void_p.from_address(id(sample) + SELF_DATA_OFFSET).value == \
        ctypes.addressof(sample)


AVAILABLE = _verified()


def _api(name: str) -> int:
    return ctypes.cast(getattr(ctypes.pythonapi, name), ctypes.c_void_p).value


_new_function = None


def signature(templates) -> list[int] | None:
    """What the entry compares the first arrays of each call with (call_trampoline.py):
    each template's type, dtype object, ndim, shape and strides; None where the fields
    cannot be read natively or a template is not exactly an ndarray."""
    if not FIELDS_VERIFIED or not all(type(t) is np.ndarray for t in templates):
        return None
    words = [len(templates)]
    for t in templates:
        words += [id(type(t)), id(t.dtype), t.ndim, *t.shape, *t.strides]
    return words


def builtin_call(trampoline: int, kernel: int, parallel_for: int, unused: int,
                 n_buffers: int, templates=None, keep=None, sizes: int = 0,
                 strides: int = 0):
    """The kernel whose `tclang_packed` entry is at `kernel` as a builtin taking its
    n_buffers arrays, or None where this
    way of calling is not available. `templates`: arrays the first arrays of each call
    must look like (their signature(); None: no checks); the dtype objects it names are
    kept alive with the builtin, so no other dtype can take their address. `keep`: what
    must live as long as the builtin (the kernel's code). `sizes`, `strides`: addresses of
    the size values and strides a kernel that reads them at run time gets (0: `unused`),
    kept alive by the caller through `keep`; only with templates that fix them."""
    global _new_function
    if not AVAILABLE or not trampoline or n_buffers < 1:
        return None
    if _new_function is None:
        new = ctypes.pythonapi.PyCFunction_NewEx
        new.restype = ctypes.py_object
        new.argtypes = [ctypes.c_void_p, ctypes.py_object, ctypes.c_void_p]
        _new_function = new
    values = dict(kernel=kernel, parallel_for=parallel_for, unused=unused,
                  save_thread=_api("PyEval_SaveThread"),
                  restore_thread=_api("PyEval_RestoreThread"),
                  from_long=_api("PyLong_FromLong"),
                  from_bytes=_api("PyBytes_FromStringAndSize"), data_offset=DATA_OFFSET,
                  signature=0, n_buffers=n_buffers, bound_sizes=sizes or unused,
                  bound_strides=strides or unused)
    words, checks = None, None
    if templates is not None:
        checks = signature(templates)
        if checks is None:
            return None
    if checks is not None:
        words = (ctypes.c_int64 * len(checks))(*checks)
        values["signature"] = ctypes.addressof(words)
    state = (ctypes.c_int64 * len(STATE))(*(values[name] for name in STATE))
    definition = _MethodDef(b"tclang_kernel", trampoline, METH_FASTCALL, None)
    function = _new_function(ctypes.addressof(definition), state, None)
    # the builtin holds its state as `self`; the state holds what must outlive the builtin
    state.kept = (definition, words, [t.dtype for t in templates or ()], keep)
    return function
