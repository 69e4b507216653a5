"""The abstract syntax tree: what the parser produces, before any name or type is checked.

Frozen dataclasses with tuple fields. Every node carries the `Span` of the text it came from,
so every later error can point at the exact place in the user's source.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

from tclang.errors import Span


@dataclass(frozen=True)
class Ident:
    name: str
    span: Span


# ---- expressions -----------------------------------------------------------------------

@dataclass(frozen=True)
class IntLit:
    value: int
    span: Span


@dataclass(frozen=True)
class FloatLit:
    value: float
    text: str
    span: Span


@dataclass(frozen=True)
class BoolLit:
    value: bool
    span: Span


@dataclass(frozen=True)
class Name:
    """A bare name: an index, a size, a `where` local, or a 0-d tensor written bare."""

    name: str
    span: Span


@dataclass(frozen=True)
class Apply:
    """`f(args)`: a tensor read or a builtin call; the checker tells which."""

    name: str
    name_span: Span
    args: tuple["Expr", ...]
    span: Span


@dataclass(frozen=True)
class CastExpr:
    type_name: str
    operand: "Expr"
    span: Span


@dataclass(frozen=True)
class UnaryExpr:
    op: str  # '-' or '!'
    operand: "Expr"
    span: Span


@dataclass(frozen=True)
class BinaryExpr:
    op: str  # + - * / % == != < > <= >= && ||
    lhs: "Expr"
    rhs: "Expr"
    op_span: Span
    span: Span


@dataclass(frozen=True)
class TernaryExpr:
    cond: "Expr"
    then: "Expr"
    other: "Expr"
    span: Span


Expr = IntLit | FloatLit | BoolLit | Name | Apply | CastExpr | UnaryExpr | BinaryExpr | TernaryExpr


# ---- where clauses ---------------------------------------------------------------------

@dataclass(frozen=True)
class RangeClause:
    """`i in lo:hi`: the index ranges over [lo, hi)."""

    index: Ident
    lo: Expr
    hi: Expr
    span: Span


@dataclass(frozen=True)
class LetClause:
    """`x = expr`: a statement-local name, inlined where used."""

    name: Ident
    value: Expr
    span: Span


@dataclass(frozen=True)
class ExistsClause:
    """`exists T(...)`: an access that counts for range inference but is not evaluated."""

    access: Apply
    span: Span


Clause = RangeClause | LetClause | ExistsClause


# ---- statements and definitions ---------------------------------------------------------

@dataclass(frozen=True)
class Statement:
    target: Ident
    # None: written bare (`s = ...`), a 0-d tensor; an `Apply` (`H(Ids(i))`) is a gathered
    # subscript, which makes the statement a scatter (tclang/lang/scatters.py)
    indices: tuple["Ident | IntLit | Apply", ...] | None
    op: str  # '=', '+=', '+=!', '*=', '*=!', 'min=', 'min=!', 'max=', 'max=!'
    op_span: Span
    rhs: Expr
    where: tuple[Clause, ...]
    span: Span
    equivalent: "Apply | None" = None  # TC's `<=> name(args)` annotation


@dataclass(frozen=True)
class Dim:
    """One dimension of a declared shape: a size name or an integer literal."""

    value: str | int
    span: Span


@dataclass(frozen=True)
class Param:
    type_name: str
    dims: tuple[Dim, ...] | None  # None: a scalar (0-d) input
    name: Ident
    span: Span


@dataclass(frozen=True)
class OutputDecl:
    name: Ident
    type_name: str | None  # None: type and shape inferred
    dims: tuple[Dim, ...] | None
    span: Span


@dataclass(frozen=True)
class Definition:
    name: Ident
    params: tuple[Param, ...]
    outputs: tuple[OutputDecl, ...]
    statements: tuple[Statement, ...]
    span: Span
    tokens: str  # its tokens from `def` to `}` as the parser read them, space-separated


@dataclass(frozen=True)
class Module:
    definitions: tuple[Definition, ...]
    source: str


def walk(roots) -> Iterator:
    """Every node of the given expressions and where-clauses, each once, parents before
    their children: the one traversal the checker and the recurrence rules share (a new
    kind of expression node is then added in one place)."""
    stack: list = list(roots)
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, LetClause):
            stack.append(node.value)
        elif isinstance(node, RangeClause):
            stack.extend((node.lo, node.hi))
        elif isinstance(node, ExistsClause):
            stack.append(node.access)
        elif isinstance(node, Apply):
            stack.extend(node.args)
        elif isinstance(node, (CastExpr, UnaryExpr)):
            stack.append(node.operand)
        elif isinstance(node, BinaryExpr):
            stack.extend((node.lhs, node.rhs))
        elif isinstance(node, TernaryExpr):
            stack.extend((node.cond, node.then, node.other))
