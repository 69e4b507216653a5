"""Symbolic integer expressions in the size names: extents, range bounds, output shapes.

An expression is a polynomial in the size names with integer coefficients, a floor division
of one by a positive constant, or a min/max of several. Construction simplifies to a
canonical form, so two expressions that print the same are equal, and `(H - KH + 2) / 2`
comes out as `(H - KH) / 2 + 1`. Sizes are assumed to be at least 1 when reasoning "for
all sizes" (`bounds`); `evaluate` gives the value for concrete sizes.
"""

from __future__ import annotations

import functools
import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Mapping

Monomial = tuple[str, ...]  # sorted size names, repeated for powers; () is the constant


def _floordiv(a: int, b: int) -> int:
    return a // b


class SizeExpr(ABC):
    """Base class; subclasses are frozen dataclasses in canonical form."""

    def __add__(self, other: "SizeExpr | int") -> "SizeExpr":
        return add(self, as_size(other))

    __radd__ = __add__

    def __sub__(self, other: "SizeExpr | int") -> "SizeExpr":
        other = as_size(other)
        if type(self) is Poly and type(other) is Poly:  # the common case, kept fast
            terms = dict(self.terms)
            for m, c in other.terms:
                terms[m] = terms.get(m, 0) - c
            return _poly(terms)
        return add(self, mul(other, const(-1)))

    def __rsub__(self, other: int) -> "SizeExpr":
        return add(as_size(other), mul(self, const(-1)))

    def __mul__(self, other: "SizeExpr | int") -> "SizeExpr":
        return mul(self, as_size(other))

    __rmul__ = __mul__

    def __neg__(self) -> "SizeExpr":
        return mul(self, const(-1))

    def floordiv(self, divisor: int) -> "SizeExpr":
        return floordiv(self, divisor)

    @property
    def constant(self) -> int | None:
        """The value if the expression does not depend on any size."""
        return None

    @abstractmethod
    def names(self) -> frozenset[str]: ...

    @abstractmethod
    def evaluate(self, sizes: Mapping[str, int]) -> int: ...

    @abstractmethod
    def bounds(self) -> tuple[float, float]:
        """(lowest, highest) value over all sizes >= 1; infinities where unbounded."""


@dataclass(frozen=True)
class Poly(SizeExpr):
    terms: tuple[tuple[Monomial, int], ...]  # sorted, no zero coefficients

    @property
    def constant(self) -> int | None:
        terms = self.terms
        if not terms:
            return 0
        if len(terms) == 1 and not terms[0][0]:
            return terms[0][1]
        return None

    def coefficient(self, monomial: Monomial) -> int:
        return dict(self.terms).get(monomial, 0)

    def names(self) -> frozenset[str]:
        return frozenset(n for m, _ in self.terms for n in m)

    def evaluate(self, sizes: Mapping[str, int]) -> int:
        return sum(c * math.prod(sizes[n] for n in m) for m, c in self.terms)

    def bounds(self) -> tuple[float, float]:
        const_term = self.coefficient(())
        pos = [c for m, c in self.terms if m and c > 0]
        neg = [c for m, c in self.terms if m and c < 0]
        low = -math.inf if neg else const_term + sum(pos)
        high = math.inf if pos else const_term + sum(neg)
        return low, high

    def __str__(self) -> str:
        return _format_poly(self)


@dataclass(frozen=True)
class FloorDiv(SizeExpr):
    numerator: SizeExpr
    divisor: int  # > 1

    def names(self) -> frozenset[str]:
        return self.numerator.names()

    def evaluate(self, sizes: Mapping[str, int]) -> int:
        return _floordiv(self.numerator.evaluate(sizes), self.divisor)

    def bounds(self) -> tuple[float, float]:
        low, high = self.numerator.bounds()
        return (_div_bound(low, self.divisor), _div_bound(high, self.divisor))

    def __str__(self) -> str:
        inner = str(self.numerator)
        if not isinstance(self.numerator, Poly) or len(self.numerator.terms) > 1:
            inner = f"({inner})"
        return f"{inner} / {self.divisor}"


