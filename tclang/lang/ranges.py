"""Range inference (LANGUAGE.md section 5), symbolic in the size names.

For each statement, in program order: indices ranged by `where` are known; then, in rounds,
every unguarded read subscript that holds exactly one unknown index is solved for the
largest interval keeping the read in bounds for all values of the known indices, and the
intervals found for one index in a round are intersected (TC's algorithm). A left-side
index no read bounds takes the extent of its tensor when that is already known. Output and
temporary shapes are the largest upper bounds over the statements that write them.

What can be decided for all sizes is decided here (an error at define time); what depends
on the concrete sizes becomes an `Obligation` that compilation checks.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from tclang.lang import program as P
from tclang.lang import sizes as Z
from tclang.lang.affine import Affine, Interval
from tclang.errors import Span, TCSemanticError


@dataclass(frozen=True)
class _Bound:
    """One in-bounds requirement: 0 <= affine <= extent - 1, from a read (or the target)."""

    affine: Affine
    extent: Z.SizeExpr
    read: P.Read | None
    dim: int


def infer_shapes(defn: P.Definition) -> P.Definition:
    """Fill every statement's domain and every output's and temporary's shape."""
    state = _State(defn)
    statements = tuple(state.statement(s) for s in defn.statements)
    outputs = tuple(state.final_tensor(t) for t in defn.outputs)
    temps = tuple(state.final_tensor(t) for t in defn.temporaries)
    return replace(defn, outputs=outputs, temporaries=temps, statements=statements,
                   obligations=tuple(state.obligations))


