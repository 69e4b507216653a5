"""Factors a sum does not need per term are applied once per result, after the sum.

Attention written as one definition scales every product of its two contractions:

    Sc(s, t) +=! Q(s, d) * K(t, d) * 0.125          (a multiply per term)
    O(s, e)  +=! Ex(s, t) * V(t, e) / Sm(s)          (a division per term)

The factor does not move along the reduction, so the micro-kernel pays a multiply or a
division (several times an FMA's cost) per term for nothing. Before scheduling, each
`+=!` sum whose value is `core * c`, `c * core` or `core / c`, with `c` invariant along the
reduction indices, becomes the sum of `core` followed by one assignment:

    X(i) +=! core * c          ->   X(i) +=! core;   X(i) = X(i) * c

(repeatedly, outermost factor first). In real arithmetic the two are equal; in floating
point they round differently, like any reordering of a sum, so it is done only where
reductions may be reordered (`Options(reorder_reductions=False)` keeps the program as
written). An empty sum is 0 either way only if the factor is finite (and, dividing, not
zero), so a factor that reads tensors is taken out only when the sizes are known and
every reduction range is non-empty and no condition restricts the sum (a guarded sum's
condition can leave a point without terms, and it guards the factor's reads); a constant
one always (but never a zero divisor).
Only `+=!` is rewritten: `+=` adds to the value already in the target, which must not be
scaled. The new statement keeps the original's text and span.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Mapping

import numpy as np

from tclang.lang import program as P
from tclang.lang.affine import Affine, condition_indices
from tclang.dtypes import DType
from tclang.lang.sizes import known_value

FLOATS = (DType.FLOAT32, DType.FLOAT64)


def factor_out_scales(defn: P.Definition, sizes: Mapping[str, int] | None) -> P.Definition:
    """`defn` with the invariant factors of its `+=!` sums applied after each sum."""
    statements: list[P.Statement] = []
    changed = False
    for s in defn.statements:
        core, factors = _split(defn, s, sizes)
        if not factors:
            statements.append(s)
            continue
        changed = True
        statements.append(replace(s, rhs=core))
        statements.append(_epilogue(defn, s, factors))
    if not changed:
        return defn
    numbered = tuple(replace(s, position=k) for k, s in enumerate(statements))
    return replace(defn, statements=numbered)


def _split(defn: P.Definition, s: P.Statement, sizes) -> tuple[P.Expr, list]:
    """(the per-term core of `s`, the (op, factor) pairs peeled off it, outermost last)."""
    dtype = defn.tensor(s.target).dtype
    if s.op != "+" or not s.reset or not s.reduction_indices or dtype not in FLOATS:
        return s.rhs, []
    # a guarded sum (tclang/lang/guarded_sums.py) may have no term at a point whose
    # ranges are not empty, and its condition guards the factor's reads: reads stay in
    reads_allowed = sizes is not None and s.condition is None and all(
        _known_nonempty(r, sizes) for r in s.domain if r.name in s.reduction_indices)
    core, factors = s.rhs, []
    while isinstance(core, P.Binary) and core.dtype is dtype:
        if core.op == "mul" and _invariant(core.rhs, s, reads_allowed, divisor=False):
            factors.append(("mul", core.rhs))
            core = core.lhs
        elif core.op == "mul" and _invariant(core.lhs, s, reads_allowed, divisor=False):
            factors.append(("mul", core.lhs))
            core = core.rhs
        elif core.op == "div" and _invariant(core.rhs, s, reads_allowed, divisor=True):
            factors.append(("div", core.rhs))
            core = core.lhs
        else:
            break
    if core.dtype is not dtype:
        return s.rhs, []
    return core, list(reversed(factors))


def _invariant(e: P.Expr, s: P.Statement, reads_allowed: bool, divisor: bool) -> bool:
    """Whether `e` is the same for every term of the sum `s` (and safe to apply once)."""
    if isinstance(e, P.Const):
        with np.errstate(over="ignore"):
            value = np.asarray(e.value, dtype=e.dtype.numpy) if e.dtype in FLOATS else None
        return value is not None and bool(np.isfinite(value)) and not (divisor and value == 0)
    if not reads_allowed:
        return False
    for node in P.walk(e):
        if isinstance(node, P.IndexValue) and node.name in s.reduction_indices:
            return False
        if isinstance(node, P.Read) and (node.tensor == s.target or _guard_varies(node, s)):
            return False
    return True


def _guard_varies(read: P.Read, s: P.Statement) -> bool:
    """Whether a read's guard names a reduction index of `s`: the guard is not a node of
    the tree (P.walk never meets its indices), and once guarded_sums.py has taken the `?:`
    into the statement's condition it is all that says the read depends on them."""
    return read.guard is not None and bool(condition_indices(read.guard) &
                                           set(s.reduction_indices))


def _epilogue(defn: P.Definition, s: P.Statement, factors: list) -> P.Statement:
    """`X(i) = X(i) op1 c1 op2 c2 ...` at the left-side indices of sum `s`."""
    dtype = defn.tensor(s.target).dtype
    value: P.Expr = P.Read(s.target, tuple(P.IndexValue(i) for i in s.indices),
                           tuple(Affine.index(i) for i in s.indices), None, 0, dtype, s.span)
    for op, factor in factors:
        value = P.Binary(op, value, factor, dtype)
    lhs_domain = tuple(r for r in s.domain if r.name in s.indices)
    return replace(s, op="=", reset=False, rhs=_renumbered(value), reduction_indices=(),
                   domain=lhs_domain, exists=(), condition=None)  # (at every point)


def _renumbered(e: P.Expr) -> P.Expr:
    """`e` with its reads' `ref` numbers 0, 1, ... in source order (each statement's own)."""
    counter = iter(range(1 << 30))

    def visit(x: P.Expr) -> P.Expr:
        match x:
            case P.Read(subscripts=subs):
                return replace(x, ref=next(counter),
                               subscripts=tuple(visit(y) for y in subs))
            case P.Unary(operand=y) | P.Cast(operand=y):
                return replace(x, operand=visit(y))
            case P.Binary(lhs=a, rhs=b) | P.Compare(lhs=a, rhs=b):
                return replace(x, lhs=visit(a), rhs=visit(b))
            case P.Select(cond=c, then=t, other=o):
                return replace(x, cond=visit(c), then=visit(t), other=visit(o))
            case P.Call(args=args):
                return replace(x, args=tuple(visit(y) for y in args))
        return x

    return visit(e)


def _known_nonempty(r, sizes) -> bool:
    """Whether a range is known to be non-empty for `sizes` (False where it names a size
    `sizes` does not give: a partly generic compile)."""
    hi, lo = known_value(r.hi, sizes), known_value(r.lo, sizes)
    return hi is not None and lo is not None and hi > lo
