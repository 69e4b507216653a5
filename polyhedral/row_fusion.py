"""Row fusion: a row-wise reduction and its consumers in one pass per row (CPU).

isl's scheduler under PPCG's options keeps softmax's division (`Y(n, d) = exp(X(n, d) -
m(n)) / s(n)`) in a nest of its own after the nest of the row reductions (m, s): merging
them into one band would cost the consumer's parallel `d` loop, and isl merges whole bands
or nothing. Two nests read every row twice from memory (a 4096 x 1024 float32 X is 16 MB,
far past L2). This pass fuses only the outer member instead: where consecutive children
of the root sequence all start with a parallel (coincident) member, every dependence among
their statements keeps the same value of that member (distance 0), and the rows share no
two-dimensional operand, the tree becomes

    band [row] (coincident)  ->  mark "rows"  ->  sequence: each child's rest, in order

so each iteration of the row loop runs the reductions' loops and then the consumer's over
one row, which stays in L1 between them. Distance 0 makes the row loop parallel and keeps
every dependence: those inside a child keep their order (the child's band is only split
after its first member), those between children go from an earlier child of the sequence
to a later one at the same row. The "rows" mark tells the CPU tiling pass to treat the
bands below it as outermost ones.

It pays only where one row's data is reused within the row and not across rows: a child
that reads a tensor of two or more dimensions without the row index (an attention
product's K, a matmul's B) keeps its own nest, where tiling reuses that operand across
rows; and with concrete sizes, one row's data must fit in half of L2.
"""

from __future__ import annotations

import islpy as isl

from polyhedral import bands as B
from polyhedral.dependences import Dependences
from polyhedral.isl_callbacks import sets
from polyhedral.scop import Scop
from tclang.lang import sizes as Z
from tclang.lang.affine import Affine
from tclang.target import Target

ROW_MARK = "rows"  # above the sequence of one row's passes (polyhedral/tiling.py visits below)


def fuse_rows(schedule: isl.Schedule, scop: Scop, deps: Dependences,
              target: Target) -> isl.Schedule:
    """The schedule with each maximal legal, profitable run (at least two) of the root
    sequence's consecutive children fused along their outer member; unchanged where there
    is none."""
    start = 0
    while True:
        root = schedule.get_root().child(0)
        if root.get_type() != isl.schedule_node_type.sequence:
            return schedule
        children = [root.child(k) for k in range(root.n_children())]
        run = _next_run(children, start, scop, deps, target)
        if run is None:
            return schedule
        schedule = _fuse(root, *run).get_schedule()
        start = run[0] + 1  # the run is one child now, at its first position


def _next_run(children, start: int, scop: Scop, deps: Dependences, target: Target):
    """(first, last) positions of the first maximal run from `start` on that fuses."""
    k = start
    while k < len(children):
        last = k
        while last + 1 < len(children) and _fusible(children[k:last + 2], scop, deps, target):
            last += 1
        if last > k:
            return k, last
        k += 1
    return None


def _outer_member(child) -> isl.UnionPwAff | None:
    """A filter's band's first member over the filter's domain, where it is coincident."""
    if child.n_children() != 1:
        return None
    band = child.child(0)
    if band.get_type() != isl.schedule_node_type.band or \
            not band.band_member_get_coincident(0):
        return None
    upa = band.band_get_partial_schedule().get_union_pw_aff(0)
    return upa.intersect_domain(band.get_domain())


def _row_schedule(children) -> isl.UnionPwAff | None:
    """The children's outer members as one schedule of all their instances, or None where
    a child does not start with a coincident band member."""
    members = [_outer_member(c) for c in children]
    if any(m is None for m in members):
        return None
    row = members[0]
    for m in members[1:]:
        row = row.union_add(m)
    return row


