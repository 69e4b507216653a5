"""bfloat16 on the host: NumPy has no such type, so tclang keeps bfloat16 arrays in a
2-byte NumPy dtype and converts with integer arithmetic on their bits.

The dtype is `ml_dtypes.bfloat16` when ml_dtypes is installed (the standard NumPy
bfloat16, an optional extra: `pip install tclang[bf16]`); without it, a private structured
dtype of one uint16 field, which nothing outside tclang makes, so an array of plain
uint16 is never taken for bfloat16. Either way an element is the upper 16 bits of the
float32 of the same value; float32 -> bfloat16 rounds to nearest, ties to even (as
`__float2bfloat16_rn`, ml_dtypes and PyTorch do), a NaN stays a (quiet) NaN.
"""

from __future__ import annotations

import numpy as np

try:  # the standard NumPy bfloat16, where installed
    import ml_dtypes as _ml_dtypes
except ImportError:  # pragma: no cover - depends on the environment
    _ml_dtypes = None

#: ml_dtypes.bfloat16 where installed, else tclang's private stand-in
STORAGE = np.dtype(_ml_dtypes.bfloat16) if _ml_dtypes is not None else \
    np.dtype([("bfloat16", "<u2" if np.little_endian else ">u2")])
#: whether NumPy callers can have bfloat16 arrays (ml_dtypes is installed)
NUMPY_HAS_BFLOAT16 = _ml_dtypes is not None


def is_bfloat16(dtype) -> bool:
    """Whether a NumPy dtype holds bfloat16 (ml_dtypes' or tclang's stand-in)."""
    return dtype == STORAGE or getattr(dtype, "name", None) == "bfloat16" and \
        getattr(dtype, "itemsize", 0) == 2


def dtype_key(dtype) -> str:
    """A NumPy dtype as text for keys and records (`.str`, which says only `|V2` for
    bfloat16: "bfloat16" instead); `dtype_of_key` reads it back."""
    dtype = np.dtype(dtype)
    return "bfloat16" if is_bfloat16(dtype) else dtype.str


def dtype_of_key(text: str) -> np.dtype:
    return STORAGE if text == "bfloat16" else np.dtype(text)


def bits(array) -> np.ndarray:
    """The uint16 bits of a bfloat16 array (a view, no copy)."""
    return np.asarray(array).view(np.uint16)


def from_bits(b) -> np.ndarray:
    """A uint16 array of bits as a bfloat16 array (a view)."""
    return np.asarray(b, dtype=np.uint16).view(STORAGE)


def to_float32(b) -> np.ndarray:
    """float32 values of bfloat16 bits (uint16, any shape): exact."""
    return (np.asarray(b, dtype=np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)


def round_bits(x) -> np.ndarray:
    """The bfloat16 bits (uint16) of float32 `x` rounded to nearest, ties to even."""
    f = np.asarray(x, dtype=np.float32)
    u = f.view(np.uint32).astype(np.uint64)
    rounded = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    quiet = (u >> 16) | 0x40
    return np.where(np.isnan(f), quiet, rounded).astype(np.uint16)


def round_float32(x):
    """float32 `x` rounded to the nearest bfloat16 value, as float32 (a scalar for a scalar).
    A float64 is rounded to float32 first."""
    out = to_float32(round_bits(x))
    return np.float32(out) if np.ndim(out) == 0 else out


def round_float(value: float) -> float:
    """A Python float rounded to bfloat16 (through float32, as the backends do)."""
    with np.errstate(over="ignore"):
        return float(round_float32(np.float32(value)))


def to_numpy_float32(array) -> np.ndarray:
    """A bfloat16 array (either storage dtype) as float32 values."""
    return to_float32(bits(array))


def from_float32(x) -> np.ndarray:
    """float values as a bfloat16 array (rounded to nearest even)."""
    return from_bits(round_bits(x))


#: the largest finite bfloat16
MAX = float(to_float32(np.uint16(0x7F7F)))
EPS = 2.0 ** -7
