"""Scatters: a gathered subscript on the left (`H(Ids(i)) +=! 1.0`, LANGUAGE.md's scatter rule).

TC had no scatter. A scatter updates the target at a point that data names, so two
instances may update the same point: only the order-free reductions `+=`, `min=` and
`max=` (and their `!` forms) may scatter; `=` (which colliding write would win?) and
`*=` are refused. The target's shape must be known already (a shaped output, or a tensor an
earlier statement wrote): a data-dependent subscript bounds nothing.

A `!` form resets the whole target to the reduction's identity first: the checker makes
that an ordinary statement (`H(s0) = 0`) before the scatter. The scatter itself becomes a
`Statement` with `scatter` set: its `indices` are empty and all its indices are reduction
indices (none names a point of the target), so every later stage treats it as possibly
writing any point of the target. Its subscripts are checked at run time like a gather's:
an index outside the target is a `TCIndexError` and nothing is written outside it.
"""

from __future__ import annotations

from tclang.dtypes import identity
from tclang.errors import Span
from tclang.lang import program as P
from tclang.lang import syntax as S
from tclang.lang.expressions import (ExpressionTyper, StatementScope, cast,
                                     check_wide_literals, error)
from tclang.lang.functions import BUILTINS

#: the reductions a scatter may use (the op after `_OPS`): the order of colliding
#: updates does not change their result (up to float rounding for `+`)
SCATTER_OPS = ("+", "min", "max")


def is_scatter(s: S.Statement) -> bool:
    """Whether a parsed statement has a gathered (or computed) subscript on the left."""
    return any(isinstance(i, S.Apply) for i in s.indices or ())


def check_scatter(checker, s: S.Statement, op: str, reset: bool, later: frozenset[str],
                  text: str) -> tuple[P.Statement, ...]:
    """The checked statements of scatter `s`: the reset (for a `!` form), then the scatter.
    `checker` is the definition's checker (tclang/lang/checker.py), whose tables this
    updates as for any statement."""
    _check_op(s, op)
    info = checker._target_info(s)
    _check_target_known(checker, s, info)
    lets = checker._lets(s, ())
    scope = StatementScope(dict(checker.tensors), set(checker.sizes), lets, s.target.name,
                           later)
    typer = ExpressionTyper(scope)
    subscripts = tuple(_subscript(typer, item) for item in s.indices)
    ranges, affine = checker._where_ranges(s, scope)
    if affine:
        raise error("a scatter's ranges may use only sizes and integer literals",
                    affine[0][3].span, hint="range the index over sizes and mask the terms "
                                            "with `cond ? ... : 0`")
    rhs = typer.expr(s.rhs)
    exists = tuple(checker._exists(c, typer) for c in s.where
                   if isinstance(c, S.ExistsClause))
    checker._check_unused_lets(s, scope)
    dtype = checker._target_dtype(s, info, rhs, op)
    _check_no_self_reads(s, rhs, subscripts)
    if not reset and not info.written:
        checker._warn(f"`{s.op}` accumulates into {info.name}, which no earlier statement "
                      "writes: it starts from zeros (or the caller's `out=` values)",
                      s.op_span, f"write `{s.op}!` to start from the identity instead")
    checker._record_write(s, info, dtype, len(subscripts))
    rhs = cast(rhs, dtype)
    check_wide_literals(scope, rhs)
    scatter = P.Statement(
        position=0, target=info.name, indices=(), op=op, reset=False, rhs=rhs,
        reduction_indices=tuple(scope.index_spans), domain=ranges, exists=exists,
        span=s.span, text=text, index_spans=tuple(scope.index_spans.items()),
        scatter=subscripts)
    if not reset:
        return (scatter,)
    return (_reset(checker, s, op, dtype, len(subscripts), text), scatter)


def _check_op(s: S.Statement, op: str) -> None:
    if op == "=":
        raise error("a gathered subscript on the left makes this a scatter, and `=` cannot "
                    "scatter: where two indices name the same element, which write would "
                    "win?", s.op_span,
                    hint="accumulate with `+=!` (or `max=!`, `min=!`), or move the gather "
                         "to the right side: O(i) = X(Ids(i))")
    if op not in SCATTER_OPS:
        raise error(f"`{s.op}` cannot scatter: a scatter reduces with `+=`, `min=` or "
                    "`max=` (or their `!` forms)", s.op_span,
                    hint="scatter logarithms with `+=` and take exp() afterwards")


def _check_target_known(checker, s: S.Statement, info) -> None:
    """A data-dependent subscript bounds nothing: the target's extents must be known."""
    name = info.name
    if info.written or checker.declared.get(name) is not None:
        return
    raise error(f"{name}'s shape cannot be inferred from a scatter: its subscripts come "
                "from data", s.target.span,
                hint=f"declare it with its shape among the outputs, e.g. `-> (float(E) "
                     f"{name})`, or write it in an earlier statement")


def _subscript(typer: ExpressionTyper, item) -> P.Expr:
    """One subscript of the target, typed: an index, a literal or an integer expression."""
    if isinstance(item, S.Ident):
        if item.name in typer.scope.tensors or item.name in typer.scope.sizes:
            raise error(f"{item.name} is not an index; a subscript on the left is an index "
                        "name or a gathered value such as Ids(i)", item.span,
                        hint="use a new lower-case name")
        return typer.expr(S.Name(item.name, item.span))
    typed = typer.expr(item)
    if not typed.dtype.is_int:
        raise error(f"a subscript must be an integer, but this one is {typed.dtype.value}",
                    item.span, hint="convert it with int32(...) or int64(...)")
    return typed


def _check_no_self_reads(s: S.Statement, rhs: P.Expr, subscripts) -> None:
    reads = P.reads_of(rhs) + [r for e in subscripts for r in P.reads_of(e)]
    for read in reads:
        if read.tensor == s.target.name:
            raise error(f"this scatter updates {read.tensor} and also reads it; the result "
                        "would depend on the order of the updates", read.span,
                        hint="read the previous values from another tensor")


def _reset(checker, s: S.Statement, op: str, dtype, rank: int, text: str) -> P.Statement:
    """`H(s0, s1) = identity`: the whole target, before a `!` scatter."""
    taken = set(checker.sizes) | set(checker.tensors) | set(BUILTINS)
    names = []
    for k in range(rank):
        name = f"s{k}"
        while name in taken:
            name += "_"
        names.append(name)
    span: Span = s.target.span
    return P.Statement(
        position=0, target=s.target.name, indices=tuple(names), op="=", reset=False,
        rhs=P.Const(identity(op, dtype), dtype), reduction_indices=(), domain=(),
        exists=(), span=s.span, text=text, index_spans=tuple((n, span) for n in names))
