"""Programs of many statements scheduled in groups, and the groups' loops fused back.

isl's scheduler costs time superlinear in the statements it sees at once: its clustering
(PPCG's options) scheduled a chain of in-place updates of one vector in 8 ms at 25
statements, 0.11 s at 100, 0.59 s at 200 (about n^2.3), and ran past the 3 s limit at 400,
whose fallback then left every statement a loop of its own. A program of more than
SPLIT_STATEMENTS statements is therefore split before isl sees it (PPCG and Tensor
Comprehensions likewise schedule strongly connected components apart):

- into its independent components (no dependence between them: any order is legal);
- small components packed together, in program order, into groups of at most
  SPLIT_STATEMENTS statements (isl schedules each component of a group apart itself);
- a larger component cut, in program order, into runs of SPLIT_STATEMENTS / 2 to
  SPLIT_STATEMENTS statements, each cut where the fewest pairs of dependent statements
  cross it. Every dependence goes forward in program order, so runs in a sequence keep
  every one that crosses a cut.

Each group is scheduled by isl (scheduler.py, with its time limit and fallbacks). What isl
fused stays fused; what a cut separated is fused back here where that is legal and keeps
what the strategy asks: consecutive pieces (a group's whole schedule, or each child of its
top sequence or set) whose outermost bands have as many members, run over the same values,
and every dependence between them keeps a distance of 0 or more in each member (the fused
band stays permutable where both were); unless the strategy is "max", only where the same
members are parallel (coincident) in both and stay so; never with "min". So 1,000
in-place updates or 1,000 temporaries each read by the next run as one loop, as isl made
them at 200 statements, and 1,000 independent outputs over one vector too (isl leaves
independent statements a loop each; one loop is 1,000 loops' worth less code for LLVM),
at a cost linear in the statements. The cuts are chosen by counting dependent pairs, not
by asking whether a loop could be shared across them (isl's question): a cut through a
chain that isl would have fused costs a loop only where the join cannot fuse it back.

Every benchmark and test-corpus operator has at most 20 statements: they are scheduled
whole, exactly as before (benchmarks/loop_ir_dump.py shows their loop IR unchanged).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import islpy as isl

from polyhedral.dependences import Dependences
from polyhedral.isl_callbacks import maps, sets

SPLIT_STATEMENTS = 32
"""The most statements isl's scheduler sees at once: twice the largest benchmark or corpus
operator, and a group of in-place updates of this size costs isl about 20 ms."""


def statement_groups(ids: list[str], deps: Dependences,
                     limit: int = SPLIT_STATEMENTS) -> list[list[str]]:
    """The statements `ids` (in program order) in groups of at most `limit`, in an order
    that keeps every dependence forward (see the module's docstring)."""
    groups: list[list[str]] = []
    packed: list[str] = []
    position = {sid: k for k, sid in enumerate(ids)}
    for component in _components(ids, deps):
        if len(component) > limit:
            groups.extend(_runs(component, deps, limit))
            continue
        if len(packed) + len(component) > limit:
            groups.append(sorted(packed, key=position.__getitem__))
            packed = []
        packed.extend(component)
    if packed:
        groups.append(sorted(packed, key=position.__getitem__))
    return groups


def _components(ids: list[str], deps: Dependences) -> list[list[str]]:
    """The weakly connected components of the statements' dependence graph, each in
    program order, ordered by their first statement."""
    parent = {sid: sid for sid in ids}

    def root(sid: str) -> str:
        while parent[sid] != sid:
            parent[sid] = parent[parent[sid]]
            sid = parent[sid]
        return sid

    for sink in ids:
        for source in deps.sources(sink):
            if source in parent:
                parent[root(source)] = root(sink)
    members: dict[str, list[str]] = {}
    for sid in ids:  # a component's first statement makes its entry: in order of those
        members.setdefault(root(sid), []).append(sid)
    return list(members.values())


def _runs(component: list[str], deps: Dependences, limit: int) -> list[list[str]]:
    """The component (in program order) cut into runs of limit / 2 to `limit` statements,
    each cut where the fewest pairs of dependent statements cross."""
    index = {sid: k for k, sid in enumerate(component)}
    change = [0] * (len(component) + 2)
    for sink in component:
        for source in deps.sources(sink):
            first, last = index[source], index[sink]
            if first < last:  # the cuts first+1 .. last separate them
                change[first + 1] += 1
                change[last + 1] -= 1
    crossing, running = [], 0
    for k in range(len(component) + 1):
        running += change[k]
        crossing.append(running)
    runs, start = [], 0
    while len(component) - start > limit:
        cuts = range(start + max(1, limit // 2), start + limit + 1)
        cut = min(cuts, key=lambda c: (crossing[c], -c))
        runs.append(component[start:cut])
        start = cut
    runs.append(component[start:])
    return runs


# ---- the groups' schedules as one tree ----------------------------------------------------

@dataclass
class _Piece:
    """A subtree of a group's schedule, the instances it runs, and its outermost band."""
    domain: isl.UnionSet
    node: isl.ScheduleNode
    statements: set[str]
    band: bool = False
    members: int = 0
    permutable: bool = False
    coincident: list[bool] = field(default_factory=list)
    partial: isl.MultiUnionPwAff | None = None
    time: dict[str, isl.Map] = field(default_factory=dict)  # statement -> band values


@dataclass
class _Run:
    """Consecutive pieces that run in one band (or a piece that has none)."""
    pieces: list[_Piece]
    coincident: list[bool]
    permutable: bool
    image: isl.UnionSet | None  # the values the band runs over
    time: dict[str, isl.Map]  # each statement's instances -> the band's values


def join_groups(domain: isl.UnionSet, schedules: list[isl.Schedule], deps: Dependences,
                fusion: str) -> isl.Schedule:
    """The groups' schedules (in order) as one schedule of `domain`: a sequence of runs,
    each run's pieces fused in one band where that is legal (see the module's
    docstring). Done even once the compile budget is spent (groups then in program
    order): it costs time linear in the pieces (0.11 s for 1,000 statements), and a
    1,000-statement chain left as 1,000 loops cost 14 s of LLVM instead of 1 s."""
    runs: list[_Run] = []
    for schedule in schedules:
        for piece in _pieces(schedule):
            if runs and fusion != "min" and _join(runs[-1], piece, deps, fusion):
                continue
            runs.append(_start(piece))
    root = isl.Schedule.from_domain(domain).get_root().child(0)
    if len(runs) == 1:
        return _build(root, runs[0]).get_schedule()
    filters = isl.UnionSetList.alloc(domain.get_ctx(), len(runs))
    for run in runs:
        filters = filters.add(union_sets([p.domain for p in run.pieces]))
    node = root.insert_sequence(filters)
    for k, run in enumerate(runs):
        node = _build(node.child(k).child(0), run).parent().parent()
    return node.get_schedule()


def _pieces(schedule: isl.Schedule) -> list[_Piece]:
    """The children of a group's top sequence or set, else the group's whole tree."""
    top = schedule.get_root().child(0)
    if top.get_type() in (isl.schedule_node_type.sequence, isl.schedule_node_type.set):
        return [_piece(top.child(k).child(0)) for k in range(top.n_children())]
    return [_piece(top)]


def _piece(node: isl.ScheduleNode) -> _Piece:
    domain = node.get_domain()
    piece = _Piece(domain, node, {s.get_tuple_name() for s in sets(domain)})
    if node.get_type() == isl.schedule_node_type.band and node.band_n_member() > 0:
        partial = node.band_get_partial_schedule().intersect_domain(domain)
        piece.band, piece.members, piece.partial = True, node.band_n_member(), partial
        piece.permutable = bool(node.band_get_permutable())
        piece.coincident = [bool(node.band_member_get_coincident(k))
                            for k in range(piece.members)]
        time = isl.UnionMap.from_multi_union_pw_aff(partial).intersect_domain(domain)
        piece.time = {m.get_tuple_name(isl.dim_type.in_): m for m in maps(time)}
    return piece


def _start(piece: _Piece) -> _Run:
    image = _image(piece) if piece.band else None
    return _Run([piece], list(piece.coincident), piece.permutable, image, dict(piece.time))


def _image(piece: _Piece) -> isl.UnionSet:
    """The values the piece's band runs over."""
    return union_sets([isl.UnionSet.from_set(m.range()) for m in piece.time.values()])


def _join(run: _Run, piece: _Piece, deps: Dependences, fusion: str) -> bool:
    """Add `piece` to `run`'s band if it has as many members, runs over the same values,
    and every dependence into it from the run keeps a distance of 0 or more in each
    member; unless the strategy is "max", only where the same members are parallel
    (coincident) in both and stay so (a distance of 0)."""
    if run.image is None or not piece.band or piece.members != len(run.coincident):
        return False
    if not _image(piece).is_equal(run.image):
        return False
    kept = [a and b for a, b in zip(run.coincident, piece.coincident)]
    for dep in deps.links(run.time, piece.statements):
        source, sink = dep.get_tuple_name(isl.dim_type.in_), dep.get_tuple_name(isl.dim_type.out)
        distances = dep.apply_domain(run.time[source]).apply_range(piece.time[sink]).deltas()
        if not distances.is_subset(_nonnegative(distances.get_space())):
            return False
        kept = [c and distances.is_subset(_zero_at(distances.get_space(), m))
                for m, c in enumerate(kept)]
    if fusion != "max" and not kept == run.coincident == piece.coincident:
        return False  # isl's strategy keeps every parallel member parallel
    run.pieces.append(piece)
    run.coincident = kept
    run.permutable = run.permutable and piece.permutable
    run.time.update(piece.time)
    return True


def _nonnegative(space: isl.Space) -> isl.Set:
    box = isl.Set.universe(space)
    for m in range(space.dim(isl.dim_type.set)):
        box = box.lower_bound_val(isl.dim_type.set, m, isl.Val.zero(space.get_ctx()))
    return box


def _zero_at(space: isl.Space, member: int) -> isl.Set:
    return isl.Set.universe(space).fix_val(isl.dim_type.set, member, isl.Val.zero(space.get_ctx()))


def _build(leaf: isl.ScheduleNode, run: _Run) -> isl.ScheduleNode:
    """`run` rebuilt at `leaf`; the node at that position."""
    if not run.pieces[0].band:  # no band to share: the piece as isl made it
        return _copy(leaf, run.pieces[0].node)
    partials = [piece.partial for piece in run.pieces]
    while len(partials) > 1:  # pairwise: each union copies what it adds to
        partials = [partials[k].union_add(partials[k + 1]) if k + 1 < len(partials)
                    else partials[k] for k in range(0, len(partials), 2)]
    partial = partials[0]
    node = leaf.insert_partial_schedule(partial).band_set_permutable(int(run.permutable))
    for m, coincident in enumerate(run.coincident):
        node = node.band_member_set_coincident(m, int(coincident))
    if len(run.pieces) == 1:
        return _copy(node.child(0), run.pieces[0].node.child(0)).parent()
    filters = isl.UnionSetList.alloc(leaf.get_ctx(), len(run.pieces))
    for piece in run.pieces:
        filters = filters.add(piece.domain)
    inner = node.child(0).insert_sequence(filters)
    for k, piece in enumerate(run.pieces):
        inner = _copy(inner.child(k).child(0), piece.node.child(0)).parent().parent()
    return inner.parent()


def _copy(target: isl.ScheduleNode, source: isl.ScheduleNode) -> isl.ScheduleNode:
    """The subtree at `source` (bands, sequences, sets: what isl's scheduler makes) rebuilt
    at the leaf `target`; the node at that position."""
    kind = source.get_type()
    if kind == isl.schedule_node_type.leaf:
        return target
    if kind == isl.schedule_node_type.band:
        node = target.insert_partial_schedule(source.band_get_partial_schedule())
        node = node.band_set_permutable(source.band_get_permutable())
        for m in range(source.band_n_member()):
            node = node.band_member_set_coincident(m, source.band_member_get_coincident(m))
        return _copy(node.child(0), source.child(0)).parent()
    if kind in (isl.schedule_node_type.sequence, isl.schedule_node_type.set):
        filters = isl.UnionSetList.alloc(source.get_ctx(), source.n_children())
        for k in range(source.n_children()):
            filters = filters.add(source.child(k).filter_get_filter())
        node = target.insert_sequence(filters) if kind == isl.schedule_node_type.sequence \
            else target.insert_set(filters)
        for k in range(source.n_children()):
            node = _copy(node.child(k).child(0), source.child(k).child(0)).parent().parent()
        return node
    raise ValueError(f"unexpected schedule node {kind} in a group's schedule")


def union_sets(sets: list[isl.UnionSet]) -> isl.UnionSet:
    """Their union, joined pairwise (adding one by one copies the growing union)."""
    while len(sets) > 1:
        sets = [sets[k].union(sets[k + 1]) if k + 1 < len(sets) else sets[k]
                for k in range(0, len(sets), 2)]
    return sets[0]
