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


def _calibrate():
    base = np.arange(64, dtype=np.float32).reshape(8, 8)
    samples = [base, base[2:, 3:], base[:, ::2], base.T, np.empty(0, np.int8),
               np.zeros((3, 5), np.float64), np.ones(7, np.int64)[1:]]
    for offset in range(8, 80, 8):
        if all(ctypes.c_void_p.from_address(id(a) + offset).value == _interface_pointer(a)
               for a in samples if a.size):
            read = ctypes.c_void_p.from_address

            def pointer(a: np.ndarray, _offset=offset) -> int:
                return read(id(a) + _offset).value or 0
            return pointer
    return _interface_pointer


data_pointer = _calibrate()
