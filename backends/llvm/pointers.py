"""Data pointers of NumPy arrays, cheaply: the hot path of a kernel call.

`a.ctypes.data` and `a.__array_interface__` build Python objects on every use (about 3 us
each on a slow machine, most of a tiny kernel's call). An ndarray keeps its data pointer in
a fixed field right after the object header; its offset is found once, by comparing with
NumPy's own answer on several kinds of arrays (contiguous, strided, offset views, empty),
and then read directly. If the offset cannot be verified, the slow, always-correct
`__array_interface__` is used instead.
"""

from __future__ import annotations

import ctypes

import numpy as np


def _interface_pointer(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


def _calibrate() -> int | None:
    base = np.arange(64, dtype=np.float32).reshape(8, 8)
    samples = [base, base[2:, 3:], base[:, ::2], base.T, np.empty(0, np.int8),
               np.zeros((3, 5), np.float64), np.ones(7, np.int64)[1:]]
    for offset in range(8, 80, 8):
        if all(ctypes.c_void_p.from_address(id(a) + offset).value == _interface_pointer(a)
               for a in samples if a.size):
            return offset
    return None


DATA_OFFSET = _calibrate()
"""Where an ndarray object keeps its data pointer (bytes from the object's start), or None
when it could not be verified."""


def _fields_verified() -> bool:
    """Whether an ndarray keeps its type, ndim, extents, strides and dtype where
    call_trampoline.py reads them (CPython 64-bit; NumPy's PyArrayObject_fields)."""
    from backends.llvm.call_trampoline import DESCR_AT, DIMS_AT, ND_AT, STRIDES_AT, TYPE_AT
    if DATA_OFFSET != 16:
        return False
    base = np.arange(60, dtype=np.float64).reshape(3, 4, 5)
    read = ctypes.c_int64.from_address
    for a in (base, base[1:, ::2, :3], base.T, np.ones(5, np.int8)[::2], np.float32(1) + base):
        if read(id(a) + TYPE_AT).value != id(type(a)) or \
                ctypes.c_int32.from_address(id(a) + ND_AT).value != a.ndim or \
                read(id(a) + DESCR_AT).value != id(a.dtype):
            return False
        dims, strides = read(id(a) + DIMS_AT).value, read(id(a) + STRIDES_AT).value
        if [read(dims + 8 * k).value for k in range(a.ndim)] != list(a.shape) or \
                [read(strides + 8 * k).value for k in range(a.ndim)] != list(a.strides):
            return False
    return True


def _field_reader(offset: int):
    read = ctypes.c_void_p.from_address

    def pointer(a: np.ndarray) -> int:
        return read(id(a) + offset).value or 0
    return pointer


data_pointer = _interface_pointer if DATA_OFFSET is None else _field_reader(DATA_OFFSET)

FIELDS_VERIFIED = _fields_verified()
"""Whether native code may compare an ndarray's type, dtype, shape and strides itself."""