@dataclass(frozen=True)
class MinMax(SizeExpr):
    kind: str  # "min" or "max"
    args: tuple[SizeExpr, ...]  # at least two, no duplicates, sorted by text

    def names(self) -> frozenset[str]:
        return frozenset().union(*(a.names() for a in self.args))

    def evaluate(self, sizes: Mapping[str, int]) -> int:
        values = [a.evaluate(sizes) for a in self.args]
        return min(values) if self.kind == "min" else max(values)

    def bounds(self) -> tuple[float, float]:
        lows, highs = zip(*(a.bounds() for a in self.args))
        pick = min if self.kind == "min" else max
        return pick(lows), pick(highs)

    def __str__(self) -> str:
        return f"{self.kind}({', '.join(str(a) for a in self.args)})"


@dataclass(frozen=True)
class Sum(SizeExpr):
    """A polynomial part plus floor divisions and min/max terms, each with a coefficient."""

    poly: Poly
    parts: tuple[tuple[SizeExpr, int], ...]  # non-Poly terms, sorted by text

    def names(self) -> frozenset[str]:
        return self.poly.names().union(*(p.names() for p, _ in self.parts))

    def evaluate(self, sizes: Mapping[str, int]) -> int:
        return self.poly.evaluate(sizes) + sum(c * p.evaluate(sizes) for p, c in self.parts)

    def bounds(self) -> tuple[float, float]:
        low, high = self.poly.bounds()
        parts = list(self.parts)
        for (a, b), (lo_ab, hi_ab) in _floor_pairs(parts):
            parts.remove((a, 1))
            parts.remove((b, -1))
            low, high = low + lo_ab, high + hi_ab
        for part, coef in parts:
            plo, phi = part.bounds()
            a, b = _scale(plo, coef), _scale(phi, coef)
            low, high = low + min(a, b), high + max(a, b)
        return low, high

    def __str__(self) -> str:
        pieces = []
        for part, coef in self.parts:
            text = str(part)
            if abs(coef) != 1:
                text = f"{abs(coef)}*{text}" if not isinstance(part, FloorDiv) else \
                    f"{abs(coef)}*({text})"
            pieces.append(("-" if coef < 0 else "+", text))
        poly_text = str(self.poly) if self.poly.terms else ""
        out = ""
        first = True
        for sign, text in pieces:
            if first:
                out = ("-" if sign == "-" else "") + text
                first = False
            else:
                out += f" {sign} {text}"
        if poly_text:
            if poly_text.startswith("-"):
                out += f" - {poly_text[1:]}" if out else poly_text
            else:
                out = f"{out} + {poly_text}" if out else poly_text
        return _tidy_signs(out)


def _floor_pairs(parts):
    """Pairs floor(p/d) - floor(q/d) with p - q = c constant: bounded by c/d, rounded."""
    plus = [p for p, c in parts if c == 1 and isinstance(p, FloorDiv)]
    minus = [p for p, c in parts if c == -1 and isinstance(p, FloorDiv)]
    pairs = []
    for a in plus:
        for b in minus:
            diff = (a.numerator - b.numerator).constant
            if a.divisor == b.divisor and diff is not None:
                low = diff // a.divisor
                pairs.append(((a, b), (low, low if diff % a.divisor == 0 else low + 1)))
                minus.remove(b)
                break
    return pairs


def _tidy_signs(text: str) -> str:
    return text.replace("+ -", "- ").replace("- -", "+ ")


def _scale(value: float, coef: int) -> float:
    if math.isinf(value):
        return value if coef > 0 else -value
    return value * coef


def _div_bound(value: float, divisor: int) -> float:
    return value if math.isinf(value) else math.floor(value / divisor)


def _format_poly(p: Poly) -> str:
    if not p.terms:
        return "0"
    pieces = []
    for monomial, coef in sorted(p.terms, key=lambda t: (t[0] == (), t[1] < 0, t[0])):
        names = "*".join(monomial)
        if not monomial:
            body, sign = str(abs(coef)), coef < 0
        elif abs(coef) == 1:
            body, sign = names, coef < 0
        else:
            body, sign = f"{abs(coef)}*{names}", coef < 0
        pieces.append((sign, body))
    text = ("-" if pieces[0][0] else "") + pieces[0][1]
    for sign, body in pieces[1:]:
        text += f" {'-' if sign else '+'} {body}"
    return text


