"""The checked program: names resolved, every expression typed, every index ranged.

This is the front end's output and the only thing the polyhedral layer reads of the
language. Typing is explicit: the checker inserts a `Cast` wherever the promotion rules
convert a value, so every `Binary`'s operands have the node's own type and no later stage
applies promotion rules again. float16 values are computed in float32 and rounded to half
only where they are stored or cast to `half`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import TYPE_CHECKING, Mapping

from tclang.dtypes import DType
from tclang.errors import Span

if TYPE_CHECKING:  # annotations only: the loop IR embeds these types, backends import them
    from tclang.lang.affine import Affine, Condition
    from tclang.lang.sizes import SizeExpr


# ---- typed expressions --------------------------------------------------------------------

@dataclass(frozen=True)
class Const:
    """A literal. A float literal keeps its exact decimal value; code generators round it
    to `dtype` (so `0.1` is float32's 0.1 unless promotion made it a float64)."""

    value: int | float | bool
    dtype: DType


@dataclass(frozen=True)
class IndexValue:
    """The value of a statement index used in arithmetic (int32)."""

    name: str
    dtype: DType = DType.INT32


@dataclass(frozen=True)
class SizeValue:
    """The value of a size name used in arithmetic (int32)."""

    name: str
    dtype: DType = DType.INT32


@dataclass(frozen=True)
class Read:
    """A read of tensor element `tensor(subscripts)`.

    `affine[k]` is subscript k's quasi-affine form, or None where it is data-dependent or
    otherwise not affine (checked at run time). `guard` is the affine condition under which
    the read is evaluated (from enclosing `?:` branches), None if it always is. `ref` numbers
    the reads of one statement, in source order. In the loop IR (polyhedral/subscripts.py
    lowers them) each form is an index expression instead and `guard` is None.
    """

    tensor: str
    subscripts: tuple["Expr", ...]
    affine: tuple[Affine | None, ...]  # or the loop IR's index expressions, once lowered
    guard: Condition | None
    ref: int
    dtype: DType
    span: Span = field(compare=False)

    @property
    def is_gather(self) -> bool:
        return any(a is None for a in self.affine)


@dataclass(frozen=True)
class Unary:
    op: str  # "neg", "not"
    operand: "Expr"
    dtype: DType


@dataclass(frozen=True)
class Binary:
    op: str  # "add", "sub", "mul", "div", "mod", "and", "or"
    lhs: "Expr"
    rhs: "Expr"
    dtype: DType


@dataclass(frozen=True)
class Compare:
    op: str  # "eq", "ne", "lt", "le", "gt", "ge"; operands share one type
    lhs: "Expr"
    rhs: "Expr"
    dtype: DType = DType.BOOL


@dataclass(frozen=True)
class Select:
    cond: "Expr"
    then: "Expr"
    other: "Expr"
    dtype: DType


@dataclass(frozen=True)
class Call:
    """A builtin; its arguments are already cast to `dtype` (min/max/abs: the joined type)."""

    name: str
    args: tuple["Expr", ...]
    dtype: DType


@dataclass(frozen=True)
class Cast:
    operand: "Expr"
    dtype: DType


@dataclass(frozen=True)
class Let:
    """`body`, where `Local(name)` stands for `value`, computed once per statement
    instance: what common subexpression elimination within a statement makes
    (tclang/passes). The checker never makes one; `value` is evaluated unconditionally,
    so it never holds a read that a `?:` guards."""

    name: str
    value: "Expr"
    body: "Expr"
    dtype: DType


@dataclass(frozen=True)
class Local:
    """The value a `Let` around it bound to `name` (its type is that value's)."""

    name: str
    dtype: DType


Expr = (Const | IndexValue | SizeValue | Read | Unary | Binary | Compare | Select | Call | Cast
        | Let | Local)


def children(e: Expr) -> tuple[Expr, ...]:
    """The direct subexpressions of `e`, in evaluation order (a read's subscripts, a let's
    value before its body)."""
    t = type(e)
    if t is Read:
        return e.subscripts
    if t is Binary or t is Compare:
        return (e.lhs, e.rhs)
    if t is Unary or t is Cast:
        return (e.operand,)
    if t is Call:
        return e.args
    if t is Select:
        return (e.cond, e.then, e.other)
    if t is Let:
        return (e.value, e.body)
    return ()


def with_children(e: Expr, new: tuple[Expr, ...]) -> Expr:
    """`e` with its direct subexpressions replaced by `new` (as `children` orders them);
    `e` itself when nothing changed."""
    if all(a is b for a, b in zip(children(e), new)):
        return e
    t = type(e)
    if t is Read:
        return replace(e, subscripts=tuple(new))
    if t is Binary or t is Compare:
        return replace(e, lhs=new[0], rhs=new[1])
    if t is Unary or t is Cast:
        return replace(e, operand=new[0])
    if t is Call:
        return replace(e, args=tuple(new))
    if t is Select:
        return replace(e, cond=new[0], then=new[1], other=new[2])
    if t is Let:
        return replace(e, value=new[0], body=new[1])
    return e


def walk(e: Expr):
    """Every node of an expression tree, parents before children, in evaluation order
    (iterative: a statement may be a chain thousands of terms long)."""
    stack = [e]
    while stack:
        node = stack.pop()
        yield node
        stack.extend(reversed(children(node)))


def reads_of(e: Expr) -> list[Read]:
    """The reads of an expression in source order (gathers' inner reads after the outer)."""
    return [node for node in walk(e) if type(node) is Read]


@dataclass(frozen=True)
class Obligation:
    """`expr >= 0` (or `== 0`) must hold for the concrete sizes; else `message` at `span`."""

    expr: SizeExpr
    relation: str  # ">=" or "=="
    message: str
    span: Span

    def holds(self, sizes) -> bool:
        value = self.expr.evaluate(sizes)
        return value >= 0 if self.relation == ">=" else value == 0



# ---- tensors, statements, definitions ---------------------------------------------------

@dataclass(frozen=True)
class Tensor:
    name: str
    dtype: DType
    shape: tuple[SizeExpr, ...]
    role: str  # "input", "output", "temporary"
    span: Span = field(compare=False)
    declared: bool = False  # the shape was written in the signature (inputs, typed outputs)

    @property
    def rank(self) -> int:
        return len(self.shape)


@dataclass(frozen=True)
class IndexRange:
    """An index ranges over [lo, hi) (hi exclusive), symbolic in the sizes."""

    name: str
    lo: SizeExpr
    hi: SizeExpr

    @property
    def extent(self) -> SizeExpr:
        return self.hi - self.lo


@dataclass(frozen=True)
class Statement:
    """`target(indices) op rhs`: one comprehension of the body.

    `op` is "=", "+", "*", "min" or "max"; `reset` marks the `!` forms (and is False for
    "="). `domain` lists every index of the statement, left-side ones first, then the
    reduction indices, each with its inferred range.
    """

    position: int
    target: str
    indices: tuple[str, ...]
    op: str
    reset: bool
    rhs: Expr
    reduction_indices: tuple[str, ...]
    domain: tuple[IndexRange, ...]
    exists: tuple[Read, ...]
    span: Span = field(compare=False)
    text: str = field(compare=False, default="")
    index_spans: tuple[tuple[str, Span], ...] = field(compare=False, default=())
    # the statement runs only where this affine condition holds (a guarded sum: see
    # tclang/lang/guarded_sums.py); None: at every point of `domain`
    condition: Condition | None = None
    # `where j in lo:hi` with bounds that use other indices (`0:i + 1`): (index, lo, hi),
    # hi exclusive. Range inference gives `domain` their hull and adds the bounds to
    # `condition` (tclang/lang/ranges.py), so later stages see them as a statement condition
    affine_ranges: tuple[tuple[str, "Affine", "Affine"], ...] = ()

    @property
    def all_indices(self) -> tuple[str, ...]:
        return self.indices + self.reduction_indices

    @property
    def is_reduction(self) -> bool:
        return self.op != "="

    def range_of(self, index: str) -> IndexRange:
        for r in self.domain:
            if r.name == index:
                return r
        raise KeyError(index)

    def reads(self) -> list[Read]:
        return reads_of(self.rhs)


@dataclass(frozen=True)
class Definition:
    name: str
    sizes: tuple[str, ...]
    inputs: tuple[Tensor, ...]
    outputs: tuple[Tensor, ...]
    temporaries: tuple[Tensor, ...]
    statements: tuple[Statement, ...]
    span: Span = field(compare=False)
    source: str = field(compare=False, default="")
    obligations: tuple[Obligation, ...] = ()
    # the definition's own tokens, as its parse read them (syntax.Definition.tokens): what
    # the compile cache keys it by (tclang/driver/cachekey.py); `source` is the whole text
    tokens: str = field(compare=False, default="")

    @cached_property
    def tensors(self) -> dict[str, Tensor]:
        """By name; built once (the stages ask `tensor` per statement and access, and a
        program of n statements may have n temporaries)."""
        return {t.name: t for t in self.inputs + self.outputs + self.temporaries}

    def tensor(self, name: str) -> Tensor:
        return self.tensors[name]

    def signature(self) -> str:
        """One line, as `tclang check` prints it: inputs -> outputs with inferred shapes."""
        def show(t: Tensor) -> str:
            dims = f"({', '.join(str(d) for d in t.shape)})" if t.shape else ""
            return f"{t.dtype.value}{dims} {t.name}"
        ins = ", ".join(show(t) for t in self.inputs)
        outs = ", ".join(show(t) for t in self.outputs)
        return f"def {self.name}({ins}) -> ({outs})"


@dataclass(frozen=True)
class Program:
    definitions: tuple[Definition, ...]
    source: str

    def __getitem__(self, name: str) -> Definition:
        for d in self.definitions:
            if d.name == name:
                return d
        raise KeyError(name)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(d.name for d in self.definitions)


def evaluate_shape(shape: tuple[SizeExpr, ...], sizes: Mapping[str, int]) -> tuple[int, ...]:
    return tuple(d.evaluate(sizes) for d in shape)
