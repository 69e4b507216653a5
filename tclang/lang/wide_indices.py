"""Index and size values computed exactly: the int32 arithmetic built on them, in 64 bits.

The language types an index (`i`) or size (`N`) used as a value as `int32`, so `O(i) = i`
gives an int32 output. But extents may exceed 2^31: truncating the value to 32 bits would
make `int64(i)` wrap and a guard `(i <= 2147483647) ? A(i) : 0` hold where it must not
(reading outside `A`). So every integer expression built on index or size values is
evaluated in int64 and takes its declared narrower type only where the value leaves the
expression: where it is stored, and where an explicit cast narrows it. Stored results of
`+ - *` are the same as int32's wrapping arithmetic; comparisons, `/`, `%`, `min`, `max`,
`abs` and casts to a wider or float type become exact.

This is a rewrite of the checked statements' typed trees, run before the scop is built, so
every backend (and the reference interpreter) computes the same values.
"""

from __future__ import annotations

from dataclasses import replace

from tclang.lang import program as P
from tclang.dtypes import DType

WIDE = DType.INT64


def widen_indices(defn: P.Definition) -> P.Definition:
    """`defn` with every statement's value computed exactly (see the module docstring)."""
    statements = tuple(replace(s, rhs=widen_value(s.rhs)) for s in defn.statements)
    return replace(defn, statements=statements)


def widen_value(e: P.Expr) -> P.Expr:
    """`e` evaluated exactly, converted back to its declared type (where it is stored)."""
    return _cast(_widen(e), e.dtype)


def _narrow_int(dtype: DType) -> bool:
    """An integer type that an index value could overflow (bool is not arithmetic here)."""
    return dtype.is_int and dtype is not DType.BOOL and dtype.bits < WIDE.bits


def _cast(e: P.Expr, dtype: DType) -> P.Expr:
    return e if e.dtype is dtype else P.Cast(e, dtype)


def _joined(node: P.Expr, operands: list[P.Expr]) -> tuple[DType, list[P.Expr]]:
    """The node's type after widening, and its operands cast to it: int64 where the node is
    a narrow integer and some operand became int64."""
    if _narrow_int(node.dtype) and any(o.dtype is WIDE for o in operands):
        return WIDE, [_cast(o, WIDE) for o in operands]
    return node.dtype, operands


def _widen(e: P.Expr) -> P.Expr:
    match e:
        case P.IndexValue() | P.SizeValue():
            return replace(e, dtype=WIDE)
        case P.Const():
            return e
        case P.Read(subscripts=subs):  # gathers' subscripts exact too; the value is stored data
            return replace(e, subscripts=tuple(_widen(s) for s in subs))
        case P.Unary(operand=x):
            dtype, (x,) = _joined(e, [_widen(x)])
            return replace(e, operand=x, dtype=dtype)
        case P.Binary(lhs=a, rhs=b):
            dtype, (a, b) = _joined(e, [_widen(a), _widen(b)])
            return replace(e, lhs=a, rhs=b, dtype=dtype)
        case P.Compare(lhs=a, rhs=b):  # operands share one type
            a, b = _widen(a), _widen(b)
            if _narrow_int(a.dtype) or _narrow_int(b.dtype):
                if a.dtype is WIDE or b.dtype is WIDE:
                    a, b = _cast(a, WIDE), _cast(b, WIDE)
            return replace(e, lhs=a, rhs=b)
        case P.Select(cond=c, then=t, other=o):
            dtype, (t, o) = _joined(e, [_widen(t), _widen(o)])
            return replace(e, cond=_widen(c), then=t, other=o, dtype=dtype)
        case P.Call(args=args):  # float builtins' arguments are casts; min/max/abs join
            dtype, args = _joined(e, [_widen(a) for a in args])
            return replace(e, args=tuple(args), dtype=dtype)
        case P.Cast(operand=x, dtype=dtype):  # an explicit narrowing cast narrows
            return _cast(_widen(x), dtype)
    raise TypeError(f"cannot widen {e!r}")
