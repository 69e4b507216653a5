"""Programs of many statements: scheduled in groups isl can afford, fused back where
legal (polyhedral/statement_groups.py)."""

from __future__ import annotations

import numpy as np
import pytest

import tclang as tc
from benchmarks.einsum_networks import network
from benchmarks.many_statements import source as many_source
from polyhedral import scheduler
from polyhedral import loop_ir as L
from polyhedral.dependences import compute_dependences
from polyhedral.pipeline import schedule_definition
from polyhedral.scop import build_scop
from tclang.lang.frontend import check_source
from tclang.target import Target

CPU = Target("cpu", "threads", cores=2, vector_bytes=64)


def _deps(source: str, sizes: dict[str, int]):
    scop = build_scop(check_source(source).definitions[0], sizes)
    deps = compute_dependences(scop)
    return [st.id for st in scop.statements], deps


def _loops(node: L.Node) -> list[L.For]:
    return [n for n in L.walk_nodes(node) if isinstance(n, L.For)]


def test_groups_keep_components_apart_and_cut_chains_where_fewest_cross():
    from polyhedral.statement_groups import statement_groups
    ids, deps = _deps(many_source(80, "inplace"), dict(N=4))
    groups = statement_groups(ids, deps, limit=16)
    assert [s for g in groups for s in g] == ids  # in program order: dependences go forward
    assert all(8 <= len(g) <= 16 for g in groups)
    ids, deps = _deps(many_source(40, "independent"), dict(N=4))
    groups = statement_groups(ids, deps, limit=16)
    assert [len(g) for g in groups] == [16, 16, 8]  # independent ones packed


def test_a_network_is_cut_between_steps_not_inside_one():
    """A contraction step is an init and its update, joined by the fences: a cut between
    them crosses more dependences than one after the update."""
    from polyhedral.statement_groups import statement_groups
    ids, deps = _deps(network(30).source, {f"D{k}": 2 for k in range(200)})
    for group in statement_groups(ids, deps, limit=16):
        assert not group[-1].startswith("I"), group


def test_isl_sees_at_most_split_statements_at_once(monkeypatch):
    """Before, a chain of 200 in-place updates went to isl whole: about 0.6 s of isl's
    clustering (n^2.3), past its 3 s limit at 400, whose fallback left every update a
    loop of its own. Now isl sees groups, and the groups' loops are fused back: one
    parallel loop runs every update, as isl itself would have made it."""
    seen = []
    real = scheduler._in_worker

    def recording(scop, deps, strategy, limit):
        seen.append(scop.domain.n_set())
        return real(scop, deps, strategy, limit)

    monkeypatch.setattr(scheduler, "_in_worker", recording)
    defn = check_source(many_source(200, "inplace")).definitions[0]
    result = schedule_definition(defn, dict(N=64), tc.Options(), CPU)
    assert sum(seen) == 200 and max(seen) < 100  # in groups, never the whole chain
    assert result.strategy == "preserve_parallel" and result.fallback is None
    loops = _loops(result.kernel.body)
    assert len(loops) == 1 and loops[0].parallel


@pytest.mark.parametrize("fusion, loops", [(None, 1), ("max", 1), ("min", 48)])
def test_groups_fuse_back_only_as_the_strategy_would(fusion, loops):
    """48 temporaries, each read by the next at the same point: one loop (the
    temporaries contracted to scalars) unless "min" asks for every statement apart."""
    defn = check_source(many_source(48, "temporaries")).definitions[0]
    result = schedule_definition(defn, dict(N=32), tc.Options(fusion=fusion), CPU)
    assert len([n for n in _loops(result.kernel.body) if not n.unrolled]) == loops


def test_a_band_is_not_fused_where_a_dependence_would_go_backwards():
    """Each statement reads its predecessor's next element: fused as they are, the loop
    would read it before it is written (distance -1), so the groups' loops are fused only
    where isl shifted them to make every distance forward, or not at all; the legality
    check (TCLANG_VERIFY, on in the tests) and the results say the order is kept."""
    n = 40
    body = ["O0(i) = A(i)"] + [f"O{k}(i) = (i < N - 1) ? O{k - 1}(i + 1) * 0.5 : 0.0 "
                               "where i in 0:N" for k in range(1, n)]
    outputs = ", ".join(f"O{k}" for k in range(n))
    source = f"def f(float(N) A) -> ({outputs}) {{\n" + "\n".join(body) + "\n}"
    A = np.arange(1, 65, dtype=np.float32)
    got = tc.define(source, backend="reference").f(A)
    expected = A.astype(np.float64)
    for k, out in enumerate(got):
        if k:
            expected = np.concatenate([expected[1:] * 0.5, [0.0]])
        np.testing.assert_allclose(out, expected, rtol=1e-6, err_msg=f"O{k}")
