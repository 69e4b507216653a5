"""Constant folding and algebraic simplification: two passes on typed expressions, each
exact, so that a folded program computes bit for bit what the unfolded one computes on
every backend.

Folding evaluates an operation whose operands are all constants, in the operation's own
type: float32 arithmetic in float32 (IEEE rounding), integers wrapping at their width,
`/` and `%` as the language defines them (floor, 0 for a zero divisor), comparisons with
NaN unordered. It is not done where the result could differ from run time: float16 and bfloat16
arithmetic (computed in float32 and rounded only where stored: a constant would round
early), float `%`, calls of the math library (exp, log, tanh... are not correctly rounded,
and backends differ in the last bit), float min/max (NaN rules), float-to-integer casts
outside the target's range (they saturate), and results that are not finite. A `?:` whose
condition folds keeps only the branch it selects.

With the sizes of a specialized compile, a size used as a value (`N` in `1.0 / N`) is a
constant too, where it fits the int32 it is typed as.

Simplification rewrites only what IEEE arithmetic leaves exactly unchanged:
x * 1, 1 * x, x / 1 -> x;  x - 0.0, x + -0.0 -> x;  x * -1, -1 * x -> -x;  -(-x) -> x;
!!b -> b;  b && true, b || false -> b;  float32(float64(x)) -> x for a float32 x.
It does not rewrite x + 0.0 for floats (-0.0 + 0.0 is +0.0), x * 0 for floats (NaN, inf
and -0.0) or x - x (inf - inf is NaN). Integers have no such exceptions: x + 0, x - 0 ->
x, and x * 0 -> 0 where x reads no gathered element (whose bounds error must still be
raised).
"""

from __future__ import annotations

import math
import operator
from typing import Mapping

import numpy as np

from tclang.lang import program as P
from tclang.dtypes import DType, round_float
from tclang.lang.passes.rewrite import map_statements, postorder, rewrite_bottom_up
from tclang.lang.program_text import expression_text

_INT32 = np.iinfo(np.int32)


def fold_constants(defn: P.Definition, sizes: Mapping[str, int] | None = None):
    """`defn` with constant operations folded (and, given `sizes`, sizes used as values
    replaced by their values); the notes say what was folded."""
    notes: list[str] = []

    def fold(e: P.Expr) -> P.Expr:
        if type(e) is P.SizeValue and sizes is not None and e.name in sizes \
                and _INT32.min <= sizes[e.name] <= _INT32.max:
            return P.Const(int(sizes[e.name]), e.dtype)
        folded = _fold(e)
        if folded is not e and type(folded) is P.Const and type(e) is not P.Const:
            notes.append(_note(e, folded))
        return folded

    return map_statements(defn, lambda s: rewrite_bottom_up(s.rhs, fold)), notes


def simplify_algebra(defn: P.Definition):
    """`defn` with the exact identities of the module docstring applied."""
    notes: list[str] = []

    def simplify(e: P.Expr) -> P.Expr:
        out = _simplify(e)
        if out is not e:
            notes.append(_note(e, out))
        return out

    return map_statements(defn, lambda s: rewrite_bottom_up(s.rhs, simplify)), notes


def _note(before: P.Expr, after: P.Expr) -> str:
    return f"{expression_text(before)}  ->  {expression_text(after)}"


# ---- folding -------------------------------------------------------------------------------

def _consts(*es) -> bool:
    return all(type(e) is P.Const for e in es)


def _fold(e: P.Expr) -> P.Expr:
    t = type(e)
    if t is P.Select and type(e.cond) is P.Const:
        return e.then if e.cond.value else e.other
    if e.dtype.is_narrow_float and t is not P.Cast:
        return e
    try:
        if t is P.Binary and _consts(e.lhs, e.rhs):
            value = _binary(e.op, e.lhs.value, e.rhs.value, e.dtype)
        elif t is P.Unary and _consts(e.operand):
            value = _unary(e.op, e.operand.value, e.dtype)
        elif t is P.Compare and _consts(e.lhs, e.rhs):
            value = _compare(e.op, e.lhs.value, e.rhs.value, e.lhs.dtype)
        elif t is P.Cast and _consts(e.operand):
            value = _cast(e.operand.value, e.operand.dtype, e.dtype)
        elif t is P.Call and _consts(*e.args) and e.name in ("min", "max", "abs") \
                and not e.dtype.is_float:
            value = _int_call(e.name, [a.value for a in e.args], e.dtype)
        else:
            return e
    except _NotFoldable:
        return e
    return P.Const(value, e.dtype)


class _NotFoldable(Exception):
    """The result at run time may differ from what folding would compute."""


def _float(value, dtype: DType):
    out = np.array(value, dtype=dtype.numpy)
    if not np.isfinite(out):
        raise _NotFoldable
    return float(out)


def _numpy(dtype: DType) -> np.dtype:
    """The NumPy type a constant of `dtype` is exact in (a bfloat16 one: float32)."""
    return np.dtype(np.float32) if dtype is DType.BFLOAT16 else dtype.numpy


def _wrap(value: int, dtype: DType):
    if dtype is DType.BOOL:
        return bool(value)
    return int(np.array(value & ((1 << 64) - 1), dtype=np.uint64).astype(dtype.numpy))


