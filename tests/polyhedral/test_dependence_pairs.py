"""Dependences computed per statement (polyhedral/dependences.py) are the whole-program
analysis's, and cost time linear in the statements.

`whole_program` below is the analysis as tclang did it before (isl's dataflow analysis over
every access of the program, the order-free pairs and the fences from the whole program
order): the specification the per-statement one must meet, relation for relation, on every
corpus kernel, specialized and shape-generic, with reductions relaxed and in order.
"""

from __future__ import annotations

import time

import islpy as isl
import numpy as np
import pytest

from polyhedral.dependences import compute_dependences
from polyhedral.scop import Scop, build_scop
from tclang.runtime.arguments import bind_arguments
from tclang.lang.frontend import check_source
from benchmarks.einsum_networks import network
from benchmarks.many_statements import source as many_source
from tests.corpus import CASES


def whole_program(scop: Scop, reorder_reductions: bool = True) -> dict[str, isl.UnionMap]:
    """The exact dependences over the whole program at once (the former analysis)."""
    updates = []
    if reorder_reductions:
        names = set()
        scop.domain.foreach_set(lambda s: names.add(s.get_tuple_name()))
        updates = [isl.UnionSet.from_set(scop.domain.extract_set(_space(scop, st.id)))
                   for st in scop.statements
                   if st.kind == "reduce" and st.source.reduction_indices and st.id in names]
    writes, reads = scop.writes, scop.reads.intersect_range(scop.writes.range())
    for own in updates:
        target = scop.writes.intersect_domain(own)
        writes = writes.subtract(target)
        reads = reads.subtract(reads.intersect_domain(own).intersect_range(target.range()))
    flow = (isl.UnionAccessInfo.from_sink(reads).set_must_source(writes)
            .set_schedule_map(scop.order).compute_flow().get_must_dependence())
    false = (isl.UnionAccessInfo.from_sink(writes).set_kill(writes)
             .set_may_source(writes.union(reads)).set_schedule_map(scop.order)
             .compute_flow().get_may_dependence())
    before = scop.order.lex_lt_union_map(scop.order)
    reduction = fences = isl.UnionMap.empty(flow.get_space())
    for own in updates:
        target = scop.writes.intersect_domain(own)
        reduction = reduction.union(target.apply_range(target.reverse()).intersect(before))
        others = scop.reads.union(scop.writes).subtract_domain(own)
        same = target.apply_range(others.reverse())
        fences = fences.union(same.intersect(before)).union(same.reverse().intersect(before))
    return dict(flow=flow, false=false, reduction=reduction, fences=fences)


def _space(scop: Scop, sid: str) -> isl.Space:
    found = []
    scop.domain.foreach_set(lambda s: found.append(s.get_space())
                            if s.get_tuple_name() == sid else None)
    return found[0]


def _scops(case):
    defn = next(d for d in check_source(case.source).definitions if d.name == case.entry)
    rng = np.random.default_rng(0)
    sizes = bind_arguments(defn, case.make_inputs(case.shapes[0], rng)).sizes
    return [build_scop(defn, sizes), build_scop(defn, None)]


@pytest.mark.filterwarnings("ignore::tclang.errors.TCWarning")
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_per_statement_dependences_are_the_whole_program_ones(case):
    for scop in _scops(case):
        for reorder in (True, False):
            ours = compute_dependences(scop, reorder)
            for kind, theirs in whole_program(scop, reorder).items():
                assert getattr(ours, kind).is_equal(theirs), \
                    f"{case.name} {kind} (sizes {scop.sizes}, reorder {reorder})"


def test_restricting_to_statements_keeps_their_dependences():
    """`among` gives the dependences between the statements named, nothing else."""
    scop = build_scop(check_source(many_source(12, "inplace")).definitions[0], dict(N=4))
    deps = compute_dependences(scop)
    some = {"S3", "S4", "S7"}
    ctx = scop.ctx
    chosen = isl.UnionSet("{ S3[i]; S4[i]; S7[i] }", context=ctx)
    expected = deps.validity.intersect_domain(chosen).intersect_range(chosen)
    assert deps.among(some).validity.is_equal(expected) and not expected.is_empty()
    assert deps.sources("S4") == {"S3"}  # S3 wrote all of O last: S0..S2 reach S4 through it


def _cpu_seconds(scop) -> float:
    best = float("inf")
    for _ in range(2):
        start = time.process_time()
        compute_dependences(scop)
        best = min(best, time.process_time() - start)
    return best


@pytest.mark.parametrize("kind, small, large", [("inplace", 60, 240), ("network", 8, 32)])
def test_dependence_analysis_grows_linearly(kind, small, large):
    """Four times the statements cost about four times the time (at most eight here: CPU
    time, the best of two, on a shared machine). Before, every reduction rebuilt the whole
    program order and isl analysed every access at once: a chain of in-place updates grew
    about as n^2.5 and a tensor network as n^3 (x32 and x60 over this range)."""
    def scop_of(n):
        text = network(n).source if kind == "network" else many_source(n, kind)
        defn = check_source(text).definitions[0]
        sizes = {name: 2 if kind == "network" else 16 for name in defn.sizes}
        return build_scop(defn, sizes)
    ratio = _cpu_seconds(scop_of(large)) / max(_cpu_seconds(scop_of(small)), 1e-3)
    assert ratio < 8, f"{kind}: x{ratio:.1f} for x4 the statements"
