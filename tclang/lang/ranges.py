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
from tclang.lang.guarded_ranges import region
from tclang.lang.recurrences import recurrence_reads
from tclang.lang.affine import (Affine, Compare, Condition, Interval, condition_and,
                                condition_indices, condition_text)
from tclang.errors import Span, TCSemanticError


@dataclass(frozen=True)
class _Bound:
    """One in-bounds requirement: 0 <= affine <= extent - 1, from a read (or the target)."""

    affine: Affine
    extent: Z.SizeExpr
    read: P.Read | None
    dim: int
    guarded: bool = False  # a read under an affine guard that does not mention its indices


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
        return replace(s, domain=domain, condition=_range_condition(s))

    def _bounds(self, s: P.Statement) -> list[_Bound]:
        bounds = []
        recurrent = {id(r) for r in recurrence_reads(s)}  # they never grow the target
        reads = [r for r in P.reads_of(s.rhs) if id(r) not in recurrent]
        unguarded = [r for r in reads if r.guard is None] + list(s.exists)
        for read in unguarded:
            shape = self.shape(read.tensor)
            for dim, affine in enumerate(read.affine):
                if affine is not None:
                    bounds.append(_Bound(affine, shape[dim], read, dim))
        for read in reads:  # guarded reads: the subscripts the guard leaves free
            if read.guard is None:
                continue
            shape = self.shape(read.tensor)
            constrained = condition_indices(read.guard)
            for dim, affine in enumerate(read.affine):
                if affine is not None and not affine.indices() & constrained:
                    bounds.append(_Bound(affine, shape[dim], read, dim, guarded=True))
        target_shape = self.shape(s.target)
        if s.op != "=" and not s.reset and target_shape is not None:
            for dim, index in enumerate(s.indices):  # `+=` reads the target's current value
                bounds.append(_Bound(Affine.index(index), target_shape[dim], None, dim))
        return bounds

    def _solve(self, s: P.Statement, known: dict[str, Interval], bounds: list[_Bound]) -> None:
        """TC's rounds over the unguarded reads; then the target's extent; only then the
        guarded reads (so a program TC accepted keeps its ranges)."""
        unknown = [i for i in s.all_indices if i not in known]
        pending = {name: (lo, hi) for name, lo, hi in s.affine_ranges}
        while unknown:
            found = _hulls(pending, known)  # `j in 0:i + 1` once i's range is known
            solvable = [i for i in unknown if i not in pending]
            if not found:
                found = self._round([b for b in bounds if not b.guarded], solvable, known)
            if not found:
                found = self._from_target(s, solvable)
            if not found:
                found = self._round([b for b in bounds if b.guarded], solvable, known)
            if not found:
                found = self._from_branches(s, solvable, known)
            if not found:
                raise self._unresolved(s, (solvable or unknown)[0], bounds, known, pending)
            for name in found:
                pending.pop(name, None)
            known.update(found)
            unknown = [i for i in unknown if i not in found]

    @staticmethod
    def _round(bounds: list[_Bound], unknown: list[str],
               known: dict[str, Interval]) -> dict[str, Interval]:
        found: dict[str, Interval] = {}
        for b in bounds:
            free = b.affine.indices() - set(known)
            if len(free) != 1 or not free <= set(unknown):
                continue  # several unknowns, or an affine range not resolved yet
            index = next(iter(free))
            solved = b.affine.solve(index, Z.const(0), b.extent - 1, known)
            if solved is not None:
                found[index] = _intersect(found.get(index), solved)
        return found

    def _from_branches(self, s: P.Statement, unknown: list[str],
                       known: dict[str, Interval]) -> dict[str, Interval]:
        """Indices each branch of a `?:` bounds within its condition (guarded_ranges.py)."""
        found = {}
        for index in unknown:
            lo, hi = region(s.rhs, index, known, self.shape)
            if lo is not None and hi is not None:
                found[index] = (lo, hi)
        return found

    def _from_target(self, s: P.Statement, unknown: list[str]) -> dict[str, Interval]:
        """Left-side indices no read bounds range over the target's known extent."""
        shape = self.shape(s.target)
        if shape is None:
            return {}
        return {i: (Z.const(0), shape[k] - 1) for k, i in enumerate(s.indices) if i in unknown}

    def _unresolved(self, s: P.Statement, index: str, bounds: list[_Bound],
                    known: dict[str, Interval], pending: dict) -> TCSemanticError:
        if index in pending:
            lo, hi = pending[index]
            waiting = sorted((lo.indices() | hi.indices()) - set(known))
            return TCSemanticError(
                f"cannot infer the range of index {index}: its bounds {lo}:{hi} use "
                f"{', '.join(waiting)}, whose range depends on it", _index_span(s, index),
                hint=f"range {', '.join(waiting)} over sizes with a where clause")
        together = [b for b in bounds if index in b.affine.indices()]
        guarded = [r for r in P.reads_of(s.rhs) if r.guard is not None and any(
            a is not None and index in a.indices() for a in r.affine)]
        if together:
            others = sorted((together[0].affine.indices() - {index}) - set(known))
            where = f"{together[0].read.tensor}(...)" if together[0].read else s.target
            reason = (f"it appears in {where} only together with other unresolved indices "
                      f"({', '.join(others)})" if others else
                      f"it appears in {where} only under '%' or in a form that bounds nothing")
        elif guarded:
            read = guarded[0]
            guard = condition_text(read.guard)
            guard = guard if len(guard) <= 80 else guard[:77] + "..."
            reason = (f"it is read only in {read.tensor}(...) (line {read.span.line}, column "
                      f"{read.span.column}) under the guard `{guard}`, "
                      f"which constrains {index} itself, and where the guard is false the other "
                      f"branch reads nothing that bounds {index}")
        else:
            reason = "no tensor read uses it as a subscript"
        return TCSemanticError(f"cannot infer the range of index {index}: {reason}",
                               _index_span(s, index), hint=self._hint(s, index))

    def _hint(self, s: P.Statement, index: str) -> str:
        """A where clause naming the extent of a dimension the index is read along."""
        plain = Affine.index(index)
        for read in P.reads_of(s.rhs) + list(s.exists):
            shape = self.shape(read.tensor)
            for dim, a in enumerate(read.affine):
                if a == plain and shape is not None:
                    return (f"add a where clause giving its range, e.g. `where {index} in "
                            f"0:{shape[dim]}` ({read.tensor}'s dimension {dim})")
        for read in P.reads_of(s.rhs) + list(s.exists):
            shape = self.shape(read.tensor)
            for dim, a in enumerate(read.affine):
                if a is not None and index in a.indices() and shape is not None:
                    return (f"add a where clause giving its range, so that `{a}` stays in "
                            f"0:{shape[dim]} ({read.tensor}'s dimension {dim})")
        if index in s.indices and self.shape(s.target) is not None:
            dim = s.indices.index(index)
            return (f"add a where clause giving its range, e.g. `where {index} in "
                    f"0:{self.shape(s.target)[dim]}`")
        return f"add a where clause giving its range, e.g. `where {index} in 0:<extent>`"

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
            if b.read is None or not b.affine.is_linear or b.guarded or \
                    b.affine.indices() & {name for name, _, _ in s.affine_ranges}:
                continue  # checked exactly, under its guard or in its triangle, per shape
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


def _hulls(pending: dict[str, tuple[Affine, Affine]],
           known: dict[str, Interval]) -> dict[str, Interval]:
    """The hull of each affine range whose bounds' indices are all known: from the least
    lower bound to the greatest upper bound over the known ranges."""
    found = {}
    for name, (lo, hi) in pending.items():
        if (lo.indices() | hi.indices()) <= set(known):
            found[name] = (lo.interval(known)[0], hi.interval(known)[1] - 1)
    return found


def _range_condition(s: P.Statement) -> Condition | None:
    """The statement's condition with the affine ranges' bounds that use indices added."""
    condition = s.condition
    for name, lo, hi in s.affine_ranges:
        if lo.terms:
            condition = condition_and(condition, Compare(">=", Affine.index(name) - lo))
        if hi.terms:
            condition = condition_and(condition, Compare("<", Affine.index(name) - hi))
    return condition


def _intersect(a: Interval | None, b: Interval) -> Interval:
    if a is None:
        return b
    return Z.maximum(a[0], b[0]), Z.minimum(a[1], b[1])


def _index_span(s: P.Statement, index: str) -> Span:
    return dict(s.index_spans).get(index, s.span)
