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

Per statement, not per program: the dependences into a statement are computed from its
*window* (`_Accesses.window`), the statements before it back to those that overwrite all
it accesses, and only their accesses to the same tensors; the order-free pairs from one
statement's own order; the fences per pair of statements sharing the target. Statements
never interleave in program order (each has its own first coordinate), so a pair of
distinct statements is ordered as a whole. Whole-program analyses (isl's, the program
order's lex_lt for each reduction) cost time quadratic or worse in the statements: a chain
of 400 in-place updates spent 9 s of CPU time here, a 25-step tensor network 10.7 s; now
0.22 s and 0.04 s, and a chain of 1,000 statements 0.5 s. The exact dependences are the
same relations (tests/polyhedral/test_dependence_pairs.py compares them with the
whole-program analysis on every corpus kernel); memory-based ones, and the choice of them,
are per statement: every earlier access within the window, chosen where that statement's
exact dependences blow up or fragment. What stays superlinear: a statement whose window
holds many statements (one reading a tensor that many statements each wrote a part of),
and fences among many reductions and accesses of one tensor (pairs of them).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from functools import cached_property
from typing import Container, Iterable

import islpy as isl

from polyhedral.scop import Scop
from polyhedral.isl_callbacks import maps, sets
from tclang import budget as compile_budget
from tclang.lang.recurrences import recurrence_reads

FLOW_OPERATIONS_PER_STATEMENT = 500_000
"""isl's exact dataflow analysis, past this many counted operations per statement of the
window analysed (_Accesses.window), gives way to memory-based dependences (_memory_based).
Every benchmark and example operator needs
under 300,000 in all (a 3-layer MLP with symbolic sizes is the largest), and 99 in 100
generated programs under 1,000,000; a 2-statement generated program with symbolic sizes
took 41 s (and its dependences 16 s more to coalesce) where the memory-based ones take
0.01 s."""

FRAGMENTED_BASIC_MAPS = 64
"""Exact dependences into one statement (flow and false together) in more basic maps than
this are compared with the memory-based ones, which are used instead when they need at
most a quarter as many. isl's scheduler pays for every basic map of its constraints, and
coalescing pays for pairs of them: the 469 pieces of `tclang fuzz` program 1056's (seed 0)
shape-generic scop (memory-based: 14) took 7 s to coalesce and kept PPCG's options past
the scheduler's time limit, where the memory-based ones schedule in 0.7 s; program 1437's
109 (6), with its sizes, took 2.9 s to schedule (0.3 s). Every benchmark and test-corpus
operator has at most 16, generated programs 99 in 100 at most 25 (programs 0-399, seed 0,
specialized and shape-generic: one past the limit). Decided per statement since the
analysis is: program 1056's shape-generic dependences come in 21 pieces either way (exact:
286), the memory-based ones now only where a statement's own exact ones fragment."""

FRAGMENTATION = 4  # how many times more pieces the exact dependences must have


KINDS = ("flow", "false", "reduction", "fences")


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

    @cached_property
    def _into(self) -> dict[str, list[tuple[str, str, isl.Map]]]:
        """Each statement's incoming dependences: (kind, source statement, map). One map
        per kind and pair of statements, so restricting to some statements costs what
        their own dependences cost, not a pass over the whole program's."""
        index: dict[str, list[tuple[str, str, isl.Map]]] = defaultdict(list)
        for kind in KINDS:
            for m in maps(getattr(self, kind)):
                index[_sink(m)].append((kind, _source(m), m))
        return index

    def sources(self, sid: str) -> set[str]:
        """The statements `sid` depends on (itself included where it does)."""
        return {source for _, source, _ in self._into.get(sid, ())}

    def links(self, sources: Container[str], sinks: Iterable[str]) -> list[isl.Map]:
        """The dependence maps (one per kind and pair of statements) from any of
        `sources` into any of `sinks` (ids)."""
        return [m for sink in sinks for _, source, m in self._into.get(sink, ())
                if source in sources]

    def among(self, statements: Iterable[str]) -> Dependences:
        """The dependences whose source and sink are both among `statements` (ids)."""
        ids = set(statements)
        parts: dict[str, list[isl.Map]] = {kind: [] for kind in KINDS}
        for sink in ids:
            for kind, source, m in self._into.get(sink, ()):
                if source in ids:
                    parts[kind].append(m)
        space = self.flow.get_space()
        return Dependences(*(_union(parts[kind], space) for kind in KINDS))


def compute_dependences(scop: Scop, reorder_reductions: bool = True) -> Dependences:
    """Flow, false, order-free and fence dependences, each computed per statement from the
    few statements that can reach it (see _Accesses.window), not over the whole program."""
    relaxed = _reduction_updates(scop) if reorder_reductions else ()
    accesses = _Accesses(scop, relaxed)
    found: dict[str, list[isl.UnionMap]] = {kind: [] for kind in KINDS}
    for sid in accesses.present:
        compile_budget.check()  # the stage's long loops (issue 34): the budget's deadline
        flow, false = _into_statement(accesses, sid)
        found["flow"].append(flow)
        found["false"].append(false)
    for own in relaxed:
        compile_budget.check()
        found["reduction"].append(_order_free_pairs(accesses, own))
        if own in accesses.recurrent:
            found["fences"].append(_recurrence_fence(accesses, own))
        tensor, _ = accesses.writes[own]
        for other in accesses.users[tensor]:  # pairs: many reductions of one tensor
            if other != own:
                compile_budget.check()
                found["fences"].append(_fences(accesses, own, other))
    space = scop.domain.get_space()
    return Dependences(*(_union(found[kind], space).coalesce() for kind in KINDS))


class _Accesses:
    """Each statement's accesses, by tensor, and who accesses each tensor in program order.

    Two views: the whole scop's (`writes`, `reads`: what the fences see) and what the
    dataflow analysis sees (`flow_writes`, `flow_reads`): a relaxed update's accesses to
    its own target left out, but for its reads of earlier points (`recurrent`: a
    recurrence, tclang/lang/recurrences.py), and reads only of elements something writes
    (reads of the inputs take part in no dependence)."""

    def __init__(self, scop: Scop, relaxed: tuple[str, ...]):
        self.ctx = scop.ctx
        position = {st.id: k for k, st in enumerate(scop.statements)}
        self.position = position  # build_scop puts it first in each instance's order
        self.order: dict[str, isl.Map] = {}
        for m in maps(scop.order):
            self.order[_source(m)] = m
        self.present = sorted(self.order, key=position.__getitem__)
        self.writes: dict[str, tuple[str, isl.Map]] = {}
        for m in maps(scop.writes):
            self.writes[_source(m)] = (_sink(m), m)
        self.reads: dict[str, dict[str, isl.Map]] = defaultdict(dict)
        for m in maps(scop.reads):
            self.reads[_source(m)][_sink(m)] = m
        written: dict[str, isl.Set] = {}
        for tensor, m in self.writes.values():
            written[tensor] = written[tensor].union(m.range()) if tensor in written \
                else m.range()
        self.flow_writes = {sid: w for sid, w in self.writes.items() if sid not in relaxed}
        self.recurrent = _recurrence_reads(scop, relaxed)
        self.flow_reads: dict[str, dict[str, isl.Map]] = defaultdict(dict)
        for sid, by_tensor in self.reads.items():
            for tensor, m in by_tensor.items():
                if tensor not in written:
                    continue
                m = m.intersect_range(written[tensor])
                if sid in relaxed and self.writes[sid][0] == tensor:
                    m = m.subtract_range(self.writes[sid][1].range())
                    if sid in self.recurrent:  # a later point reads it: a true dependence
                        m = m.union(self.recurrent[sid])
                if not m.is_empty():
                    self.flow_reads[sid][tensor] = m
        self.users = self._users(self.writes, self.reads)
        self.flow_users = self._users(self.flow_writes, self.flow_reads)
        self.flow_rank = {tensor: {sid: k for k, sid in enumerate(users)}
                          for tensor, users in self.flow_users.items()}

    def _users(self, writes, reads) -> dict[str, list[str]]:
        """tensor -> the statements that access it, in program order."""
        users: dict[str, list[str]] = defaultdict(list)
        for sid in self.present:
            tensors = set(reads.get(sid, ()))
            if sid in writes:
                tensors.add(writes[sid][0])
            for tensor in sorted(tensors):
                users[tensor].append(sid)
        return users

    def window(self, sid: str, tensor: str, needed: isl.Set) -> list[str]:
        """The statements whose accesses to `tensor` can be the source of a dependence into
        `sid`'s accesses of the elements `needed`: `sid` and the statements before it, back
        to the nearest ones whose writes, together, cover `needed`. Every access before
        those comes before a later write of the same element, so it is neither the last
        writer of any element read (flow) nor, with writes as kills, a source of a false
        dependence into `sid`; the exact dependences into `sid` are those of its window.
        Distinct statements never interleave in program order (each has its own first
        schedule coordinate), so one that comes later is no source either."""
        users = self.flow_users[tensor]
        found, covered = [sid], None
        for k in reversed(range(self.flow_rank[tensor].get(sid, len(users)))):
            earlier = users[k]
            found.append(earlier)
            write = self.flow_writes.get(earlier)
            if write is not None and write[0] == tensor:
                covered = write[1].range() if covered is None else \
                    covered.union(write[1].range())
                if needed.is_subset(covered):
                    break
        return found


def _into_statement(accesses: _Accesses, sid: str) -> tuple[isl.UnionMap, isl.UnionMap]:
    """(flow, false) dependences into statement `sid`: isl's exact dataflow analysis on the
    accesses of its window, or the memory-based dependences where that blows up."""
    reads = accesses.flow_reads.get(sid, {})
    write = accesses.flow_writes.get(sid)
    space = accesses.order[sid].get_space().params()
    empty = isl.UnionMap.empty(space)
    if not reads and write is None:
        return empty, empty
    needed: dict[str, isl.Set] = {tensor: m.range() for tensor, m in reads.items()}
    if write is not None:
        tensor, m = write
        needed[tensor] = needed[tensor].union(m.range()) if tensor in needed else m.range()
    source_writes, source_reads, statements = [], [], {sid}
    for tensor in sorted(needed):
        window = accesses.window(sid, tensor, needed[tensor])
        statements.update(window)
        for other in window:
            w = accesses.flow_writes.get(other)
            if w is not None and w[0] == tensor:
                source_writes.append(w[1])
            r = accesses.flow_reads.get(other, {}).get(tensor)
            if r is not None and write is not None and write[0] == tensor:
                source_reads.append(r)  # only a write of `sid` can be a false sink
    problem = _Problem(
        sink_reads=_union(list(reads.values()), space),
        sink_write=_union([write[1]] if write is not None else [], space),
        writes=_union(source_writes, space), reads=_union(source_reads, space),
        order=_union([accesses.order[s] for s in statements], space),
        sink_order=isl.UnionMap.from_map(accesses.order[sid]))
    found = _dataflow(accesses.ctx, problem)
    if found is None or _pieces(*found) > FRAGMENTED_BASIC_MAPS:
        memory = _memory_based(problem)
        if found is None or FRAGMENTATION * _pieces(*memory) <= _pieces(*found):
            found = memory
    return found


@dataclass(frozen=True)
class _Problem:
    """The dataflow question for one statement's accesses (the sinks), with its window's
    accesses as the sources."""
    sink_reads: isl.UnionMap
    sink_write: isl.UnionMap
    writes: isl.UnionMap  # the window's writes (must-sources of flow, kills)
    reads: isl.UnionMap  # the window's reads of the tensor the statement writes
    order: isl.UnionMap  # program order of the window's statements
    sink_order: isl.UnionMap  # program order of the statement's own instances

    @property
    def statements(self) -> int:
        return max(1, self.order.n_map())


def _dataflow(ctx: isl.Context, problem: _Problem) -> tuple[isl.UnionMap, isl.UnionMap] | None:
    """(flow, false) by isl's exact dataflow analysis (only the last writer before a read),
    or None past FLOW_OPERATIONS_PER_STATEMENT."""
    ctx.reset_operations()
    ctx.set_max_operations(FLOW_OPERATIONS_PER_STATEMENT * problem.statements)
    try:
        flow = (isl.UnionAccessInfo.from_sink(problem.sink_reads)
                .set_must_source(problem.writes)
                .set_schedule_map(problem.order)
                .compute_flow().get_must_dependence())
        false = (isl.UnionAccessInfo.from_sink(problem.sink_write)
                 .set_kill(problem.writes)
                 .set_may_source(problem.writes.union(problem.reads))
                 .set_schedule_map(problem.order)
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


def _memory_based(problem: _Problem) -> tuple[isl.UnionMap, isl.UnionMap]:
    """(flow, false) as every earlier access of the window to the same element: a superset
    of what the dataflow analysis gives, so every schedule that respects it is still
    legal, found without the lexmax over the writers that makes the exact analysis blow
    up."""
    before = problem.order.lex_lt_union_map(problem.sink_order)
    flow = problem.writes.apply_range(problem.sink_reads.reverse()).intersect(before)
    false = problem.writes.union(problem.reads).apply_range(problem.sink_write.reverse()) \
        .intersect(before)
    return flow, false


def _reduction_updates(scop: Scop) -> tuple[str, ...]:
    """The reduction update statements whose order is relaxed (those with instances: an
    empty domain, e.g. a size 0, leaves a statement out)."""
    present = {s.get_tuple_name() for s in sets(scop.domain)}
    return tuple(st.id for st in scop.statements
                 if st.kind == "reduce" and st.source.reduction_indices and st.id in present)


def _order_free_pairs(accesses: _Accesses, own: str) -> isl.UnionMap:
    """Every pair of updates of the same element, earlier to later in program order.

    Not just each update's predecessor (what flow analysis gives): a loop is parallel only
    if no two of its iterations update one element, and once the updates may be reordered,
    two that were far apart in program order can meet in one loop (interchanging the
    reduction loops of a sum over j, k makes the inner j loop look parallel otherwise).
    """
    _, target = accesses.writes[own]
    order = accesses.order[own]
    same = target.apply_range(target.reverse())
    return isl.UnionMap.from_map(same.intersect(order.lex_lt_map(order)))


def _recurrence_reads(scop: Scop, relaxed: tuple[str, ...]) -> dict[str, isl.Map]:
    """A relaxed update's reads of other points of its own target (a recurrence), by
    statement: every instance that reads such a point."""
    found: dict[str, isl.Map] = {}
    ids = scop.summed_recurrences.intersection(relaxed)
    if not ids:
        return found  # (nearly every program: no domain walked)
    domains = {s.get_tuple_name(): s for s in sets(scop.domain)}
    for st in scop.statements:
        if st.id not in ids:
            continue
        for read in recurrence_reads(st.source):
            m = scop.ref_reads[(st.id, read.ref)].intersect_domain(domains[st.id])
            found[st.id] = found[st.id].union(m) if st.id in found else m
    return found


def _recurrence_fence(accesses: _Accesses, own: str) -> isl.UnionMap:
    """Every update of a point before every instance of the same statement that reads
    that point as an earlier one (a recurrence): the updates may run in any order among
    themselves, but the point is read once all of them are done. Flow analysis would give
    only the last update in program order."""
    _, updates = accesses.writes[own]
    return isl.UnionMap.from_map(updates.apply_range(accesses.recurrent[own].reverse()))


def _fences(accesses: _Accesses, own: str, other: str) -> isl.UnionMap:
    """The pairs (earlier access -> update) or (update -> later access) of one element, for
    one reduction statement's updates (`own`) and another statement's accesses to the
    same tensor: all of one statement's instances run before all of the other's."""
    tensor, updates = accesses.writes[own]
    access = accesses.reads.get(other, {}).get(tensor)
    write = accesses.writes.get(other)
    if write is not None and write[0] == tensor:
        access = write[1] if access is None else access.union(write[1])
    same = updates.apply_range(access.reverse())  # update -> other access, same element
    if accesses.position[own] < accesses.position[other]:
        return isl.UnionMap.from_map(same)
    return isl.UnionMap.from_map(same.reverse())


def _union(parts: list, space: isl.Space) -> isl.UnionMap:
    """The union of maps or union maps (an empty one in `space` if there are none), joined
    pairwise: isl copies a union map to add to it, so adding them one by one would cost
    time quadratic in the program."""
    level = [p if isinstance(p, isl.UnionMap) else isl.UnionMap.from_map(p) for p in parts]
    if not level:
        return isl.UnionMap.empty(space)
    while len(level) > 1:
        level = [level[k].union(level[k + 1]) if k + 1 < len(level) else level[k]
                 for k in range(0, len(level), 2)]
    return level[0]


def _source(m: isl.Map) -> str:
    return m.get_tuple_name(isl.dim_type.in_)


def _sink(m: isl.Map) -> str:
    return m.get_tuple_name(isl.dim_type.out)
