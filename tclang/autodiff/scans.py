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
G(p) * df/dX).

A read that is not a constant shift (a forward substitution's diagonal `P(j - 1, j - 1)`,
read by a whole column; a cell reading unit 0 of the previous step), or a recurrence in a
sum (`x(i) +=! ... x(k)`, where each point also sums over its reduction indices), sends
back to each point from a whole set of later ones: G(q) gets the sum over every forward
point p' with g(p') = q of G(p') * df/dO(g(p')) at p'. Reversed, that is a sum inside the
recurrence, which the language writes as a reduction reading earlier points of its own
target (tclang/lang/recurrences.py):

    Grev(u) +=! (p' is the first point) ? dO(E - 1 - u) : 0
               + sum over k of (p' in the forward's domain && g_k(p') == E - 1 - u) ?
                               Grev(E - 1 - p') * df/dO_k at p' : 0

(p' in the hull of the forward's ranges), all under the disjunction of the terms' guards,
which becomes the statement's domain (tclang/lang/guarded_sums.py),
so isl solves the equalities and the loops visit only the forward points that read the
point, not every pair. Every recurrence the language accepts takes this form where it
is not `=`/`+` over the whole box with constant shifts: a range from 1, a triangle, a
statement after a first write of its target (`own_reads`), a max, min or product (each
later point's gradient routed to the candidates that won, or weighed by the product of
the other factors, as the statement's own gradient is: adjoint._ties, _product), with or
without reset onto a value written before.
"""

from __future__ import annotations

from dataclasses import replace

from tclang.autodiff import derivatives as D
from tclang.autodiff.source_text import affine_text
from tclang.dtypes import DType
from tclang.errors import TCGradError
from tclang.lang import program as P
from tclang.lang import sizes as Z
from tclang.lang.affine import Affine, Div
from tclang.lang.recurrences import recurrence_reads, uniform_distance


def own_reads(s: P.Statement, rhs: P.Expr, made: str, before: str | None) -> P.Expr:
    """The statement's reads of earlier points of its target relabelled as the version it
    writes (they read what it wrote, not the target's value before it). Where an earlier
    statement wrote the target (`before`), a read of a point this statement does not
    write reads that value instead: `written ? O'(q) : O(q)`, each branch a read of its
    own version (`O(i) = X(i)` then `O(i) = O(i - 1) * 0.5 + X(i) where i in 1:N` reads
    the first statement's O(0) at i == 1)."""
    refs = {r.ref for r in recurrence_reads(s)}
    if not refs:
        return rhs

    def go(x: P.Expr) -> P.Expr:
        new = P.with_children(x, tuple(go(k) for k in P.children(x)))
        if isinstance(new, P.Read) and new.ref in refs:
            mine = replace(new, tensor=made)
            if before is None:
                return mine
            written = _written(s, new)
            if written is None:
                raise TCGradError(f"cannot differentiate `{s.text.strip()}`: tc.grad cannot "
                                  "tell which points of this read the statement writes",
                                  new.span, hint="write the recurrence's ranges with sizes "
                                                 "and integers")
            return P.Select(written, mine, new, new.dtype)
        return new
    return go(rhs)


def _written(s: P.Statement, read: P.Read) -> P.Expr | None:
    """Whether the point `read` reads is one statement s writes, as a typed condition on
    the read's subscripts (its ranges, and range bounds that use other indices), or None
    where a bound is not a polynomial in the sizes."""
    at = dict(zip(s.indices, read.subscripts))
    conditions = []
    for index, sub in zip(s.indices, read.subscripts):
        r = s.range_of(index)
        lo, hi = _size_value(r.lo, sub.dtype), _size_value(r.hi, sub.dtype)
        if lo is None or hi is None:
            return None
        if r.lo.constant != 0 or not isinstance(sub, P.IndexValue):
            conditions.append(P.Compare("ge", sub, lo))
        conditions.append(P.Compare("lt", sub, hi))
    for index, lo, hi in s.affine_ranges:
        if index not in s.indices:  # a reduction index's range: every point is written
            continue
        sub = at.get(index)
        for bound, op in ((lo, "ge"), (hi, "lt")):
            value = _affine_value(bound, at, sub.dtype) if sub is not None else None
            if sub is None or value is None:
                return None
            conditions.append(P.Compare(op, sub, value))
    out = conditions[0]
    for c in conditions[1:]:
        out = P.Binary("and", out, c, DType.BOOL)
    return out


def _size_value(e: Z.SizeExpr, dtype: DType) -> P.Expr | None:
    """A polynomial in the sizes as a typed integer expression (None for others)."""
    if not isinstance(e, Z.Poly):
        return None
    out: P.Expr | None = None
    for monomial, coefficient in e.terms:
        term: P.Expr = P.Const(coefficient, dtype)
        for name in monomial:
            term = P.Binary("mul", term, _cast(P.SizeValue(name), dtype), dtype)
        out = term if out is None else P.Binary("add", out, term, dtype)
    return out if out is not None else P.Const(0, dtype)


def _affine_value(a: Affine, at: dict[str, P.Expr], dtype: DType) -> P.Expr | None:
    """Affine `a` in the statement's indices, each replaced by the expression `at` gives."""
    out = _size_value(a.offset, dtype)
    if out is None:
        return None
    for atom, coefficient in a.terms:
        if not isinstance(atom, str) or atom not in at:
            return None
        out = P.Binary("add", out, P.Binary("mul", P.Const(coefficient, dtype),
                                            _cast(at[atom], dtype), dtype), dtype)
    return out


def _cast(e: P.Expr, dtype: DType) -> P.Expr:
    return e if e.dtype is dtype else P.Cast(e, dtype)


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
    ranges = {x: (Z.const(0), e) for x, e in zip(u, extents)}
    comment = f"# the gradient of statement {k + 1}'s recurrence, scanned backwards"
    if s.reduction_indices or s.affine_ranges or s.op not in ("=", "+") or \
            any(s.range_of(i).lo.constant != 0 for i in s.indices) or \
            any(uniform_distance(r, s.indices) is None for r in groups.values()):
        # (a domain other than the whole box: the forward points that read are bounded)
        _summed_terms(b, k, rhs, total, index_text, list(groups.values()), rev, u, extents,
                      version.dtype, comment)
    else:
        for read in groups.values():
            total = D.add(total, _chain_term(b, k, rhs, read, rev, u, extents, index_text))
        b._emit(f"d:{rev}", tuple(u), total, index_text, ranges, frozenset(u), False,
                comment=comment)
    text: dict[str, tuple[str, int]] = {}
    g = _reversed_read(b, f"d:{rev}", list(s.indices), extents, version.dtype, s, text)
    b._emit(f"d:{fwd}", s.indices, g, text, {i: (Z.const(0), e) for i, e in
                                              zip(s.indices, extents)},
            frozenset(s.indices), False)
    return P.Read(f"d:{fwd}", tuple(P.IndexValue(i) for i in s.indices),
                  tuple(Affine.index(i) for i in s.indices), None, 0, version.dtype, s.span)


def _summed_terms(b, k: int, rhs: P.Expr, seed: P.Read, index_text: dict,
                  reads: list[P.Read], rev: str, u: list[str], extents, dtype,
                  comment: str) -> None:
    """`Grev(u) +=! ...`: the gradient arriving at E - 1 - u (`seed`) plus what every
    forward point p' that read E - 1 - u sends back (see the module docstring), p'
    running over the forward statement's ranges under its bounds, each read's term
    under the equalities that say it read that point. One statement, so that its own
    gradient (the second order) is a recurrence like any other: the seed is added once,
    at the first point of p'."""
    s = b.defn.statements[k]
    made = b.made[k]
    compute = b.versions[made].dtype.compute
    point = {i: b.fresh(f"p{d}") for d, i in enumerate(s.all_indices)}
    ranges = {x: (Z.const(0), e) for x, e in zip(u, extents)}
    for r in s.domain:
        ranges[point[r.name]] = (b.size_name(r.lo), b.size_name(r.hi))
    back = _reversed_read(b, f"d:{rev}", [point[i] for i in s.indices], extents, dtype, s,
                          index_text)
    bounds = b.range_bounds(s, {i: Affine.index(n) for i, n in point.items()})
    first = " && ".join(f"{point[r.name]} == {_size(b.size_name(r.lo))}" for r in s.domain)
    pieces, total = [first], D.select(_raw(first), seed, None, compute)
    old = None if s.reset else b.before[k]  # a value before: one more candidate or factor
    if s.op in ("max", "min"):  # a later point's gradient reaches the candidates that won
        back = _renamed(b._ties(k, rhs, back, old=old, from_zeros=b._from_zeros(k),
                                share_old=False), point)
    elif s.op == "*" and b._from_zeros(k):
        back = None  # a product from zeros is 0: nothing goes back along it
    elif s.op == "*":  # ... or each factor, times the product of the others (the value
        # before one of them: `O(i) *= e` onto it, with or without a reduction index)
        back = _renamed(b._product(k, rhs, back, old, share_old=False), point)
    for read in reads:
        partial = _partial(b, k, rhs, read)
        if partial is None:
            continue
        at = " && ".join(bounds + [f"{_size(e)} - 1 - {x} == "
                                   f"{affine_text(_rename_affine(a, point))}"
                                   for x, e, a in zip(u, extents, read.affine)])
        pieces.append(at)
        if back is not None:
            total = D.add(total, D.select(_raw(at), _times(back, _renamed(partial, point)),
                                          None, compute))
    anywhere = " || ".join(f"({p})" for p in pieces)
    b._emit(f"d:{rev}", tuple(u), D.select(_raw(anywhere), total, None, compute), index_text,
            ranges, frozenset(u) | frozenset(point.values()), True, comment=comment)


def _times(weight: P.Expr, partial: P.Expr) -> P.Expr | None:
    """weight * partial, the product carried into each term of a sum and each guarded
    branch, so that the read in `weight` is evaluated only where a term's guard holds: a
    partial that is a sum of guarded terms (two reads of one point, merged) would
    otherwise evaluate it where the forward read it at no point, where reading it may be
    reading a later point (the second order of a sum inside a recurrence)."""
    if isinstance(partial, P.Binary) and partial.op in ("add", "sub"):
        left, right = _times(weight, partial.lhs), _times(weight, partial.rhs)
        return D.add(left, right) if partial.op == "add" else D.sub(left, right)
    if isinstance(partial, P.Unary) and partial.op == "neg":
        return D.neg(_times(weight, partial.operand))
    if isinstance(partial, P.Select) and _zero(partial.other):
        return D.select(partial.cond, _times(weight, partial.then), None, partial.dtype)
    if isinstance(partial, P.Select) and _zero(partial.then):
        return D.select(partial.cond, None, _times(weight, partial.other), partial.dtype)
    return D.mul(weight, partial)


def _zero(e: P.Expr) -> bool:
    while isinstance(e, P.Cast):
        e = e.operand
    return isinstance(e, P.Const) and not isinstance(e.value, bool) and e.value == 0


def _partial(b, k: int, rhs: P.Expr, read: P.Read) -> P.Expr | None:
    """d rhs / d (statement k's recurrence read at `read`'s subscripts); None where zero."""
    made = b.made[k]
    try:
        return D.derivative(rhs, lambda x: x.tensor == made and
                            x.subscripts == read.subscripts)
    except D.NotDifferentiable as why:
        raise b._error(k, why.reason) from None


def _chain_term(b, k: int, rhs: P.Expr, read: P.Read, rev: str, u: list[str], extents,
                index_text: dict) -> P.Expr | None:
    """`(u - d in range) ? Grev(u - d) * df/dO(p - d)[p := E - 1 - u + d] : 0` for one
    recurrence read at shift d (its index placeholders' text added to `index_text`)."""
    s = b.defn.statements[k]
    partial = _partial(b, k, rhs, read)
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
                    b.versions[b.made[k]].dtype.compute)


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
    """`a` with its indices renamed, inside quotients and remainders too (`p0 / 2` for
    `i / 2`: the equality that says which point a read of O(i / 2) read)."""
    out = Affine((), a.offset)
    for atom, coef in a.terms:
        if isinstance(atom, str):
            out = out + Affine.index(names.get(atom, atom)).scale(coef)
        else:
            inner = Div(_rename_affine(atom.inner, names), atom.divisor, atom.kind)
            out = out + Affine(((inner, 1),), Z.const(0)).scale(coef)
    return out


def _plus(text: str, d: int) -> str:
    return f"{text} + {d}" if d > 0 else f"{text} - {-d}" if d < 0 else text


def _size(e: Z.SizeExpr) -> str:
    text = str(e)
    return text if text.isidentifier() or text.isdigit() else f"({text})"


def _raw(text: str):
    from tclang.autodiff.source_text import Raw
    return Raw(text, 1)
