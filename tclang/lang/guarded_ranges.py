"""Ranges from guarded reads whose guard constrains the index itself (issue 35, item 1).

`O(i) = (i < M) ? A(i) : B(i - M)` (a concatenation along i) has no unguarded read of i,
and each read is guarded by a condition on i. The values of i at which the expression is
defined are those where the guard holds and the `then` branch reads in bounds, together
with those where it fails and the `else` branch does: the hull of the two is i's range.

`region` computes, for one unknown index, an interval holding every value at which an
expression can be evaluated with its reads in bounds (the other indices' ranges known):
reads bound it by their subscripts, `?:` with an affine condition by the hull of each
branch's region within the condition (or its negation), everything else by the
intersection of its operands' regions. A side with no bound is None. Range inference uses
it last, after TC's rounds, the target's extent and the guard-free subscripts of guarded
reads, so no program TC accepted changes its ranges. What it gives is not trusted further
than any range: every read is checked exactly, under its guard, when a kernel is compiled.
"""

from __future__ import annotations

from typing import Callable, Mapping

from tclang.lang import program as P
from tclang.lang import sizes as Z
from tclang.lang.affine import Affine, Compare, Condition, Interval, Logic, Truth
from tclang.lang.guarded_sums import affine_condition

Side = Z.SizeExpr | None  # None: unbounded on that side
Region = tuple[Side, Side]

_EVERYWHERE: Region = (None, None)
_NEGATED = {"<": ">=", "<=": ">", ">": "<=", ">=": "<", "==": "!=", "!=": "=="}


def region(e: P.Expr, index: str, known: Mapping[str, Interval],
           shape: Callable[[str], tuple | None]) -> Region:
    """An interval of `index` outside which `e` cannot be evaluated in bounds."""
    if isinstance(e, P.Select):
        cond = affine_condition(e.cond)
        if cond is not None:
            then = _meet(region(e.then, index, known, shape),
                         _condition(cond, index, known, False))
            other = _meet(region(e.other, index, known, shape),
                          _condition(cond, index, known, True))
            return _join(then, other)
    found = _EVERYWHERE
    if isinstance(e, P.Read):
        extents = shape(e.tensor)
        for dim, a in enumerate(e.affine):
            if a is None or extents is None or index not in a.indices() or \
                    not a.indices() - {index} <= set(known):
                continue
            solved = a.solve(index, Z.const(0), extents[dim] - 1, known)
            if solved is not None:
                found = _meet(found, solved)
    for child in P.children(e):
        found = _meet(found, region(child, index, known, shape))
    return found


def _condition(c: Condition, index: str, known: Mapping[str, Interval],
               negate: bool) -> Region:
    """An interval holding every value of `index` at which `c` (or `not c`) can hold."""
    if isinstance(c, Truth):
        return _EVERYWHERE
    if isinstance(c, Logic):
        if c.op == "not":
            return _condition(c.args[0], index, known, not negate)
        parts = [_condition(a, index, known, negate) for a in c.args]
        conjunction = (c.op == "and") != negate  # De Morgan
        result = parts[0]
        for p in parts[1:]:
            result = _meet(result, p) if conjunction else _join(result, p)
        return result
    op = _NEGATED[c.op] if negate else c.op
    a = c.lhs
    coef = a.coefficient(index)
    rest = Affine(tuple(t for t in a.terms if t[0] != index), a.offset)
    if coef == 0 or index in rest.indices() or not rest.indices() <= set(known) \
            or op == "!=":
        return _EVERYWHERE
    rlo, rhi = rest.interval(known)
    # coef*index + rest op 0, for some value of rest in [rlo, rhi]
    if op in ("<", "<="):
        limit = -rlo - (1 if op == "<" else 0)  # coef*index <= limit
        return _scaled_upper(coef, limit)
    if op in (">", ">="):
        limit = -rhi + (1 if op == ">" else 0)  # coef*index >= limit
        return _scaled_lower(coef, limit)
    return _meet(_scaled_upper(coef, -rlo), _scaled_lower(coef, -rhi))  # ==


def _scaled_upper(coef: int, limit: Z.SizeExpr) -> Region:
    """The values with coef * x <= limit."""
    if coef > 0:
        return None, Z.floordiv(limit, coef)
    return -Z.floordiv(limit, -coef), None  # x >= ceil(-limit / -coef)


def _scaled_lower(coef: int, limit: Z.SizeExpr) -> Region:
    """The values with coef * x >= limit."""
    if coef > 0:
        return -Z.floordiv(-limit, coef), None
    return None, Z.floordiv(-limit, -coef)


def _meet(a: Region, b: Region) -> Region:
    lo = a[0] if b[0] is None else b[0] if a[0] is None else Z.maximum(a[0], b[0])
    hi = a[1] if b[1] is None else b[1] if a[1] is None else Z.minimum(a[1], b[1])
    return lo, hi


def _join(a: Region, b: Region) -> Region:
    lo = None if a[0] is None or b[0] is None else Z.minimum(a[0], b[0])
    hi = None if a[1] is None or b[1] is None else Z.maximum(a[1], b[1])
    return lo, hi
