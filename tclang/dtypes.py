"""Scalar types and the promotion rules of LANGUAGE.md section 3."""

from __future__ import annotations

import enum

import numpy as np

from tclang import bfloat16
from tclang.bfloat16 import STORAGE as BF16_STORAGE, is_bfloat16


class DType(enum.Enum):
    BOOL = "bool"
    UINT8 = "uint8"
    UINT16 = "uint16"
    UINT32 = "uint32"
    UINT64 = "uint64"
    INT8 = "int8"
    INT16 = "int16"
    INT32 = "int32"
    INT64 = "int64"
    FLOAT16 = "float16"
    BFLOAT16 = "bfloat16"
    FLOAT32 = "float32"
    FLOAT64 = "float64"

    @property
    def is_float(self) -> bool:
        return self in (DType.FLOAT16, DType.BFLOAT16, DType.FLOAT32, DType.FLOAT64)

    @property
    def is_narrow_float(self) -> bool:
        """float16 or bfloat16: stored in 16 bits, computed in float32."""
        return self is DType.FLOAT16 or self is DType.BFLOAT16

    @property
    def is_int(self) -> bool:
        """Integral and not bool."""
        return not self.is_float and self is not DType.BOOL

    @property
    def is_signed(self) -> bool:
        return self.is_float or self.value.startswith("int")

    @property
    def bits(self) -> int:
        return 1 if self is DType.BOOL else int(self.value.lstrip("uintbfloa"))

    @property
    def numpy(self) -> np.dtype:
        """The NumPy dtype of arrays of this type (bfloat16: tclang/bfloat16.py's)."""
        return _NUMPY[self]

    @property
    def compute(self) -> "DType":
        """The type arithmetic runs in: float16 and bfloat16 are stored in 16 bits,
        computed in float32."""
        return DType.FLOAT32 if self.is_narrow_float else self

    def __repr__(self) -> str:
        return self.value


_NUMPY = {d: BF16_STORAGE if d is DType.BFLOAT16 else np.dtype(d.value)
          for d in DType}  # built once: the hot call path asks


ALIASES = {"half": DType.FLOAT16, "bf16": DType.BFLOAT16, "float": DType.FLOAT32,
           "double": DType.FLOAT64}


def parse_type_name(name: str) -> DType:
    return ALIASES.get(name) or DType(name)


def from_numpy(dtype) -> DType | None:
    """The tclang type of a NumPy dtype, or None if tclang has no such type."""
    try:
        dtype = np.dtype(dtype)
        if dtype.kind == "V" and is_bfloat16(dtype):
            return DType.BFLOAT16
        return DType(dtype.name)
    except (ValueError, TypeError):
        return None


def round_float(value: float, dtype: DType) -> float:
    """A Python number rounded to float type `dtype` (past its range: inf), as a float.
    bfloat16 rounds through float32, as the backends' casts do."""
    if dtype is DType.BFLOAT16:
        return bfloat16.round_float(value)
    with np.errstate(over="ignore"):
        return float(np.array(value, dtype=np.float64).astype(dtype.numpy))


def float_max(dtype: DType) -> float:
    """The largest finite value of float type `dtype`."""
    return bfloat16.MAX if dtype is DType.BFLOAT16 else float(np.finfo(dtype.numpy).max)


def promote(a: DType, b: DType) -> DType:
    """The type of a binary operation on `a` and `b` (section 3 of LANGUAGE.md).

    Int with float gives the float; two floats give the wider; two ints give the wider,
    signed if either is signed. float16 with bfloat16 gives float32 (neither holds the
    other's values). bool takes part in arithmetic as an 8-bit unsigned integer
    would (it never wins over a wider type); bool with bool stays bool.
    """
    if a is b:
        return a
    if a.is_float and b.is_float:
        if a.bits == b.bits:  # float16 and bfloat16
            return DType.FLOAT32
        return a if a.bits > b.bits else b
    if a.is_float:
        return a
    if b.is_float:
        return b
    if a is DType.BOOL:
        return b
    if b is DType.BOOL:
        return a
    bits = max(a.bits, b.bits)
    signed = a.is_signed or b.is_signed
    return DType(f"{'int' if signed else 'uint'}{bits}")


def is_widening(src: DType, dst: DType) -> bool:
    """Whether storing a `src` value into a `dst` tensor loses nothing by the rules.

    It is exactly when promoting the two gives `dst` (so int into float is fine, float64
    into float32 or int64 into int32 is narrowing and needs a cast).
    """
    return promote(src, dst) is dst


def identity(op: str, dtype: DType):
    """The value a `!` reduction starts from: 0, 1, or the largest/smallest value.

    For floats the largest value is +inf (IEEE's maximum), so `min=!` over an empty
    range gives +inf, as NumPy's `np.min(..., initial=np.inf)` would.
    """
    if op == "+":
        return False if dtype is DType.BOOL else (0.0 if dtype.is_float else 0)
    if op == "*":
        return True if dtype is DType.BOOL else (1.0 if dtype.is_float else 1)
    if dtype is DType.BOOL:
        return op == "min"
    if dtype.is_float:
        return float("inf") if op == "min" else float("-inf")
    info = np.iinfo(dtype.numpy)
    return int(info.max) if op == "min" else int(info.min)
