"""Typing of one statement's expressions: syntax -> typed `program` expressions.

Names are resolved in this order: a `where` local, a tensor, a size, else an index of the
statement. Promotion follows LANGUAGE.md section 3 and is made explicit with `Cast` nodes.
Subscripts and `?:` conditions also get their quasi-affine meaning (`tclang.lang.affine`).
"""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass, field

import numpy as np

from tclang.lang import program as P
from tclang.lang import sizes as Z
from tclang.lang import syntax as S
from tclang.lang.affine import (Affine, Compare, Condition, Logic, Truth, affine_binary, condition_and,
                           condition_not)
from tclang.dtypes import DType, float_max, parse_type_name, promote, round_float
from tclang.errors import Span, TCSemanticError
from tclang.lang.functions import BUILTINS

_ARITH = {"+": "add", "-": "sub", "*": "mul", "/": "div", "%": "mod"}
_COMPARE = {"==": "eq", "!=": "ne", "<": "lt", "<=": "le", ">": "gt", ">=": "ge"}
_INT32 = np.iinfo(np.int32)


@dataclass(frozen=True)
class TensorInfo:
    """What the typer knows of a tensor when a statement is checked."""

    name: str
    dtype: DType | None  # None: not written yet
    rank: int
    role: str
    written: bool


@dataclass
class StatementScope:
    """Names visible in one statement, and what typing its expressions found."""

    tensors: dict[str, TensorInfo]
    sizes: set[str]
    lets: dict[str, S.Expr]
    target: str
    later_targets: frozenset[str] = frozenset()  # tensors only later statements write
    index_spans: dict[str, Span] = field(default_factory=dict)  # first use of each index
    reads: int = 0
    inlining: list[str] = field(default_factory=list)
    # float literals past float32's range, as typed: an error if one is still float32 in
    # the statement's final expression (check_wide_literals), where it would be inf
    wide_literals: list[tuple[P.Const, Span]] = field(default_factory=list)

    def is_index(self, name: str) -> bool:
        return name not in self.tensors and name not in self.sizes and name not in self.lets \
            and name not in BUILTINS


def error(message: str, span: Span, hint: str | None = None) -> TCSemanticError:
    return TCSemanticError(message, span, hint=hint)


def cast(e: P.Expr, dtype: DType) -> P.Expr:
    """`e` converted to `dtype`; literal constants are converted exactly, at compile time."""
    if e.dtype is dtype:
        return e
    if isinstance(e, P.Const):
        return P.Const(convert_constant(e.value, dtype), dtype)
    return P.Cast(e, dtype)


def cast_finite(e: P.Expr, dtype: DType, span: Span) -> P.Expr:
    """`cast(e, dtype)` for an explicit cast, refusing a finite constant the conversion
    makes infinite (`half(70000.0)`): it is converted at compile time, where no one would
    see it happen. (Stores only widen: a narrowing one needs such a cast.)"""
    result = cast(e, dtype)
    if isinstance(e, P.Const) and isinstance(result, P.Const) and dtype.is_float and \
            math.isinf(result.value) and math.isfinite(e.value):
        raise error(f"the constant {e.value:g} is too large for {dtype.value}: it would be "
                    "infinite", span, hint=f"{dtype.value} holds magnitudes up to about "
                                           f"{float_max(dtype):.3g}")
    return result


def convert_constant(value, dtype: DType):
    if dtype is DType.BOOL:
        return bool(value)
    if dtype.is_float:  # rounding past the type's range gives inf: cast_finite refuses it
        return round_float(value, dtype)
    if isinstance(value, float):
        value = int(value)  # truncation toward zero, as the cast does
    return int(np.array(int(value)).astype(np.int64).astype(dtype.numpy))


def _float32_overflows(value: float) -> bool:
    with np.errstate(over="ignore"):
        return bool(np.isinf(np.float32(value)))


