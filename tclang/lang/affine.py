"""Quasi-affine index expressions: what subscripts and guards mean to the compiler.

A subscript such as `2*h + kh`, `N - 1 - i`, `i / 2` or `i % 3` is a sum of index terms
with integer coefficients, floor divisions or moduli of such sums by positive constants, and
an offset in the sizes. Range inference solves these for one unknown index at a time; the
polyhedral layer prints them in isl's syntax (polyhedral/scop.py) and lowers them to the
loop IR's index expressions (polyhedral/subscripts.py). Anything else (a product of
indices, a gather) has no affine form and is checked at run time instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from tclang.lang import sizes as Z
from tclang.lang.sizes import SizeExpr

Interval = tuple[SizeExpr, SizeExpr]  # inclusive bounds


@dataclass(frozen=True)
class Div:
    """floor(inner / divisor) when kind == 'div', inner mod divisor when kind == 'mod'."""

    inner: "Affine"
    divisor: int
    kind: str

    def __str__(self) -> str:
        op = "/" if self.kind == "div" else "%"
        return f"({self.inner}) {op} {self.divisor}"


Atom = str | Div


@dataclass(frozen=True)
class Affine:
    terms: tuple[tuple[Atom, int], ...]  # no zero coefficients, in a canonical order
    offset: SizeExpr

    # ---- construction ----
    @staticmethod
    def index(name: str) -> "Affine":
        return Affine(((name, 1),), Z.const(0))

    @staticmethod
    def of_size(e: SizeExpr) -> "Affine":
        return Affine((), e)

    def __add__(self, other: "Affine") -> "Affine":
        terms = dict(self.terms)
        for atom, coef in other.terms:
            terms[atom] = terms.get(atom, 0) + coef
        return _make(terms, self.offset + other.offset)

    def scale(self, k: int) -> "Affine":
        return _make({a: c * k for a, c in self.terms}, self.offset * k)

    def __sub__(self, other: "Affine") -> "Affine":
        return self + other.scale(-1)

    def floordiv(self, divisor: int) -> "Affine":
        if not self.terms:
            return Affine.of_size(Z.floordiv(self.offset, divisor))
        if divisor == 1:
            return self
        return Affine(((Div(self, divisor, "div"), 1),), Z.const(0))

    def mod(self, divisor: int) -> "Affine":
        if not self.terms and self.offset.constant is not None:
            return Affine.of_size(Z.const(self.offset.constant % divisor))
        if divisor == 1:
            return Affine.of_size(Z.const(0))
        return Affine(((Div(self, divisor, "mod"), 1),), Z.const(0))

    # ---- queries ----
    def indices(self) -> frozenset[str]:
        out: set[str] = set()
        for atom, _ in self.terms:
            out |= {atom} if isinstance(atom, str) else atom.inner.indices()
        return frozenset(out)

    @property
    def is_linear(self) -> bool:
        """No floor division or modulo: interval bounds are exact over a box."""
        return all(isinstance(a, str) for a, _ in self.terms)

    def coefficient(self, index: str) -> int:
        return dict(self.terms).get(index, 0)

    def evaluate(self, env: Mapping[str, int]) -> int:
        total = self.offset.evaluate(env)
        for atom, coef in self.terms:
            if isinstance(atom, str):
                total += coef * env[atom]
            else:
                inner = atom.inner.evaluate(env)
                value = inner // atom.divisor if atom.kind == "div" else inner % atom.divisor
                total += coef * value
        return total

    def interval(self, ranges: Mapping[str, Interval]) -> Interval:
        """Bounds of the expression when each index lies in its (inclusive) range."""
        if len(self.terms) == 1 and self.terms[0][1] == 1 and self.offset.constant == 0 \
                and isinstance(self.terms[0][0], str):
            return ranges[self.terms[0][0]]  # a plain index: the common case
        lo, hi = self.offset, self.offset
        for atom, coef in self.terms:
            alo, ahi = _atom_interval(atom, ranges)
            if coef > 0:
                lo, hi = lo + alo * coef, hi + ahi * coef
            else:
                lo, hi = lo + ahi * coef, hi + alo * coef
        return lo, hi

    def solve(self, unknown: str, lo: SizeExpr, hi: SizeExpr,
              known: Mapping[str, Interval]) -> Interval | None:
        """The largest range of `unknown` with lo <= self <= hi for all known indices.

        None when the expression does not bound `unknown` (it sits under a modulo) or
        cannot be solved for it (it appears in more than one term).
        """
        if self.terms == ((unknown, 1),) and self.offset.constant == 0:
            return lo, hi  # a plain index: the common case
        holding = [(a, c) for a, c in self.terms
                   if a == unknown or (isinstance(a, Div) and unknown in a.inner.indices())]
        if len(holding) != 1:
            return None
        atom, coef = holding[0]
        rest = Affine(tuple(t for t in self.terms if t[0] != atom), self.offset)
        rlo, rhi = rest.interval(known)
        tlo, thi = lo - rlo, hi - rhi  # coef * atom must lie in [tlo, thi]
        if coef > 0:
            alo, ahi = _ceildiv(tlo, coef), Z.floordiv(thi, coef)
        else:
            alo, ahi = _ceildiv(-thi, -coef), Z.floordiv(-tlo, -coef)
        if isinstance(atom, str):
            return alo, ahi
        if atom.kind == "mod":
            return None
        d = atom.divisor  # floor(inner / d) in [alo, ahi]  <=>  inner in [d*alo, d*ahi + d - 1]
        return atom.inner.solve(unknown, alo * d, ahi * d + (d - 1), known)

    def __str__(self) -> str:
        parts = []
        for atom, coef in self.terms:
            text = str(atom)
            parts.append(text if coef == 1 else f"{coef}*{text}")
        if self.offset.constant != 0 or not parts:
            parts.append(str(self.offset))
        return " + ".join(parts).replace("+ -", "- ")


def affine_binary(op: str, a: Affine | None, b: Affine | None) -> Affine | None:
    """`a op b` (op in + - * / %) where it stays quasi-affine: a product needs a constant
    side (or two size-only sides), / and % a positive constant divisor; else None."""
    if a is None or b is None:
        return None
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        if not b.terms and b.offset.constant is not None:
            return a.scale(b.offset.constant)
        if not a.terms and a.offset.constant is not None:
            return b.scale(a.offset.constant)
        if not a.terms and not b.terms:
            return Affine.of_size(a.offset * b.offset)
        return None
    divisor = b.offset.constant if not b.terms else None
    if divisor is None or divisor <= 0:
        return None
    return a.floordiv(divisor) if op == "/" else a.mod(divisor)


def _make(terms: dict, offset: SizeExpr) -> Affine:
    kept = [(a, c) for a, c in terms.items() if c]
    kept.sort(key=lambda t: (not isinstance(t[0], str), str(t[0])))
    return Affine(tuple(kept), offset)


def _ceildiv(e: SizeExpr, k: int) -> SizeExpr:
    return -Z.floordiv(-e, k)


def _atom_interval(atom: Atom, ranges: Mapping[str, Interval]) -> Interval:
    if isinstance(atom, str):
        return ranges[atom]
    if atom.kind == "mod":
        return Z.const(0), Z.const(atom.divisor - 1)
    lo, hi = atom.inner.interval(ranges)
    return Z.floordiv(lo, atom.divisor), Z.floordiv(hi, atom.divisor)


# ---- affine conditions (guards of `?:` branches) ----------------------------------------

@dataclass(frozen=True)
class Compare:
    """lhs <op> 0 with op in ==, !=, <, <=, >, >=: a comparison of quasi-affine values."""

    op: str
    lhs: Affine


@dataclass(frozen=True)
class Logic:
    op: str  # "and", "or", "not"
    args: tuple["Condition", ...]


@dataclass(frozen=True)
class Truth:
    value: bool


Condition = Compare | Logic | Truth


def condition_and(a: Condition | None, b: Condition) -> Condition:
    if a is None:
        return b
    return Logic("and", (a, b))


def condition_not(a: Condition) -> Condition:
    return Logic("not", (a,))


def condition_indices(c: Condition) -> frozenset[str]:
    if isinstance(c, Compare):
        return c.lhs.indices()
    if isinstance(c, Logic):
        return frozenset().union(*(condition_indices(a) for a in c.args))
    return frozenset()


def condition_holds(c: Condition, env: Mapping[str, int]) -> bool:
    if isinstance(c, Truth):
        return c.value
    if isinstance(c, Logic):
        if c.op == "not":
            return not condition_holds(c.args[0], env)
        values = [condition_holds(a, env) for a in c.args]
        return all(values) if c.op == "and" else any(values)
    v = c.lhs.evaluate(env)
    return {"==": v == 0, "!=": v != 0, "<": v < 0, "<=": v <= 0, ">": v > 0, ">=": v >= 0}[c.op]


def condition_text(c: Condition) -> str:
    """A condition as one line of source-like text (for messages)."""
    if isinstance(c, Truth):
        return "true" if c.value else "false"
    if isinstance(c, Logic):
        if c.op == "not":
            return f"!({condition_text(c.args[0])})"
        joiner = " && " if c.op == "and" else " || "
        parts, stack = [], list(reversed(c.args))  # a flat chain: no nested parentheses
        while stack:
            a = stack.pop()
            if isinstance(a, Logic) and a.op == c.op:
                stack.extend(reversed(a.args))
            else:
                text = condition_text(a)
                parts.append(f"({text})" if isinstance(a, Logic) and a.op != "not" else text)
        return joiner.join(parts)
    lhs, rhs = [], []  # positive terms left, negative terms right: `h - 1 >= 0` -> `h >= 1`
    for atom, coef in c.lhs.terms:
        (lhs if coef > 0 else rhs).append((atom, abs(coef)))
    side = lambda terms, offset: str(Affine(tuple(terms), offset))
    return f"{side(lhs, Z.const(0))} {c.op} {side(rhs, -c.lhs.offset)}"
