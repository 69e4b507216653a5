"""Scalar types and the promotion rules of LANGUAGE.md section 3."""

from __future__ import annotations

import enum

import numpy as np


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
    FLOAT32 = "float32"
    FLOAT64 = "float64"

    @property
    def is_float(self) -> bool:
        return self in (DType.FLOAT16, DType.FLOAT32, DType.FLOAT64)

    @property
    def is_int(self) -> bool:
        """Integral and not bool."""
        return not self.is_float and self is not DType.BOOL

    @property
    def is_signed(self) -> bool:
        return self.is_float or self.value.startswith("int")

    @property
    def bits(self) -> int:
        return 1 if self is DType.BOOL else int(self.value.lstrip("uintfloa"))

    @property
    def numpy(self) -> np.dtype:
        return _NUMPY[self]

    @property
    def compute(self) -> "DType":
        """The type arithmetic runs in: float16 is stored as half, computed in float32."""
        return DType.FLOAT32 if self is DType.FLOAT16 else self

    def __repr__(self) -> str:
        return self.value


_NUMPY = {d: np.dtype(d.value) for d in DType}  # built once: the hot call path asks


ALIASES = {"half": DType.FLOAT16, "float": DType.FLOAT32, "double": DType.FLOAT64}


def parse_type_name(name: str) -> DType:
    return ALIASES.get(name) or DType(name)


def from_numpy(dtype) -> DType | None:
    """The tclang type of a NumPy dtype, or None if tclang has no such type."""
    try:
        return DType(np.dtype(dtype).name)
    except (ValueError, TypeError):
        return None


def promote(a: DType, b: DType) -> DType:
    """The type of a binary operation on `a` and `b` (section 3 of LANGUAGE.md).

    Int with float gives the float; two floats give the wider; two ints give the wider,
    signed if either is signed. bool takes part in arithmetic as an 8-bit unsigned integer
    would (it never wins over a wider type); bool with bool stays bool.
    """
    if a is b:
        return a
    if a.is_float and b.is_float:
        return a if a.bits >= b.bits else b
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
