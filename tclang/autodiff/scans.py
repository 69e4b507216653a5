"""The backward of a recurrence is a reverse scan.

For `O(p) = f(X(p), O(p - d1), O(p - d2), ...)` (each `dk` a constant shift, lexicographically
positive: tclang/lang/recurrences.py), the gradient that reaches O(p) is what arrives from
later statements plus what every later point of the recurrence that read O(p) sends back:

    G(p) = dO(p) + sum over k of G(p + dk) * df/dO(p - dk) evaluated at p + dk

G runs backwards along the chain, and the language runs a statement forwards, so the
backward writes it with every index reversed (u = E - 1 - p), where it is an ordinary
recurrence reading earlier points:

    Grev(u) = dO(E - 1 - u)
              + (u - dk in range) ? Grev(u - dk) * df/dO(...)[p := E - 1 - u + dk] : 0
    G(p) = Grev(E - 1 - p)

and G is the weight the rest of the statement's gradient uses in place of dO (dX(p) gets
G(p) * df/dX). Supported: shifts by constants, a statement over its target's whole extent
(each left-side index from 0), the target's first statement; other recurrences are
refused with a TCGradError (`refuse_unsupported`).
"""

from __future__ import annotations

from dataclasses import replace

from tclang.autodiff import derivatives as D
from tclang.errors import TCGradError
from tclang.lang import program as P
from tclang.lang import sizes as Z
from tclang.lang.affine import Affine
from tclang.lang.recurrences import recurrence_reads, uniform_distance


def own_reads(s: P.Statement, rhs: P.Expr, made: str) -> P.Expr:
    """The statement's reads of earlier points of its target relabelled as the version it
    writes (they read what it wrote, not the target's value before it)."""
    refs = {r.ref for r in recurrence_reads(s)}
    if not refs:
        return rhs

    def go(x: P.Expr) -> P.Expr:
        new = P.with_children(x, tuple(go(k) for k in P.children(x)))
        if isinstance(new, P.Read) and new.ref in refs:
            new = replace(new, tensor=made)
        return new
    return go(rhs)


def refuse_unsupported(defn: P.Definition) -> None:
    """The recurrences whose reverse scan is not written yet: a read that is not a
    constant shift, a statement that does not write its target from index 0 to the
    extent, or one that is not the target's first."""
    first: set[str] = set()
    for s in defn.statements:
        reads = recurrence_reads(s)
        why = None
        if reads and s.target in first:
            why = "a recurrence after another statement wrote its target"
        elif reads and any(uniform_distance(r, s.indices) is None for r in reads):
            why = "a recurrence read that is not a constant shift of each index"
        elif reads and any(s.range_of(i).lo.constant != 0 for i in s.indices):
            why = "a recurrence whose left-side indices do not start at 0"
        first.add(s.target)
        if why is not None:
            raise TCGradError(
                f"cannot differentiate `{s.text.strip()}`: tc.grad does not yet handle {why}",
                reads[0].span, hint="write the recurrence over its target's whole extent, "
                                    "reading shifted points such as O(i - 1)")


def recurrent(rhs: P.Expr, made: str) -> list[P.Read]:
    return [r for r in P.reads_of(rhs) if r.tensor == made]


def reverse_scan(b, k: int, rhs: P.Expr, grad: str, version) -> P.Read:
    """Emit Grev and G for statement k (see the module docstring); G's read at the
    statement's point, the weight of its other contributions."""
    s = b.defn.statements[k]
    made = b.made[k]
    extents = [b.size_name(s.range_of(i).hi) for i in s.indices]
    rev, fwd = _version(b, f"rev:{made}", f"{s.target}rev", version), \
        _version(b, f"fwd:{made}", f"{s.target}scan", version)
    u = [b.fresh(f"u{d}") for d in range(len(s.indices))]
    index_text: dict[str, tuple[str, int]] = {}
    total: P.Expr | None = _reversed_read(b, grad, u, extents, version.dtype, s, index_text)
    groups: dict[tuple, P.Read] = {}
    for r in recurrent(rhs, made):
        groups.setdefault(r.subscripts, r)
    for read in groups.values():
        total = D.add(total, _chain_term(b, k, rhs, read, rev, u, extents, index_text))
    ranges = {x: (Z.const(0), e) for x, e in zip(u, extents)}
    b._emit(f"d:{rev}", tuple(u), total, index_text, ranges, frozenset(u), False,
            comment=f"# the gradient of statement {k + 1}'s recurrence, scanned backwards")
    text: dict[str, tuple[str, int]] = {}
    g = _reversed_read(b, f"d:{rev}", list(s.indices), extents, version.dtype, s, text)
    b._emit(f"d:{fwd}", s.indices, g, text, {i: (Z.const(0), e) for i, e in
                                              zip(s.indices, extents)},
            frozenset(s.indices), False)
    return P.Read(f"d:{fwd}", tuple(P.IndexValue(i) for i in s.indices),
                  tuple(Affine.index(i) for i in s.indices), None, 0, version.dtype, s.span)


