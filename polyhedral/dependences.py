"""Dependence analysis with isl's access-info flow analysis (PPCG's recipe).

flow (RAW): sinks are the reads, must-sources the writes. false (WAR and WAW): sinks are
the writes, may-sources reads and writes, with the writes as kills (without kills WAW comes
out transitive: correct but larger and slower).

A reduction's update statement depends on itself only through its target at one point, in
an order the language leaves free (reductions are associative and commutative). Those
self-dependences are removed from *validity*, so the loops around the reduction may be
tiled and permuted, but kept for *coincidence*, so a reduction loop is never reported
parallel. Dependences between different statements are never relaxed.
"""

from __future__ import annotations

from dataclasses import dataclass

import islpy as isl

from polyhedral.scop import Scop


@dataclass
class Dependences:
    flow: isl.UnionMap  # read after write
    false: isl.UnionMap  # write after read, write after write
    reduction: isl.UnionMap  # the reduction updates' self-dependences (order-free)

    @property
    def all(self) -> isl.UnionMap:
        return self.flow.union(self.false)

    @property
    def validity(self) -> isl.UnionMap:
        """What every schedule must respect."""
        return self.all.subtract(self.reduction).coalesce()

    @property
    def coincidence(self) -> isl.UnionMap:
        """What a parallel loop may not carry."""
        return self.all.coalesce()


def compute_dependences(scop: Scop) -> Dependences:
    flow = (isl.UnionAccessInfo.from_sink(scop.reads)
            .set_must_source(scop.writes)
            .set_schedule_map(scop.order)
            .compute_flow().get_must_dependence())
    false = (isl.UnionAccessInfo.from_sink(scop.writes)
             .set_kill(scop.writes)
             .set_may_source(scop.writes.union(scop.reads))
             .set_schedule_map(scop.order)
             .compute_flow().get_may_dependence())
    flow, false = flow.coalesce(), false.coalesce()
    reduction = isl.UnionMap.empty(flow.get_space())
    for st in scop.statements:
        if st.kind != "reduce" or not st.source.reduction_indices:
            continue
        own = scop.domain.extract_set(_space_of(scop, st.id))
        own_u = isl.UnionSet.from_set(own)
        self_deps = flow.union(false).intersect_domain(own_u).intersect_range(own_u)
        reduction = reduction.union(self_deps)
    return Dependences(flow=flow, false=false, reduction=reduction.coalesce())


def _space_of(scop: Scop, sid: str) -> isl.Space:
    found = []
    scop.domain.foreach_set(lambda s: found.append(s.get_space())
                            if s.get_tuple_name() == sid else None)
    return found[0]
