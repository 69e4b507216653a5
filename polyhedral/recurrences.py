"""The exact rule of recurrences, checked on the scop with isl.

A statement that reads its own target at another point (tclang/lang/recurrences.py)
runs its points in the lexicographic order of its left-side indices, which the scop's
`order` already says, so the dependences make every later stage keep that order along
the loops that carry it, and only those (a reduction's updates of one point may run in
any order, but all of them before a later point reads it: polyhedral/dependences.py's
fences). Here, before any of that, each such read must be well-defined on every point of
the statement's domain where it is evaluated (under its guard):

- it reads a point this statement writes strictly earlier in that order (for a
  reduction: a point of the target before the one it reduces into), or, where an
  earlier statement wrote the tensor, a point this statement does not write at all (the
  earlier value); never a point it writes at the same time or later, whose value would
  depend on the order the loops take;
- in the tensor's first statement, it reads only points this statement writes: nothing
  else has written the others.
"""

from __future__ import annotations

import islpy as isl

from polyhedral.scop import Scop, ScopStatement
from tclang.errors import TCSemanticError
from tclang.lang.recurrences import later_read_error, recurrence_reads


def check_recurrences(scop: Scop) -> None:
    """Raise `TCSemanticError` at the first recurrence read that is not strictly earlier
    (or that reads what nothing wrote)."""
    for position, st in enumerate(scop.statements):
        if st.kind not in ("assign", "reduce") or st.source.is_scatter:
            continue
        reads = recurrence_reads(st.source)
        if not reads:
            continue
        first = all(o.source.target != st.source.target for o in scop.statements[:position])
        for read in reads:
            _check_read(scop, st, read, first)


def _check_read(scop: Scop, st: ScopStatement, read, first: bool) -> None:
    access = scop.ref_reads[(st.id, read.ref)]
    domain = scop.domain.extract_set(access.get_space().domain())
    writes = scop.writes.extract_map(access.get_space())
    access = access.intersect_domain(domain)
    if st.kind == "assign":
        instances = access.apply_range(writes.reverse())  # point -> the point writing it
        not_before = instances.intersect(isl.Map.lex_le(domain.get_space())).domain()
    else:  # compare the point read with the point reduced into, in the target's order
        cells = writes.intersect_domain(domain).range().get_space()
        pairs = access.range_product(writes.intersect_domain(domain))
        not_before = pairs.intersect_range(isl.Map.lex_ge(cells).wrap()).domain()
    target = st.source.target
    if not not_before.is_empty():
        at = f" (at {_point_text(st, not_before)})"
        error = later_read_error(read, target, st.source.indices, at)
        raise TCSemanticError(error.message, read.span, scop.definition.source,
                              hint=error.hint)
    if first:
        unwritten = access.range().subtract(writes.range())
        if not unwritten.is_empty():
            outside = access.intersect_range(unwritten).domain()
            raise TCSemanticError(
                f"{target} is read at a point no statement writes (at "
                f"{_point_text(st, outside)})", read.span, scop.definition.source,
                hint="guard the read so it reads only points this statement writes, "
                     f"such as `i > 0 ? {target}(i - 1) : ...`")


def _point_text(st: ScopStatement, points: isl.Set) -> str:
    """One point of `points` as `i = 3, j = 0` (parameters fixed first, if any)."""
    sample = points.sample_point()
    values = [sample.get_coordinate_val(isl.dim_type.set, k).to_python()
              for k in range(points.dim(isl.dim_type.set))]
    return ", ".join(f"{name} = {v}" for name, v in zip(st.indices, values))
