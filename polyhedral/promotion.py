"""Shared-memory promotion plan (PPCG's `gpu_group.c`, TC's memory promotion).

At the level of a kernel's tile loops, a tensor the kernel only reads, through affine
subscripts, is promoted when its accesses within one tile reuse elements (the access
relation is not injective) and its footprint fits the shared-memory budget. The footprint
is a box: per dimension an affine offset in the tile coordinates (the lexicographic
minimum) and a constant size (the largest extent over all tiles). The loop lowering copies
the box into the block's shared buffer (all threads, coalesced), synchronises, runs the
tile reading the buffer, and synchronises again before the next tile overwrites it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import islpy as isl

from polyhedral.scop import Scop
from polyhedral.isl_callbacks import maps, sets
from tclang.options import Options
from tclang.target import Target


@dataclass
class SharedTile:
    tensor: str
    buffer: str
    sizes: tuple[int, ...]  # the buffer's shape (innermost padded to avoid bank conflicts)
    box: tuple[int, ...]  # the footprint's extent per dimension
    offsets: list[isl.PwAff]  # per dimension, in the tile coordinates
    # per statement id: the offsets as functions of that statement's indices
    statement_offsets: dict[str, list[isl.PwAff]] = field(default_factory=dict)


def plan_shared(tile: isl.ScheduleNode, scop: Scop, options: Options,
                target: Target) -> list[SharedTile]:
    if options.shared_memory is False:
        return []
    domain = tile.get_domain()
    prefix = tile.band_get_partial_schedule_union_map().intersect_domain(domain)
    written = {s.get_tuple_name() for s in _sets(scop.writes.intersect_domain(domain).range())}
    candidates: dict[str, list[isl.Map]] = {}
    gathers: set[str] = set()
    for (sid, ref), access in scop.ref_reads.items():
        st = scop.statement(sid)
        if not _in(domain, sid):
            continue
        read = next(r for r in st.source.reads() if r.ref == ref)
        if read.is_gather:
            gathers.add(read.tensor)
        candidates.setdefault(read.tensor, []).append(access)
    budget = target.shared_bytes
    plans = []
    for tensor, accesses in candidates.items():
        if tensor in written or tensor in gathers or not scop.extents[tensor]:
            continue
        access = isl.UnionMap.from_map(accesses[0])
        for a in accesses[1:]:
            access = access.union(isl.UnionMap.from_map(a))
        access = access.intersect_domain(domain)
        if options.shared_memory is not True and access.is_injective():
            continue  # no element is read twice: copying would only add traffic
        tile_plan = _box(prefix, access, tensor, scop)
        if tile_plan is None:
            continue
        itemsize = scop.definition.tensor(tensor).dtype.numpy.itemsize
        bytes_needed = itemsize
        for s in tile_plan.sizes:
            bytes_needed *= s
        if bytes_needed > budget:
            continue
        budget -= bytes_needed
        _per_statement(tile_plan, tile, domain)
        plans.append(tile_plan)
    return plans


def _per_statement(plan: SharedTile, tile: isl.ScheduleNode, domain: isl.UnionSet) -> None:
    """The offsets pulled back to each statement's own indices (through the tile band)."""
    partial = tile.band_get_partial_schedule()
    for s in _sets(domain):
        prefix = partial.extract_multi_pw_aff(s.get_space())
        plan.statement_offsets[s.get_tuple_name()] = [
            o.pullback_multi_pw_aff(prefix).gist(s) for o in plan.offsets]


def _box(prefix: isl.UnionMap, access: isl.UnionMap, tensor: str, scop: Scop):
    """The footprint box of `access` per tile, or None if it is not a fixed-size box."""
    found = footprint_box(prefix, access)
    if found is None:
        return None
    offsets, box, _ = found
    sizes = list(box)
    if sizes and sizes[-1] % 2 == 0 and sizes[-1] > 1:
        sizes[-1] += 1  # an odd row length spreads a column over the memory banks
    return SharedTile(tensor, f"{tensor}_shared", tuple(sizes), tuple(box), list(offsets))


def footprint_box(prefix: isl.UnionMap, access: isl.UnionMap):
    """What `access` touches for one point of the `prefix` schedule (the loops outside a
    tile), as a box: (per dimension the lowest element, an affine function of the prefix
    with one piece; per dimension the largest extent over all prefix points; the prefix
    points that touch anything). None when it is not such a box (the footprint is not one
    map, a lowest element has several pieces, an extent is unbounded)."""
    scoped = prefix.reverse().apply_range(access)
    found = maps(scoped)
    if len(found) != 1:
        return None
    footprint = found[0]
    rank = footprint.dim(isl.dim_type.out)
    offsets, box = [], []
    for d in range(rank):
        one = footprint.project_out(isl.dim_type.out, d + 1, rank - d - 1) \
            .project_out(isl.dim_type.out, 0, d)
        low = one.lexmin_pw_multi_aff().get_pw_aff(0)
        high = one.lexmax_pw_multi_aff().get_pw_aff(0)
        if low.n_piece() != 1:
            return None
        extent = high.sub(low).max_val()
        if not extent.is_int():
            return None
        offsets.append(low)
        box.append(extent.to_python() + 1)
    return tuple(offsets), tuple(box), footprint.domain()


def _sets(u: isl.UnionSet) -> list[isl.Set]:
    return sets(u)


def _in(domain: isl.UnionSet, sid: str) -> bool:
    return any(s.get_tuple_name() == sid for s in _sets(domain))