def check_wide_literals(scope: StatementScope, final: P.Expr) -> None:
    """Refuse a float literal past float32's range that the statement computes in float32
    (`X(i) * 1e39` with X float32): it would be inf there. Promotion to float64 (a float64
    operand, `double(1e39)`) keeps its exact value and makes a new constant."""
    if not scope.wide_literals:
        return
    left = {id(node) for node in P.walk(final) if type(node) is P.Const}
    for const, span in scope.wide_literals:
        if id(const) in left and const.dtype is DType.FLOAT32:
            raise error(f"float literal {const.value:g} is too large for float32, the type "
                        "it is computed in here: it would be infinite", span,
                        hint="float32 holds magnitudes up to about 3.4e38; write "
                             "double(...) around it to compute in float64")


class ExpressionTyper:
    """Types the expressions of one statement under a `StatementScope`."""

    def __init__(self, scope: StatementScope):
        self.scope = scope

    # ---- entry points ----
    def expr(self, e: S.Expr, guard: Condition | None = None) -> P.Expr:
        method = getattr(self, "_" + type(e).__name__)
        return method(e, guard)

    def read(self, e: S.Apply, guard: Condition | None) -> P.Read:
        info = self.scope.tensors[e.name]
        if not info.written and info.role != "input":
            raise self._unwritten(e.name, e.name_span)
        if len(e.args) != info.rank:
            raise error(f"{e.name} has rank {info.rank} but is read with {len(e.args)} "
                        f"subscript{'s' if len(e.args) != 1 else ''}", e.span,
                        hint=_rank_hint(e.name, info.rank))
        subs = []
        for arg in e.args:
            typed = self.expr(arg, guard)
            if not (typed.dtype.is_int):
                raise error(f"a subscript must be an integer, but this one is "
                            f"{typed.dtype.value}", _span_of(arg),
                            hint="convert it with int32(...) or int64(...)")
            subs.append(typed)
        affine = tuple(self.affine(arg) for arg in e.args)
        ref = self.scope.reads
        self.scope.reads += 1
        return P.Read(e.name, tuple(subs), affine, guard, ref, info.dtype, e.span)

    # ---- expression nodes ----
    def _IntLit(self, e: S.IntLit, guard) -> P.Expr:
        fits = _INT32.min <= e.value <= _INT32.max
        return P.Const(e.value, DType.INT32 if fits else DType.INT64)

    def _FloatLit(self, e: S.FloatLit, guard) -> P.Expr:
        # keep the literal's exact value: it is rounded to float32 where it is used as one,
        # and stays exact where promotion makes it a float64
        const = P.Const(e.value, DType.FLOAT32)
        if _float32_overflows(e.value):
            self.scope.wide_literals.append((const, e.span))
        return const

    def _BoolLit(self, e: S.BoolLit, guard) -> P.Expr:
        return P.Const(e.value, DType.BOOL)

    def _Name(self, e: S.Name, guard) -> P.Expr:
        scope = self.scope
        if e.name in scope.lets:
            return self._inline_let(e, guard)
        if e.name in scope.tensors:
            info = scope.tensors[e.name]
            if info.rank != 0:
                raise error(f"{e.name} is a tensor of rank {info.rank}; read one element",
                            e.span, hint=_rank_hint(e.name, info.rank))
            return self.read(S.Apply(e.name, e.span, (), e.span), guard)
        if e.name in scope.sizes:
            return P.SizeValue(e.name)
        if e.name in BUILTINS:
            raise error(f"{e.name} is a builtin function; call it with arguments", e.span,
                        hint=f"write {e.name}(x)")
        scope.index_spans.setdefault(e.name, e.span)
        return P.IndexValue(e.name)

    def _Apply(self, e: S.Apply, guard) -> P.Expr:
        scope = self.scope
        if e.name in scope.tensors:
            return self.read(e, guard)
        if e.name in BUILTINS:
            return self._call(e, guard)
        if e.name in scope.sizes or e.name in scope.lets:
            what = "a size" if e.name in scope.sizes else "a where-local value"
            raise error(f"{e.name} is {what}, not a tensor or function", e.name_span,
                        hint=f"use it without parentheses: {e.name}")
        if e.name in scope.later_targets:
            raise self._unwritten(e.name, e.name_span)
        known = list(scope.tensors) + list(BUILTINS)
        close = difflib.get_close_matches(e.name, known, n=1)
        hint = f"did you mean {close[0]}?" if close else \
            "tensors are the definition's parameters and the tensors its statements write"
        raise error(f"unknown tensor or function '{e.name}'", e.name_span, hint=hint)

    def _CastExpr(self, e: S.CastExpr, guard) -> P.Expr:
        return cast_finite(self.expr(e.operand, guard), parse_type_name(e.type_name), e.span)

    def _UnaryExpr(self, e: S.UnaryExpr, guard) -> P.Expr:
        x = self.expr(e.operand, guard)
        if e.op == "!":
            self._need_bool(x, e.operand, "!")
            return P.Unary("not", x, DType.BOOL)
        dtype = DType.INT32 if x.dtype is DType.BOOL else x.dtype
        x = cast(x, dtype)
        if isinstance(x, P.Const):  # a float negates exactly: a literal keeps its value
            value = -x.value if dtype.is_float else convert_constant(-x.value, dtype)
            negated = P.Const(value, dtype)
            self.scope.wide_literals += [(negated, span) for const, span in
                                         self.scope.wide_literals if const is x]
            return negated
        return P.Unary("neg", x, dtype)

    def _BinaryExpr(self, e: S.BinaryExpr, guard) -> P.Expr:
        a, b = self.expr(e.lhs, guard), self.expr(e.rhs, guard)
        if e.op in ("&&", "||"):
            self._need_bool(a, e.lhs, e.op)
            self._need_bool(b, e.rhs, e.op)
            return P.Binary("and" if e.op == "&&" else "or", a, b, DType.BOOL)
        dtype = promote(a.dtype, b.dtype)
        if e.op in _COMPARE:
            return P.Compare(_COMPARE[e.op], cast(a, dtype), cast(b, dtype))
        if dtype is DType.BOOL:
            dtype = DType.INT32  # arithmetic on booleans counts in int32
        return P.Binary(_ARITH[e.op], cast(a, dtype), cast(b, dtype), dtype)

    def _TernaryExpr(self, e: S.TernaryExpr, guard) -> P.Expr:
        cond = self.expr(e.cond, guard)
        self._need_bool(cond, e.cond, "?:")
        affine_cond = self.condition(e.cond)
        then_guard = other_guard = guard
        if affine_cond is not None:  # reads in the branches are guarded by the condition
            then_guard = condition_and(guard, affine_cond)
            other_guard = condition_and(guard, condition_not(affine_cond))
        a, b = self.expr(e.then, then_guard), self.expr(e.other, other_guard)
        dtype = promote(a.dtype, b.dtype)
        return P.Select(cond, cast(a, dtype), cast(b, dtype), dtype)

    def _call(self, e: S.Apply, guard) -> P.Expr:
        builtin = BUILTINS[e.name]
        if len(e.args) != builtin.arity:
            raise error(f"{e.name} takes {builtin.arity} argument"
                        f"{'s' if builtin.arity != 1 else ''}, not {len(e.args)}", e.span)
        args = [self.expr(a, guard) for a in e.args]
        for arg, syntax_arg in zip(args, e.args):
            if arg.dtype is DType.BOOL and builtin.kind == "math":
                raise error(f"{e.name} needs a number, not a bool", _span_of(syntax_arg),
                            hint="convert it with float(...)")
        dtype = builtin.result_type(tuple(a.dtype for a in args))
        return P.Call(e.name, tuple(cast(a, dtype) for a in args), dtype)

    # ---- helpers ----
    def _inline_let(self, e: S.Name, guard) -> P.Expr:
        if e.name in self.scope.inlining:
            chain = " -> ".join(self.scope.inlining + [e.name])
            raise error(f"the where-local {e.name} is defined in terms of itself ({chain})",
                        e.span)
        self.scope.inlining.append(e.name)
        try:
            return self.expr(self.scope.lets[e.name], guard)
        finally:
            self.scope.inlining.pop()

    def _need_bool(self, x: P.Expr, syntax_expr: S.Expr, op: str) -> None:
        if x.dtype is not DType.BOOL:
            raise error(f"'{op}' needs a bool operand, but this is {x.dtype.value}",
                        _span_of(syntax_expr), hint="compare it, e.g. (x != 0)")

    def _unwritten(self, name: str, span: Span) -> TCSemanticError:
        if name == self.scope.target:
            return error(f"{name} is read before any statement writes it", span,
                         hint="a tensor's first statement cannot read it; use `+=` to "
                              "accumulate into the initial contents, or another tensor")
        return error(f"{name} is read before any statement writes it", span,
                     hint="statements take effect in program order; move the statement "
                          f"that writes {name} above this one")

    # ---- affine meaning ----
    def affine(self, e: S.Expr) -> Affine | None:
        """The quasi-affine form of an integer expression, or None if it has none."""
        match e:
            case S.IntLit(value=v):
                return Affine.of_size(Z.const(v))
            case S.Name(name=n) if n in self.scope.lets:
                return self._let_affine(n)
            case S.Name(name=n) if n in self.scope.sizes:
                return Affine.of_size(Z.size(n))
            case S.Name(name=n) if self.scope.is_index(n):
                return Affine.index(n)
            case S.UnaryExpr(op="-", operand=x):
                inner = self.affine(x)
                return inner.scale(-1) if inner is not None else None
            case S.BinaryExpr(op=op, lhs=a, rhs=b) if op in "+-*/%":
                return self._affine_binary(op, self.affine(a), self.affine(b))
            case S.CastExpr(type_name=t, operand=x) if parse_type_name(t).is_int:
                return self.affine(x)
        return None

    def _let_affine(self, name: str) -> Affine | None:
        if name in self.scope.inlining:
            return None
        self.scope.inlining.append(name)
        try:
            return self.affine(self.scope.lets[name])
        finally:
            self.scope.inlining.pop()

    @staticmethod
    def _affine_binary(op: str, a: Affine | None, b: Affine | None) -> Affine | None:
        return affine_binary(op, a, b)

    def condition(self, e: S.Expr) -> Condition | None:
        """The affine meaning of a boolean expression, or None if it depends on data."""
        match e:
            case S.BoolLit(value=v):
                return Truth(v)
            case S.UnaryExpr(op="!", operand=x):
                inner = self.condition(x)
                return Logic("not", (inner,)) if inner is not None else None
            case S.BinaryExpr(op=op, lhs=a, rhs=b) if op in ("&&", "||"):
                ca, cb = self.condition(a), self.condition(b)
                if ca is None or cb is None:
                    return None
                return Logic("and" if op == "&&" else "or", (ca, cb))
            case S.BinaryExpr(op=op, lhs=a, rhs=b) if op in _COMPARE:
                aa, ab = self.affine(a), self.affine(b)
                if aa is None or ab is None:
                    return None
                return Compare(op, aa - ab)
            case S.Name(name=n) if n in self.scope.lets:
                if n in self.scope.inlining:
                    return None
                self.scope.inlining.append(n)
                try:
                    return self.condition(self.scope.lets[n])
                finally:
                    self.scope.inlining.pop()
        return None


def _rank_hint(name: str, rank: int) -> str:
    if rank == 0:
        return f"{name} is a scalar: write {name} or {name}()"
    letters = "ijklmnpqrs"[:rank]
    return f"write {name}({', '.join(letters)})"


def _span_of(e: S.Expr) -> Span:
    return e.span