def _chain_term(b, k: int, rhs: P.Expr, read: P.Read, rev: str, u: list[str], extents,
                index_text: dict) -> P.Expr | None:
    """`(u - d in range) ? Grev(u - d) * df/dO(p - d)[p := E - 1 - u + d] : 0` for one
    recurrence read at shift d (its index placeholders' text added to `index_text`)."""
    s = b.defn.statements[k]
    made = b.made[k]
    try:
        partial = D.derivative(rhs, lambda x: x.tensor == made and
                               x.subscripts == read.subscripts)
    except D.NotDifferentiable as why:
        raise b._error(k, why.reason) from None
    if partial is None:
        return None
    shift = uniform_distance(read, s.indices)
    later = [b.fresh(f"p{d}") for d in range(len(s.indices))]
    for name, e, d, x in zip(later, extents, shift, u):
        index_text[name] = (_plus(f"{_size(e)} - 1 - {x}", d), 4)
    partial = _renamed(partial, dict(zip(s.indices, later)))
    back = [b.fresh(f"q{d}") for d in range(len(s.indices))]
    for name, x, d in zip(back, u, shift):
        index_text[name] = (_plus(x, -d), 4 if d else 7)
    earlier = P.Read(f"d:{rev}", tuple(P.IndexValue(n) for n in back),
                     tuple(Affine.index(n) for n in back), None, 0, read.dtype, s.span)
    guard = " && ".join(f"{x} >= {d}" if d > 0 else f"{x} < {_size(e)} - {-d}"
                        for x, e, d in zip(u, extents, shift) if d)
    return D.select(_raw(guard), D.mul(earlier, partial), None,
                    b.versions[made].dtype.compute)


def _version(b, label: str, name: str, like):
    b.versions[label] = replace(like, label=label, tensor=b.fresh(name), writer=None,
                                final=True)
    return label


def _reversed_read(b, label: str, indices: list[str], extents, dtype, s,
                   index_text: dict) -> P.Read:
    """label(E - 1 - i, ...) for the given indices, through placeholder index names."""
    names = [b.fresh(f"r{d}") for d in range(len(indices))]
    for name, i, e in zip(names, indices, extents):
        index_text[name] = (f"{_size(e)} - 1 - {i}", 4)
    return P.Read(label, tuple(P.IndexValue(n) for n in names),
                  tuple(Affine.index(n) for n in names), None, 0, dtype, s.span)


def _renamed(e: P.Expr, names: dict[str, str]) -> P.Expr:
    """`e` with its index values renamed (reads' affine forms too)."""
    def go(x: P.Expr) -> P.Expr:
        new = P.with_children(x, tuple(go(k) for k in P.children(x)))
        if isinstance(new, P.IndexValue) and new.name in names:
            return replace(new, name=names[new.name])
        if isinstance(new, P.Read):
            affine = tuple(None if a is None else _rename_affine(a, names)
                           for a in new.affine)
            return replace(new, affine=affine)
        return new
    return go(e)


def _rename_affine(a: Affine, names: dict[str, str]) -> Affine:
    out = Affine((), a.offset)
    for atom, coef in a.terms:
        if not isinstance(atom, str):
            return a  # a quotient or remainder: printed from the subscripts, not this form
        out = out + Affine.index(names.get(atom, atom)).scale(coef)
    return out


def _plus(text: str, d: int) -> str:
    return f"{text} + {d}" if d > 0 else f"{text} - {-d}" if d < 0 else text


def _size(e: Z.SizeExpr) -> str:
    text = str(e)
    return text if text.isidentifier() or text.isdigit() else f"({text})"


def _raw(text: str):
    from tclang.autodiff.source_text import Raw
    return Raw(text, 1)
