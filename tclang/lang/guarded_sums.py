"""Sums of guarded terms reduce over the points where the guard holds.

`T(I) +=! c ? e : 0` with `c` affine in the indices (padding, a strided or transposed
convolution's backward, a triangular mask) adds zeros wherever `c` is false. Put in the
statement's domain instead (`Statement.condition`), the polyhedral stage generates loops
over only the points that contribute: the backward of a convolution then runs as a
convolution, not as a dense loop over every (input, output) pair with a test inside (44x
slower than its forward before this rewrite, for a 3x3 convolution). The init statement of
`!` still covers every point of T, so points with no term keep the identity.

Only `+` reductions whose other branch is a literal zero; the condition must be affine (a
data-dependent one stays in the expression). Applied with the passes (Options(passes=False)
turns it off, so the fuzzer's oracle checks it).
"""

from __future__ import annotations

from dataclasses import replace

from tclang.lang import program as P
from tclang.lang import sizes as Z
from tclang.lang.affine import Affine, Compare, Condition, Logic, affine_binary, condition_and

_COMPARE = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}
_ARITH = {"add": "+", "sub": "-", "mul": "*", "div": "/", "mod": "%"}


def restrict_guarded_sums(defn: P.Definition) -> P.Definition:
    statements = tuple(_restricted(s) for s in defn.statements)
    if all(a is b for a, b in zip(statements, defn.statements)):
        return defn
    return replace(defn, statements=statements)


def _restricted(s: P.Statement) -> P.Statement:
    if s.op != "+":
        return s
    rhs, condition = s.rhs, s.condition
    while isinstance(rhs, P.Select) and _is_zero(rhs.other):
        c = affine_condition(rhs.cond)
        if c is None:
            break
        condition = condition_and(condition, c)
        rhs = rhs.then
    if condition is s.condition:
        return s
    if rhs.dtype is not s.rhs.dtype:
        rhs = P.Cast(rhs, s.rhs.dtype)
    return replace(s, rhs=rhs, condition=condition)


def _is_zero(e: P.Expr) -> bool:
    while isinstance(e, P.Cast):
        e = e.operand
    return isinstance(e, P.Const) and not isinstance(e.value, bool) and e.value == 0


def affine_condition(e: P.Expr) -> Condition | None:
    """The affine meaning of a typed boolean expression, or None if it reads data."""
    if isinstance(e, P.Compare):
        a, b = affine_value(e.lhs), affine_value(e.rhs)
        if a is None or b is None:
            return None
        return Compare(_COMPARE[e.op], a - b)
    if isinstance(e, P.Binary) and e.op in ("and", "or"):
        a, b = affine_condition(e.lhs), affine_condition(e.rhs)
        if a is None or b is None:
            return None
        return Logic(e.op, (a, b))
    if isinstance(e, P.Unary) and e.op == "not":
        a = affine_condition(e.operand)
        return None if a is None else Logic("not", (a,))
    return None


def affine_value(e: P.Expr) -> Affine | None:
    """An integer expression of indices, sizes and literals as an Affine, else None."""
    match e:
        case P.IndexValue(name=n):
            return Affine.index(n)
        case P.SizeValue(name=n):
            return Affine.of_size(Z.size(n))
        case P.Const(value=v) if isinstance(v, int) and not isinstance(v, bool):
            return Affine.of_size(Z.const(v))
        case P.Cast(operand=x, dtype=d) if d.is_int and x.dtype.is_int:
            return affine_value(x)
        case P.Unary(op="neg", operand=x) if x.dtype.is_int:
            a = affine_value(x)
            return None if a is None else a.scale(-1)
        case P.Binary(op=op, lhs=x, rhs=y) if e.dtype.is_int and op in _ARITH:
            return affine_binary(_ARITH[op], affine_value(x), affine_value(y))
    return None
