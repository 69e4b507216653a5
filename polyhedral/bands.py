"""Questions about schedule-tree bands, answered in the program's own terms.

Which statement index does a band member run over? How many iterations does it have?
Which member gives stride-1 accesses? The tiling and mapping passes ask these.
"""

from __future__ import annotations

from dataclasses import dataclass

import islpy as isl

from polyhedral.scop import Scop
from polyhedral.isl_callbacks import pieces as pieces_of, pw_affs, sets
from tclang.lang import sizes as Z
from tclang.lang.affine import Affine


@dataclass(frozen=True)
class Member:
    """One band member: for each statement, the index it runs over (None if it is a
    constant or a mix of indices for that statement), its extent if known, coincidence."""

    position: int
    index_of: dict[str, str | None]  # statement id -> index name
    extent: int | None
    coincident: bool


def members(node: isl.ScheduleNode, scop: Scop) -> list[Member]:
    partial = node.band_get_partial_schedule()
    domain = node.get_domain()
    out = []
    for k in range(node.band_n_member()):
        upa = partial.get_union_pw_aff(k)
        out.append(Member(k, _indices(upa, scop), _extent(upa, domain),
                          bool(node.band_member_get_coincident(k))))
    return out


def _indices(upa: isl.UnionPwAff, scop: Scop) -> dict[str, str | None]:
    found: dict[str, str | None] = {}

    def visit(pa: isl.PwAff) -> None:
        sid = pa.get_space().get_tuple_name(isl.dim_type.in_)
        st = scop.statement(sid)
        pieces = [aff for _, aff in pieces_of(pa)]
        index = None
        if len(pieces) == 1:
            aff = pieces[0]
            used = [st.indices[k] for k in range(aff.dim(isl.dim_type.in_))
                    if not aff.get_coefficient_val(isl.dim_type.in_, k).is_zero()]
            if len(used) == 1:
                index = used[0]
        found[sid] = index

    for pa in pw_affs(upa):
        visit(pa)
    return found


def _extent(upa: isl.UnionPwAff, domain: isl.UnionSet) -> int | None:
    """Number of values the member takes, when the sizes are concrete."""
    try:
        restricted = upa.intersect_domain(domain)
        high, low = restricted.max_val(), restricted.min_val()
    except isl.Error:
        return None
    if not (high.is_int() and low.is_int()):
        return None
    return high.to_python() - low.to_python() + 1


def stride_scores(node: isl.ScheduleNode, scop: Scop, band: list[Member]) -> list[float]:
    """How good each member is as the innermost loop (Pluto's intra-tile heuristic).

    For every access of every statement in the band: +1 when the member moves only the
    last subscript by one (stride-1: vectorizable), +1 when the access does not depend on
    the member at all (it stays in a register), -1 when it moves another subscript (a
    large stride); writes count double. Each statement weighs by its share of the band's
    instances, so an init or epilogue does not outvote the reduction it wraps.
    """
    scores = [0.0] * len(band)
    here = statement_ids(node)
    active = [st for st in scop.statements if st.id in here]
    weights = _weights(active, scop)
    for m in band:
        for st in active:
            index = m.index_of.get(st.id)
            if index is None:
                continue
            accesses = [(tuple(Affine.index(i) for i in st.source.indices), 2)]
            if st.kind != "init":
                accesses += [(r.affine, 1) for r in st.source.reads()]
            for subscripts, weight in accesses:
                scores[m.position] += weights[st.id] * weight * _stride_effect(subscripts, index)
    return scores


def short_members_penalized(scores: list[float], band: list[Member], target) -> list[float]:
    """A member with fewer values than a vector has lanes is a poor innermost loop even
    where its accesses are stride-1: a weight gradient's kw (3 values) would take the vector
    loop from w (32 values of a dot product). It keeps the place only where it wins by
    more than the penalty."""
    lanes = max(1, target.vector_bytes // 4)
    return [s - 1.5 if m.extent is not None and m.extent < lanes else s
            for s, m in zip(scores, band)]


def _weights(statements, scop: Scop) -> dict[str, float]:
    """Each statement's instances relative to the largest (a 1024^k guess when the sizes
    are not known)."""
    counts = {}
    for st in statements:
        n = 1
        for r in st.source.domain:
            if r.name in st.indices:
                extent = Z.known_value(r.extent, scop.sizes)
                n *= 1024 if extent is None else max(1, extent)
        counts[st.id] = n
    top = max(counts.values(), default=1)
    return {sid: n / top for sid, n in counts.items()}


def _stride_effect(subscripts, index: str) -> int:
    moves = [a is None or index in a.indices() for a in subscripts]
    if not any(moves):
        return 1  # invariant along the member: reused from a register
    if any(moves[:-1]):
        return -1
    last = subscripts[-1]
    if last is not None and abs(last.coefficient(index)) == 1:
        return 1
    return 0


def statement_ids(node: isl.ScheduleNode) -> set[str]:
    """The statements with instances at `node` (asked once per band, not per statement:
    a program of many statements has many of each)."""
    return {s.get_tuple_name() for s in sets(node.get_domain())}


def reads_reuse(node: isl.ScheduleNode, scop: Scop, band: list[Member]) -> bool:
    """Whether some read of a tensor with two or more dimensions stays the same along a
    member: then tiling keeps it in cache."""
    here = statement_ids(node)
    for st in scop.statements:
        if st.kind == "init" or st.id not in here:
            continue
        for read in st.source.reads():
            if len(read.affine) < 2:
                continue
            used = set().union(*(a.indices() for a in read.affine if a is not None))
            for m in band:
                index = m.index_of.get(st.id)
                if index is not None and index not in used:
                    return True
    return False


def permute(node: isl.ScheduleNode, order: list[int]) -> isl.ScheduleNode:
    """The band with its members in `order` (a permutation of positions).

    Only legal for a permutable band; the caller checks legality of the final schedule.
    """
    partial = node.band_get_partial_schedule()
    permutable = node.band_get_permutable()
    coincident = [node.band_member_get_coincident(k) for k in range(len(order))]
    permuted = partial
    for new, old in enumerate(order):
        permuted = permuted.set_union_pw_aff(new, partial.get_union_pw_aff(old))
    node = node.delete().insert_partial_schedule(permuted)
    node = node.band_set_permutable(permutable)
    for new, old in enumerate(order):
        node = node.band_member_set_coincident(new, coincident[old])
    return node


def merge_nested(node: isl.ScheduleNode, levels: int | None = None) -> isl.ScheduleNode:
    """The band merged with the bands nested directly below it (a chain, or only the next
    `levels` of it), as one band, marked not permutable: the caller knows better."""
    merged = 0
    while node.n_children() == 1 and node.child(0).get_type() == isl.schedule_node_type.band \
            and (levels is None or merged < levels):
        merged += 1
        outer = node.band_get_partial_schedule()
        inner = node.child(0).band_get_partial_schedule()
        coincident = [node.band_member_get_coincident(k) for k in range(node.band_n_member())]
        inner_node = node.child(0)
        coincident += [inner_node.band_member_get_coincident(k)
                       for k in range(inner_node.band_n_member())]
        node = node.delete().delete().insert_partial_schedule(outer.flat_range_product(inner))
        node = node.band_set_permutable(0)
        for k, c in enumerate(coincident):
            node = node.band_member_set_coincident(k, c)
    return node