class _State:
    def __init__(self, defn: P.Definition):
        self.defn = defn
        self.shapes: dict[str, tuple[Z.SizeExpr, ...]] = {
            t.name: t.shape for t in defn.inputs + defn.outputs if t.declared}
        self.written: dict[str, list[Z.SizeExpr]] = {}
        self.obligations: list[P.Obligation] = []

    def shape(self, name: str) -> tuple[Z.SizeExpr, ...] | None:
        if name in self.shapes:
            return self.shapes[name]
        if name in self.written:
            return tuple(self.written[name])
        return None

    # ---- one statement ----
    def statement(self, s: P.Statement) -> P.Statement:
        known: dict[str, Interval] = {r.name: (r.lo, r.hi - 1) for r in s.domain}
        bounds = self._bounds(s)
        self._solve(s, known, bounds)
        domain = tuple(P.IndexRange(i, known[i][0], known[i][1] + 1) for i in s.all_indices)
        self._check_ranges(s, domain)
        self._check_reads(s, bounds, known)
        self._record_extent(s, domain)
        return replace(s, domain=domain)

    def _bounds(self, s: P.Statement) -> list[_Bound]:
        bounds = []
        unguarded = [r for r in P.reads_of(s.rhs) if r.guard is None] + list(s.exists)
        for read in unguarded:
            shape = self.shape(read.tensor)
            for dim, affine in enumerate(read.affine):
                if affine is not None:
                    bounds.append(_Bound(affine, shape[dim], read, dim))
        target_shape = self.shape(s.target)
        if s.op != "=" and not s.reset and target_shape is not None:
            for dim, index in enumerate(s.indices):  # `+=` reads the target's current value
                bounds.append(_Bound(Affine.index(index), target_shape[dim], None, dim))
        return bounds

    def _solve(self, s: P.Statement, known: dict[str, Interval], bounds: list[_Bound]) -> None:
        unknown = [i for i in s.all_indices if i not in known]
        while unknown:
            found: dict[str, Interval] = {}
            for b in bounds:
                free = b.affine.indices() & set(unknown)
                if len(free) != 1:
                    continue
                index = next(iter(free))
                solved = b.affine.solve(index, Z.const(0), b.extent - 1, known)
                if solved is not None:
                    found[index] = _intersect(found.get(index), solved)
            if not found:
                found = self._from_target(s, unknown)
            if not found:
                raise self._unresolved(s, unknown[0], bounds, known)
            known.update(found)
            unknown = [i for i in unknown if i not in found]

    def _from_target(self, s: P.Statement, unknown: list[str]) -> dict[str, Interval]:
        """Left-side indices no read bounds range over the target's known extent."""
        shape = self.shape(s.target)
        if shape is None:
            return {}
        return {i: (Z.const(0), shape[k] - 1) for k, i in enumerate(s.indices) if i in unknown}

    def _unresolved(self, s: P.Statement, index: str, bounds: list[_Bound],
                    known: dict[str, Interval]) -> TCSemanticError:
        together = [b for b in bounds if index in b.affine.indices()]
        if together:
            others = sorted((together[0].affine.indices() - {index}) - set(known))
            where = f"{together[0].read.tensor}(...)" if together[0].read else s.target
            reason = (f"it appears in {where} only together with other unresolved indices "
                      f"({', '.join(others)})" if others else
                      f"it appears in {where} only under '%' or in a form that bounds nothing")
        else:
            reason = "no tensor read that bounds it uses it as a subscript"
        return TCSemanticError(f"cannot infer the range of index {index}: {reason}",
                               _index_span(s, index),
                               hint=f"add a where clause giving its range, e.g. "
                                    f"`where {index} in 0:N`")

    # ---- checks ----
    def _check_ranges(self, s: P.Statement, domain: tuple[P.IndexRange, ...]) -> None:
        for r in domain:
            span = _index_span(s, r.name)
            if Z.definitely(r.hi - r.lo, "<"):
                raise TCSemanticError(f"index {r.name} has an empty range [{r.lo}, {r.hi})",
                                      span, hint="check the where clause or the subscripts")
            if r.name not in s.indices:
                continue
            message = (f"index {r.name} of {s.target} would start at {r.lo}, below 0; "
                       "output index spaces start at 0")
            hint = f"shift the subscripts or restrict it: `where {r.name} in 0:...`"
            if Z.definitely(r.lo, "<"):
                raise TCSemanticError(message, span, hint=hint)
            if not Z.definitely(r.lo, ">="):
                self.obligations.append(P.Obligation(r.lo, ">=", message, span))

    def _check_reads(self, s: P.Statement, bounds: list[_Bound],
                     known: dict[str, Interval]) -> None:
        for b in bounds:
            if b.read is None or not b.affine.is_linear:
                continue
            lo, hi = b.affine.interval(known)
            last = b.extent - 1
            if hi == last and lo.constant is not None and lo.constant >= 0:
                continue  # the range came from this very read: in bounds
            below, above = Z.definitely(lo, "<"), Z.definitely(hi - last, ">")
            if below or above:
                edge = f"down to {lo}" if below else f"up to {hi}"
                raise TCSemanticError(
                    f"{b.read.tensor} is read out of bounds for all sizes: subscript {b.dim} "
                    f"goes {edge}, but dimension {b.dim} has extent {b.extent}", b.read.span,
                    hint="restrict the indices with a where clause, or guard the read with "
                         "`cond ? read : 0`")

    def _record_extent(self, s: P.Statement, domain: tuple[P.IndexRange, ...]) -> None:
        his = [r.hi for r in domain if r.name in s.indices]
        previous = self.written.get(s.target)
        if previous is None:
            self.written[s.target] = his
        else:
            self.written[s.target] = [Z.maximum(a, b) for a, b in zip(previous, his)]

    def final_tensor(self, t: P.Tensor) -> P.Tensor:
        inferred = tuple(self.written[t.name])
        if not t.declared:
            for dim, extent in enumerate(inferred):
                self._extent_obligation(t, dim, extent)
            return replace(t, shape=inferred)
        for dim, (declared, extent) in enumerate(zip(t.shape, inferred)):
            difference = declared - extent
            message = (f"{t.name} is declared with extent {declared} in dimension {dim}, "
                       f"but its statements write extent {extent}")
            if difference.constant not in (None, 0) or Z.definitely(difference, ">") or \
                    Z.definitely(difference, "<"):
                raise TCSemanticError(message, t.span,
                                      hint="declare the inferred shape, or bound the "
                                           "indices with a where clause")
            if difference.constant != 0:
                self.obligations.append(P.Obligation(difference, "==", message, t.span))
        return t

    def _extent_obligation(self, t: P.Tensor, dim: int, extent: Z.SizeExpr) -> None:
        if Z.definitely(extent, ">="):
            return
        message = f"{t.name} would have a negative extent {extent} in dimension {dim}"
        self.obligations.append(P.Obligation(extent, ">=", message, t.span))


def _intersect(a: Interval | None, b: Interval) -> Interval:
    if a is None:
        return b
    return Z.maximum(a[0], b[0]), Z.minimum(a[1], b[1])


def _index_span(s: P.Statement, index: str) -> Span:
    return dict(s.index_spans).get(index, s.span)