# ---- construction and simplification ----------------------------------------------------

@functools.lru_cache(maxsize=4096)
def const(value: int) -> Poly:
    return Poly(((((), int(value)),) if value else ()))


@functools.lru_cache(maxsize=4096)
def size(name: str) -> Poly:
    return Poly((((name,), 1),))


def as_size(value: "SizeExpr | int") -> SizeExpr:
    return value if isinstance(value, SizeExpr) else const(value)


def _poly(terms: dict[Monomial, int]) -> Poly:
    return Poly(tuple(sorted(item for item in terms.items() if item[1])))


def _split(e: SizeExpr) -> tuple[Poly, dict[SizeExpr, int]]:
    """An expression as (polynomial part, {other part: coefficient})."""
    if isinstance(e, Poly):
        return e, {}
    if isinstance(e, Sum):
        return e.poly, dict(e.parts)
    return const(0), {e: 1}


def _join(poly: Poly, parts: dict[SizeExpr, int]) -> SizeExpr:
    parts = {p: c for p, c in parts.items() if c}
    if not parts:
        return poly
    if not poly.terms and len(parts) == 1:
        (part, coef), = parts.items()
        if coef == 1:
            return part
    return Sum(poly, tuple(sorted(parts.items(), key=lambda pc: str(pc[0]))))


def add(a: SizeExpr, b: SizeExpr) -> SizeExpr:
    if type(a) is Poly and type(b) is Poly:  # the common case, kept fast
        if not b.terms:
            return a
        if not a.terms:
            return b
        terms = dict(a.terms)
        for m, c in b.terms:
            terms[m] = terms.get(m, 0) + c
        return _poly(terms)
    pa, xa = _split(a)
    pb, xb = _split(b)
    terms = dict(pa.terms)
    for m, c in pb.terms:
        terms[m] = terms.get(m, 0) + c
    parts = dict(xa)
    for p, c in xb.items():
        parts[p] = parts.get(p, 0) + c
    return _join(_poly(terms), parts)


def mul(a: SizeExpr, b: SizeExpr) -> SizeExpr:
    if b.constant is not None:
        a, b = b, a
    k = a.constant
    if k is not None:
        if k == 1:
            return b
        if k == 0:
            return const(0)
        if type(b) is Poly:
            return Poly(tuple((m, c * k) for m, c in b.terms))
        pb, xb = _split(b)
        return _join(_poly({m: c * k for m, c in pb.terms}), {p: c * k for p, c in xb.items()})
    if isinstance(a, Poly) and isinstance(b, Poly):
        terms: dict[Monomial, int] = {}
        for ma, ca in a.terms:
            for mb, cb in b.terms:
                m = tuple(sorted(ma + mb))
                terms[m] = terms.get(m, 0) + ca * cb
        return _poly(terms)
    raise ValueError(f"cannot multiply {a} by {b}: only polynomials multiply")


