"""Dependence analysis with isl's access-info flow analysis (PPCG's recipe).

flow (RAW): sinks are the reads, must-sources the writes. false (WAR and WAW): sinks are
the writes, may-sources reads and writes, with the writes as kills (without kills WAW comes
out transitive: correct but larger and slower). Where that exact analysis blows up (it
can with symbolic sizes and many guarded reads), or its result comes in many more pieces,
every earlier access to the same element stands in for it (memory-based dependences).

A reduction's update statement depends on itself only through its target at one point, in
an order the language leaves free (reductions are associative and commutative). Those
self-dependences, *every* pair of updates of one element (`reduction`), are kept out of
*validity*, so the loops around the reduction may be tiled and permuted, but are part of
*coincidence*, so a loop two of whose iterations update one element is never reported
parallel, whichever way the reduction loops are permuted. (Flow analysis would give only
each update's predecessor in program order, which says nothing once the order changes.)
Dependences between different statements are never relaxed.

Exact or memory-based, the same schedules respect the dependences, and the same loops carry
none: the memory-based ones contain the exact ones, and every earlier access to an element
reaches a later one through a chain of exact ones (through the writes in between, each
after the last), which a schedule that respects each link respects. What differs is the
number of pieces, and with it isl's work (and the scheduler's proximity objective): the
exact analysis takes a lexmax over the writers, which with symbolic sizes and guarded reads
can split a dependence into a piece per case of the sizes (FRAGMENTED_BASIC_MAPS).

Relaxing is only safe with *fences*: once the updates may run in any order, every update
of an element must still come after that element's earlier writers (the init) and before
its later readers and writers. The fences add exactly those pairs, so the updates' own
accesses to their target are left out of the flow analysis. With
`Options(reorder_reductions=False)` nothing is relaxed: reductions run in program order.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import islpy as isl

from polyhedral.scop import Scop
from polyhedral.isl_callbacks import maps, sets
from tclang import budget as compile_budget

FLOW_OPERATIONS_PER_STATEMENT = 500_000
"""isl's exact dataflow analysis, past this many counted operations per statement, gives
way to memory-based dependences (_memory_based). Every benchmark and example operator needs
under 300,000 in all (a 3-layer MLP with symbolic sizes is the largest), and 99 in 100
generated programs under 1,000,000; a 2-statement generated program with symbolic sizes
took 41 s (and its dependences 16 s more to coalesce) where the memory-based ones take
0.01 s."""

FRAGMENTED_BASIC_MAPS = 64
"""Exact dependences (flow and false together) in more basic maps than this are compared
with the memory-based ones, which are used instead when they need at most a quarter as
many. isl's scheduler pays for every basic map of its constraints, and coalescing pays
for pairs of them: the 469 pieces of `tclang fuzz` program 1056's (seed 0) shape-generic
scop (memory-based: 14) took 7 s to coalesce and kept PPCG's options past the scheduler's
time limit, where the memory-based ones schedule in 0.7 s; program 1437's 109 (6), with
its sizes, took 2.9 s to schedule (0.3 s). Every benchmark and test-corpus operator has at
most 16, generated programs 99 in 100 at most 25 (programs 0-399, seed 0, specialized and
shape-generic: one past the limit)."""

FRAGMENTATION = 4  # how many times more pieces the exact dependences must have


@dataclass
class Dependences:
    flow: isl.UnionMap  # read after write
    false: isl.UnionMap  # write after read, write after write
    reduction: isl.UnionMap  # the reduction updates' self-dependences (order-free)
    fences: isl.UnionMap  # every update of an element between its other accesses

    # computed once: the scheduler, the legality check and the AST build all ask

    @cached_property
    def all(self) -> isl.UnionMap:
        return self.flow.union(self.false).union(self.fences).union(self.reduction)

    @cached_property
    def validity(self) -> isl.UnionMap:
        """What every schedule must respect."""
        return self.all.subtract(self.reduction).coalesce()

    @cached_property
    def coincidence(self) -> isl.UnionMap:
        """What a parallel loop may not carry."""
        return self.all.coalesce()


def compute_dependences(scop: Scop, reorder_reductions: bool = True) -> Dependences:
    updates = _reduction_updates(scop) if reorder_reductions else []
    # A relaxed update's accesses to its own target leave the flow analysis: the fences and
    # the order-free pairs below stand for all of them. Reads of tensors that nothing
    # writes (the inputs) take part in no dependence. Both make the analyses much cheaper.
    writes, reads = scop.writes, scop.reads.intersect_range(scop.writes.range())
    for own in updates:
        target = scop.writes.intersect_domain(own)
        writes = writes.subtract(target)
        reads = reads.subtract(reads.intersect_domain(own).intersect_range(target.range()))
    found = _dataflow(scop.ctx, writes, reads, scop.order)
    if found is None or _pieces(*found) > FRAGMENTED_BASIC_MAPS:
        memory = _memory_based(writes, reads, scop.order)
        if found is None or FRAGMENTATION * _pieces(*memory) <= _pieces(*found):
            found = memory
    flow, false = found
    flow, false = flow.coalesce(), false.coalesce()
    empty = isl.UnionMap.empty(flow.get_space())
    reduction, fences = empty, empty
    for own in updates:
        compile_budget.check()  # the stage's long loop (issue 34): the budget's deadline
        reduction = reduction.union(_order_free_pairs(scop, own))
        fences = fences.union(_fences(scop, own))
    return Dependences(flow=flow, false=false, reduction=reduction.coalesce(),
                       fences=fences.coalesce())


def _dataflow(ctx: isl.Context, writes: isl.UnionMap, reads: isl.UnionMap,
              order: isl.UnionMap) -> tuple[isl.UnionMap, isl.UnionMap] | None:
    """(flow, false) by isl's exact dataflow analysis (only the last writer before a read),
    or None past FLOW_OPERATIONS_PER_STATEMENT."""
    ctx.reset_operations()
    ctx.set_max_operations(FLOW_OPERATIONS_PER_STATEMENT * max(1, order.n_map()))
    try:
        flow = (isl.UnionAccessInfo.from_sink(reads)
                .set_must_source(writes)
                .set_schedule_map(order)
                .compute_flow().get_must_dependence())
        false = (isl.UnionAccessInfo.from_sink(writes)
                 .set_kill(writes)
                 .set_may_source(writes.union(reads))
                 .set_schedule_map(order)
                 .compute_flow().get_may_dependence())
        return flow, false
    except isl.Error:
        return None
    finally:
        ctx.set_max_operations(0)
        ctx.reset_operations()


def _pieces(*umaps: isl.UnionMap) -> int:
    """How many basic maps `umaps` have in all."""
    return sum(m.n_basic_map() for umap in umaps for m in maps(umap))


def _memory_based(writes: isl.UnionMap, reads: isl.UnionMap,
                  order: isl.UnionMap) -> tuple[isl.UnionMap, isl.UnionMap]:
    """(flow, false) as every earlier access to the same element: a superset of what the
    dataflow analysis gives, so every schedule that respects it is still legal, found
    without the lexmax over the writers that makes the exact analysis blow up."""
    before = order.lex_lt_union_map(order)
    flow = writes.apply_range(reads.reverse()).intersect(before)
    false = writes.union(reads).apply_range(writes.reverse()).intersect(before)
    return flow, false


def _reduction_updates(scop: Scop) -> list[isl.UnionSet]:
    """The instances of each reduction update statement (one union set per statement)."""
    found = []
    for st in scop.statements:
        space = _space_of(scop, st.id)
        if st.kind != "reduce" or not st.source.reduction_indices or space is None:
            continue  # (an empty domain, e.g. a size 0, leaves a statement out)
        found.append(isl.UnionSet.from_set(scop.domain.extract_set(space)))
    return found


def _order_free_pairs(scop: Scop, own: isl.UnionSet) -> isl.UnionMap:
    """Every pair of updates of the same element, earlier to later in program order.

    Not just each update's predecessor (what flow analysis gives): a loop is parallel only
    if no two of its iterations update one element, and once the updates may be reordered,
    two that were far apart in program order can meet in one loop (interchanging the
    reduction loops of a sum over j, k makes the inner j loop look parallel otherwise).
    """
    target = scop.writes.intersect_domain(own)
    same = target.apply_range(target.reverse())
    return same.intersect(scop.order.lex_lt_union_map(scop.order))


def _fences(scop: Scop, own: isl.UnionSet) -> isl.UnionMap:
    """Pairs (earlier access -> update) and (update -> later access) of the same element,
    for one reduction statement's updates `own`, by program order."""
    updates = scop.writes.intersect_domain(own)
    others = scop.reads.union(scop.writes).subtract_domain(own)
    same = updates.apply_range(others.reverse())  # update -> other access, same element
    before = scop.order.lex_lt_union_map(scop.order)  # program order: a runs before b
    return same.intersect(before).union(same.reverse().intersect(before))


def _space_of(scop: Scop, sid: str) -> isl.Space | None:
    found = [s.get_space() for s in sets(scop.domain) if s.get_tuple_name() == sid]
    return found[0] if found else None