_FLOAT_OPS = {"add": operator.add, "sub": operator.sub, "mul": operator.mul,
              "div": operator.truediv}
_INT_OPS = {"add": operator.add, "sub": operator.sub, "mul": operator.mul,
            "div": operator.floordiv, "mod": operator.mod}  # floor, as the language's


def _binary(op: str, a, b, dtype: DType):
    if dtype is DType.BOOL:
        if op == "and":
            return bool(a) and bool(b)
        if op == "or":
            return bool(a) or bool(b)
        raise _NotFoldable
    if dtype.is_float:
        if op == "mod":
            raise _NotFoldable  # float %: left to the backend's own rules
        with np.errstate(all="ignore"):  # in the type itself: numpy rounds as IEEE does
            return _float(_FLOAT_OPS[op](np.array(a, dtype=dtype.numpy),
                                         np.array(b, dtype=dtype.numpy)), dtype)
    a, b = int(a), int(b)
    if op in ("div", "mod") and b == 0:
        return 0
    return _wrap(_INT_OPS[op](a, b), dtype)


def _unary(op: str, a, dtype: DType):
    if op == "not":
        return not bool(a)
    if dtype.is_float:
        return _float(-np.array(a, dtype=dtype.numpy), dtype)
    return _wrap(-int(a), dtype)


def _compare(op: str, a, b, dtype: DType) -> bool:
    if dtype.is_float:
        a, b = float(np.array(a, dtype=_numpy(dtype))), float(np.array(b, dtype=_numpy(dtype)))
        if math.isnan(a) or math.isnan(b):
            return op == "ne"
    return {"eq": a == b, "ne": a != b, "lt": a < b, "le": a <= b, "gt": a > b,
            "ge": a >= b}[op]


def _cast(value, src: DType, dst: DType):
    if dst is DType.BOOL:
        return bool(value != 0)
    if dst.is_float:
        if dst is DType.BFLOAT16:  # through float32, as the backends convert
            with np.errstate(over="ignore"):
                out = round_float(float(np.float32(np.array(value, dtype=_numpy(src)))), dst)
            if not math.isfinite(out):
                raise _NotFoldable
            return out
        if dst is DType.FLOAT16:
            out = np.array(np.array(value, dtype=_numpy(src)), dtype=np.float16)
            if not np.isfinite(out):
                raise _NotFoldable
            return float(out)
        return _float(np.array(value, dtype=_numpy(src) if src is not DType.BOOL else np.uint8),
                      dst)
    if src.is_float:  # saturating at run time: fold only what fits
        if not math.isfinite(value):
            raise _NotFoldable
        truncated = int(value)
        info = np.iinfo(dst.numpy)
        if not info.min <= truncated <= info.max:
            raise _NotFoldable
        return truncated
    return _wrap(int(value), dst)


def _int_call(name: str, args: list, dtype: DType):
    if name == "abs":
        return _wrap(abs(int(args[0])), dtype)
    return (min if name == "min" else max)(int(a) for a in args)


# ---- simplification ----------------------------------------------------------------------

def _is(e: P.Expr, value) -> bool:
    """A constant equal to `value` (a float constant's sign of zero counts)."""
    if type(e) is not P.Const or isinstance(e.value, bool):
        return False
    if value == 0 and e.dtype.is_float:
        return e.value == 0 and math.copysign(1.0, e.value) == math.copysign(1.0, value)
    return e.value == value


def _gathers(e: P.Expr) -> bool:
    return any(type(n) is P.Read and n.is_gather for n in postorder([e]))


def _simplify(e: P.Expr) -> P.Expr:
    t = type(e)
    if t is P.Binary:
        a, b, op, dt = e.lhs, e.rhs, e.op, e.dtype
        if dt is DType.BOOL:
            if op == "and" and type(b) is P.Const and b.value is True:
                return a
            if op == "and" and type(a) is P.Const and a.value is True:
                return b
            if op == "or" and type(b) is P.Const and b.value is False:
                return a
            if op == "or" and type(a) is P.Const and a.value is False:
                return b
            return e
        if op == "mul":
            if _is(b, 1):
                return a
            if _is(a, 1):
                return b
            if _is(b, -1):
                return P.Unary("neg", a, dt)
            if _is(a, -1):
                return P.Unary("neg", b, dt)
            if not dt.is_float and _is(b, 0) and not _gathers(a):
                return b
            if not dt.is_float and _is(a, 0) and not _gathers(b):
                return a
        elif op == "div" and _is(b, 1):
            return a
        elif op == "sub" and _is(b, 0):  # +0.0 for floats
            return a
        elif op == "add":
            if dt.is_float:
                if _is(b, -0.0):
                    return a
                if _is(a, -0.0):
                    return b
            elif _is(b, 0):
                return a
            elif _is(a, 0):
                return b
        return e
    if t is P.Unary and type(e.operand) is P.Unary and e.operand.op == e.op:
        return e.operand.operand  # -(-x), !!b
    if t is P.Cast and type(e.operand) is P.Cast and e.dtype is DType.FLOAT32 \
            and e.operand.dtype is DType.FLOAT64 and e.operand.operand.dtype is DType.FLOAT32:
        return e.operand.operand
    return e