def floordiv(a: SizeExpr, divisor: int) -> SizeExpr:
    """floor(a / divisor) for a positive constant divisor, with multiples pulled out."""
    if divisor <= 0:
        raise ValueError("a size can only be divided by a positive constant")
    if divisor == 1:
        return a
    poly, parts = _split(a)
    if parts:
        return FloorDiv(a, divisor)
    whole = {m: c // divisor for m, c in poly.terms if c % divisor == 0}
    rest = {m: c for m, c in poly.terms if c % divisor != 0}
    if not rest:
        return _poly(whole)
    c0 = rest.pop((), 0)
    if not rest:  # floor((divisor*p + c0) / divisor) = p + floor(c0 / divisor)
        return add(_poly(whole), const(c0 // divisor))
    # canonical: the constant left inside the division lies in (-divisor, 0], which
    # prints the familiar forms `(H - KH) / 2 + 1` and `(H - 1) / 2`
    q, r = divmod(c0, divisor)
    if r > 0:
        q, r = q + 1, r - divisor
    whole[()] = whole.get((), 0) + q
    rest[()] = r
    return add(_poly(whole), FloorDiv(_poly(rest), divisor))


def minimum(*args: SizeExpr) -> SizeExpr:
    return _minmax("min", args)


def maximum(*args: SizeExpr) -> SizeExpr:
    return _minmax("max", args)


def _minmax(kind: str, args) -> SizeExpr:
    if len(args) == 2 and args[0] == args[1]:
        return as_size(args[0])
    flat: list[SizeExpr] = []
    for a in args:
        a = as_size(a)
        if isinstance(a, MinMax) and a.kind == kind:
            flat.extend(a.args)
        else:
            flat.append(a)
    kept: list[SizeExpr] = []
    for a in flat:
        if any(_dominates(kind, k, a) for k in kept):
            continue
        kept = [k for k in kept if not _dominates(kind, a, k)]
        kept.append(a)
    if len(kept) == 1:
        return kept[0]
    return MinMax(kind, tuple(sorted(kept, key=str)))


def _dominates(kind: str, a: SizeExpr, b: SizeExpr) -> bool:
    """Whether `a` makes `b` redundant in min/max(a, b) for all sizes >= 1.

    Intervals alone lose the link between a term and itself (`max(N - 1, min(1, N - 1))`
    bounds `N - 1 - min(1, N - 1)` below by -1), so a min/max of the other kind is looked
    into first: a >= min(x, y) where a >= x, and min(x, y) >= b where both are."""
    if isinstance(b, MinMax) and b.kind != kind and any(_dominates(kind, a, x) for x in b.args):
        return True
    if isinstance(a, MinMax) and a.kind != kind and all(_dominates(kind, x, b) for x in a.args):
        return True
    low, high = (a - b).bounds()
    return high <= 0 if kind == "min" else low >= 0


def pieces(e: SizeExpr, kind: str) -> list[SizeExpr]:
    """`e` as the min (kind "min") or the max (kind "max") of expressions with no such min
    or max left at their top: `min(K - 1, W) + 1` is min(K, W + 1), `N - max(A, B)` is
    min(N - A, N - B). So `x < e` is the conjunction of `x < p` over the pieces of a min,
    and `x >= e` of `x >= p` over those of a max: a guard written so stays affine, where a
    `min(...)` in it is a call the language does not read as a bound."""
    poly, parts = _split(e)
    for part, coef in parts.items():
        if isinstance(part, MinMax) and (coef, part.kind) in ((1, kind), (-1, _OTHER[kind])):
            rest = _join(poly, {p: c for p, c in parts.items() if p is not part})
            return [x for a in part.args for x in pieces(add(rest, a * coef), kind)]
    return [e]


_OTHER = {"min": "max", "max": "min"}


def definitely(e: SizeExpr, relation: str) -> bool:
    """Whether `e <relation> 0` holds for all sizes >= 1 (relation: <, <=, >, >=, ==)."""
    low, high = e.bounds()
    return {"<": high < 0, "<=": high <= 0, ">": low > 0, ">=": low >= 0,
            "==": low == high == 0}[relation]


def substitute(e: SizeExpr, values: Mapping[str, int]) -> SizeExpr:
    """`e` with each size that `values` names replaced by its value, the others kept: the
    size expressions of a compile generic in some sizes and specialized in the rest."""
    if not values or not (e.names() & values.keys()):
        return e
    if isinstance(e, Poly):
        total: SizeExpr = const(0)
        for monomial, coef in e.terms:
            term: SizeExpr = const(coef * math.prod(values[n] for n in monomial if n in values))
            for name in monomial:
                if name not in values:
                    term = mul(term, size(name))
            total = add(total, term)
        return total
    if isinstance(e, FloorDiv):
        return floordiv(substitute(e.numerator, values), e.divisor)
    if isinstance(e, MinMax):
        return _minmax(e.kind, tuple(substitute(a, values) for a in e.args))
    if isinstance(e, Sum):
        total = substitute(e.poly, values)
        for part, coef in e.parts:
            total = add(total, mul(const(coef), substitute(part, values)))
        return total
    raise TypeError(e)


def known_value(e: SizeExpr, values: Mapping[str, int] | None) -> int | None:
    """`e`'s value where `values` gives every size it names, else None (a generic size)."""
    if values is None or not e.names() <= values.keys():
        return None
    return e.evaluate(values)
