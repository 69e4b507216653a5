"""Recurrences: a statement that reads its own target at another point.

`O(i) = (i == 0) ? X(0) : O(i - 1) + X(i)` is a scan. A statement runs its points in the
lexicographic order of its left-side indices (the first outermost, each increasing), so
a read of the target at a point that order reaches earlier sees the value this very
statement wrote there (or, at a point this statement does not write, the value earlier
statements left). A reduction finishes each point of its target before the next one
starts, so it may read earlier points too, and sees their reduced values: a forward
substitution is `x(i) = b(i) / L(i, i)` then `x(i) += -L(i, k) / L(i, i) * x(k) where
k in 0:i`, and the backward of a recurrence whose reads are not constant shifts is one
(tclang/autodiff/scans.py). What a reduction may not read is the point it reduces into.
Here, in the language layer, only the form is checked: every subscript quasi-affine, a
constant shift lexicographically positive; whether each read is strictly earlier on
every point where it is evaluated needs isl and is checked on the scop
(`polyhedral/recurrences.py`). Range inference ignores these reads: they never grow the
target (`O(i - 1)` at i == 0 must be guarded, else it is out of bounds).
"""

from __future__ import annotations

from tclang.lang import program as P
from tclang.lang import syntax as S
from tclang.lang.affine import Affine
from tclang.dtypes import DType
from tclang.errors import TCSemanticError
from tclang.lang.expressions import error


def reads_target(s: S.Statement) -> bool:
    """Whether the statement's text (right side or where-locals) names its own target."""
    roots = [s.rhs] + [c.value for c in s.where if isinstance(c, S.LetClause)]
    return any(isinstance(n, (S.Apply, S.Name)) and n.name == s.target.name
               for n in S.walk(roots))


def is_recurrence_read(read: P.Read, target: str, indices: tuple[str, ...]) -> bool:
    """A read of the target at another point than the one written."""
    return read.tensor == target and read.affine != tuple(Affine.index(i) for i in indices)


def recurrence_reads(s: P.Statement) -> list[P.Read]:
    """The statement's reads of its own target at other points (none in a scatter, which
    may not read its target at all: tclang/lang/scatters.py)."""
    if s.is_scatter:
        return []
    return [r for r in P.reads_of(s.rhs) if is_recurrence_read(r, s.target, s.indices)]


def check_self_read(read: P.Read, reduces: bool, target: str,
                    indices: tuple[str, ...] = ()) -> None:
    """The language-level rules of a read of the statement's own target at another point."""
    if reduces and not is_recurrence_read(read, target, indices):
        raise error(f"this statement reduces into {target} and also reads it; the result "
                    "would depend on the order of evaluation", read.span,
                    hint="read the previous values from another tensor, or an earlier "
                         f"point of {target} (a recurrence)")
    if any(a is None for a in read.affine):
        raise error(f"this statement writes {target} and reads it at a data-dependent "
                    "point; the order of the writes would decide the result", read.span,
                    hint="a recurrence reads its target at affine subscripts of the "
                         "left side's indices, such as "
                         f"{target}(i - 1)")
    shift = uniform_distance(read, indices)
    if shift is not None and not _lex_positive(shift):
        raise later_read_error(read, target, indices)


def uniform_distance(read: P.Read, indices: tuple[str, ...]) -> tuple[int, ...] | None:
    """`(1, 0)` for `O(i - 1, j)` written at `O(i, j)`: the written point minus the read
    one, where every subscript is its left-side index plus a constant (else None: isl
    decides, polyhedral/recurrences.py)."""
    distance = []
    for index, affine in zip(indices, read.affine):
        difference = Affine.index(index) - affine
        if difference.terms or difference.offset.constant is None:
            return None
        distance.append(difference.offset.constant)
    return tuple(distance)


def _lex_positive(distance: tuple[int, ...]) -> bool:
    return next((d > 0 for d in distance if d != 0), False)


def later_read_error(read: P.Read, target: str, indices: tuple[str, ...],
                     at: str = "") -> TCSemanticError:
    """The one message of a recurrence read that is not strictly earlier."""
    return error(
        f"this statement writes {target} and reads it at a point it writes at the same "
        f"time or later{at}: a recurrence reads only earlier points, in the order of the "
        f"left side's indices ({', '.join(indices)}), each increasing", read.span,
        hint=f"read an earlier point, such as {target}(i - 1) under `i > 0 ? ... : ...`; "
             "to run an index backwards, write the result reversed (R(i) reads R(i - 1) "
             "and X(N - 1 - i))")


def recurrence_dtype(s: S.Statement, tensors: dict, typed) -> DType:
    """The type of a recurrence's target that no earlier statement wrote: the fixed point
    of `typed(guess)` (the right side's type when the target's reads have type `guess`),
    from the first other tensor's type (float32 without one). A right side whose type
    follows the guess (`O(i) = O(i - 1) * 2`, nothing else read) keeps the first guess;
    one with no fixed point (a comparison) is refused."""
    guess = _first_other_type(s, tensors) or DType.FLOAT32
    for _ in range(3):
        result = typed(guess)
        if result is guess:
            return guess
        guess = result
    raise error(f"the type of {s.target.name} depends on itself in this recurrence",
                s.rhs.span, hint=f"declare the output's type: -> (float(...) "
                                 f"{s.target.name}), or cast the right side")


def _first_other_type(s: S.Statement, tensors: dict) -> DType | None:
    stack: list = [s.rhs]
    while stack:
        node = stack.pop()
        if isinstance(node, (S.Apply, S.Name)) and node.name != s.target.name and \
                node.name in tensors and tensors[node.name].dtype is not None:
            return tensors[node.name].dtype
        if isinstance(node, S.Apply):
            stack.extend(reversed(node.args))
        elif isinstance(node, (S.CastExpr, S.UnaryExpr)):
            stack.append(node.operand)
        elif isinstance(node, S.BinaryExpr):
            stack.extend((node.rhs, node.lhs))
        elif isinstance(node, S.TernaryExpr):
            stack.extend((node.other, node.then, node.cond))
    return None