def _fusible(children, scop: Scop, deps: Dependences, target: Target) -> bool:
    row = _row_schedule(children)
    if row is None:
        return False
    domain = row.domain()
    # the last child must consume something the others produce: otherwise nothing is
    # reused within a row, and fusing would only take the children's own loop orders
    earlier = _instances(children[0])
    for c in children[1:-1]:
        earlier = earlier.union(_instances(c))
    if deps.flow.intersect_domain(earlier).intersect_range(_instances(children[-1])) \
            .is_empty():
        return False
    rows = isl.UnionMap.from_union_pw_aff(row)
    within = deps.all.intersect_domain(domain).intersect_range(domain)
    if not _all_zero(within.apply_domain(rows).apply_range(rows).deltas()):
        return False
    return _pays(children, scop, target)


def _instances(child: isl.ScheduleNode) -> isl.UnionSet:
    """The statement instances a child of a sequence runs (a filter node's `get_domain`
    is what reaches the filter, before it filters)."""
    return child.child(0).get_domain()


def _all_zero(distances: isl.UnionSet) -> bool:
    """Whether every distance along the one-member row schedule is 0."""
    return all(s.is_subset(isl.Set.universe(s.get_space()).fix_dim_si(0, 0))
               for s in sets(distances))


def _pays(children, scop: Scop, target: Target) -> bool:
    """Whether the rows share no operand of two or more dimensions (each row's data is
    its own) and, with concrete sizes, one row's data fits in half of L2."""
    row_index: dict[str, str] = {}
    for child in children:
        for sid, index in B.members(child.child(0), scop)[0].index_of.items():
            if index is None:  # the member mixes indices, or is a constant
                return False
            row_index[sid] = index
    bytes_per_row = {}
    for sid, index in row_index.items():
        st = scop.statement(sid)
        accesses = [(st.source.target, tuple(Affine.index(i) for i in st.source.indices))]
        if st.kind != "init":
            accesses += [(r.tensor, r.affine) for r in st.source.reads()]
        for tensor, subscripts in accesses:
            moves = [a is not None and index in a.indices() for a in subscripts]
            if len(subscripts) >= 2 and not any(moves):
                return False  # reused across rows: its own nest tiles for that
            row = _row_bytes(scop, tensor, moves)
            if row is not None:  # (None: a generic size: assumed to fit)
                bytes_per_row[tensor] = row
    return sum(bytes_per_row.values()) <= target.l2_bytes // 2


def _row_bytes(scop: Scop, tensor: str, moves: list[bool]) -> int | None:
    """The bytes of `tensor` one row touches: its extents along the dimensions that do
    not move with the row; None where one of them is a generic size."""
    count = 1
    for extent, moving in zip(scop.extents[tensor], moves):
        if not moving:
            value = Z.known_value(extent, scop.sizes)
            if value is None:
                return None
            count *= max(1, value)
    return count * scop.definition.tensor(tensor).dtype.numpy.itemsize


def _fuse(root: isl.ScheduleNode, first: int, last: int) -> isl.ScheduleNode:
    """The root sequence with children first..last fused along their outer member."""
    n = root.n_children()
    if (first, last) != (0, n - 1):  # nest the run in a sequence of its own first
        filters = isl.UnionSetList.alloc(root.get_ctx(), n - (last - first))
        group = _instances(root.child(first))
        for k in range(n):
            if first < k <= last:
                group = group.union(_instances(root.child(k)))
            if k < first or k > last:
                filters = filters.add(_instances(root.child(k)))
            elif k == last:
                filters = filters.add(group)
        root = root.insert_sequence(filters).child(first).child(0)
    row = _row_schedule([root.child(k) for k in range(root.n_children())])
    for k in range(root.n_children()):
        band = root.child(k).child(0)
        if band.band_n_member() > 1:
            band = band.band_split(1)
        root = band.delete().parent().parent()
    node = root.insert_partial_schedule(isl.MultiUnionPwAff.from_union_pw_aff(row))
    node = node.band_set_permutable(1).band_member_set_coincident(0, 1)
    node = node.child(0).insert_mark(isl.Id(ROW_MARK, context=node.get_ctx())).parent()
    while node.has_parent():
        node = node.parent()
    return node
