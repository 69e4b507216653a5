"""`tclang explain` opens with a one-screen summary of the schedule's decisions, read from
the loop IR and the tiling's reports (tclang/driver/summary.py): each decision it states is
checked here against the loop IR itself. And `--stage timings` times every stage, also
for a kernel the caches already hold (it is compiled afresh)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

import tclang as tc
from polyhedral import loop_ir as L
from polyhedral.loop_format import format_index
from tclang.cli import main

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "operators.tc"
PREFIX = """def prefix(float(N) A) -> (O) {
    O(i) +=! (j <= i) ? A(j) : 0.0 where i in 0:N, j in 0:N
}"""
F32 = np.float32


def compiled(source: str, entry: str, *shapes, options=None):
    kernel = tc.define(source, options=options)[entry]
    return kernel.compile(*(np.ones(s, F32) for s in shapes), fresh=True)


def loops_of(kernel: L.Kernel, outer=()):
    """(For, the Fors around it) for every loop, parents first."""
    def visit(node, around):
        match node:
            case L.For(body=body):
                yield node, around
                yield from visit(body, around + (node,))
            case L.If(then=t, other=o):
                yield from visit(t, around)
                if o is not None:
                    yield from visit(o, around)
            case L.Block(body=items):
                for item in items:
                    yield from visit(item, around)
            case L.Scratch(body=body) | L.Launch(body=body):
                yield from visit(body, around)
    return list(visit(kernel.body, outer))


def test_a_matmul_summary_reports_the_loop_irs_register_tile_packing_and_threads():
    ck = compiled(EXAMPLE.read_text(), "matmul", (128, 64), (64, 48))
    summary, kernel = ck.summary(), ck.loop_ir
    loops = loops_of(kernel)
    outermost_parallel = [f.var for f, around in loops
                          if f.parallel and not any(a.parallel for a in around)]
    assert [t.var for t in summary.threads] == outermost_parallel != []
    unrolled = [f for f, _ in loops if f.unrolled]
    tile = summary.register_tiles[0]
    assert tile.target == "C" and tile.indices == ("m", "n")
    assert tile.extents == tuple(f.hi.value - f.lo.value for f in unrolled[:2])
    assert tile.lanes == "n" and unrolled[1].vectorize
    scratch = [b.name for n in L.walk_nodes(kernel.body) if isinstance(n, L.Scratch)
               for b in n.buffers]
    assert [p.buffer for p in summary.packed] == scratch and summary.packed[0].tensor == "B"
    (band,) = summary.bands
    assert band.indices == ("m", "n", "k") and "register tile" in band.reason
    assert summary.guards == () and summary.temporaries == ()
    assert summary.flops == 2 * 128 * 64 * 48
    assert summary.moved == 4 * (128 * 64 + 64 * 48 + 128 * 48)
    text = summary.text()
    shape = " x ".join(map(str, tile.extents))
    assert f"registers   C: {shape} (m x n) kept in registers, vector lanes along n" in text
    assert f"packing     B -> {scratch[0]}" in text
    assert f"threads     {outermost_parallel[0]} (m" in text
    assert "tiles       m x n x k: " in text and "FLOP/B" in text
    assert len(text.splitlines()) < 25  # one screen


def test_a_softmax_summary_reports_its_contracted_temporaries_and_vector_loops():
    ck = compiled(EXAMPLE.read_text(), "softmax", (16, 40))
    summary, kernel = ck.summary(), ck.loop_ir
    plans = {p.buffer.name: p for p in kernel.temporaries}
    assert {p.buffer.name for p in summary.temporaries} == set(plans) >= {"rowmax", "rowsum"}
    text = summary.text()
    for name, plan in plans.items():
        assert plan.contracted
        assert f"temporary   {name}: contracted to {plan.note}, one per iteration of " \
               f"{plan.loop}" in text
    vector = [f for f, _ in loops_of(kernel) if f.vectorize and not f.unrolled]
    assert [v.var for v in summary.vector] == [f.var for f in vector]
    assert all(v.indices == ("d",) for v in summary.vector)
    assert summary.register_tiles == () and "no register tile" in text
    assert "fusion      preserve_parallel + rows" in text


def test_a_guarded_reduction_summary_names_the_guard_left_in_its_inner_loop():
    # the reset fused into the sum's nest (isl's strategy alone) and no vector loop, so
    # polyhedral/guard_splitting.py leaves its test where isl put it
    ck = compiled(PREFIX, "prefix", (100,),
                  options=tc.Options(fusion="preserve_parallel", vectorize=False))
    summary, kernel = ck.summary(), ck.loop_ir
    inner = [(n, f) for f, _ in loops_of(kernel) for n in L.walk_nodes(f.body)
             if isinstance(n, L.If) and not any(isinstance(m, L.For)
                                                for m in L.walk_nodes(n.then))]
    innermost = [(n, f) for n, f in inner
                 if not any(isinstance(m, L.For) for m in L.walk_nodes(f.body))]
    assert innermost, "the fused reset stays guarded in the innermost loop"
    (guard,) = summary.guards
    node, loop = innermost[0]
    assert guard.condition == format_index(node.cond)
    assert guard.loop.startswith(f"{loop.var} (i")
    assert guard.statements == ("the reset of O (line 2)",)
    assert f"guards      if ({guard.condition}) in {guard.loop}, around the reset of O" \
        in summary.text()
    manual = compiled(PREFIX, "prefix", (100,), options=tc.Options(tile=(16, 16)))
    # one band per nest (the reset has its own: polyhedral/guard_splitting.py)
    assert {b.reason for b in manual.summary().bands} == {"manual (Options tile)"}


def test_explain_times_every_stage_of_a_kernel_the_caches_hold(tmp_path, capsys):
    path = tmp_path / "k.tc"
    path.write_text("def scale(float(N) X) -> (Y) { Y(i) = 2 * X(i) }\n")
    tc.define(path.read_text()).scale(np.ones(64, F32))  # now in both caches
    assert main(["explain", str(path), "--sizes", "N=64", "--no-limits",
                 "--stage", "timings"]) == 0
    out = capsys.readouterr().out
    timings = out.split("== compile time")[1]
    for stage in ("passes", "scop", "dependences", "schedule", "transform", "loops", "code"):
        assert f"{stage}:" in timings
    assert "cache load" not in timings and "loaded from the compile cache" not in out
    assert out.index("== summary") < out.index("== compile time")


def test_explain_measures_the_machine_for_its_roofline_unless_told_not_to(
        tmp_path, capsys, monkeypatch):
    import tclang.driver.roofline as roofline
    monkeypatch.setattr(roofline, "machine_limits",
                        lambda **_: {"sgemm_gflops": 100.0, "triad_gbs": 10.0})
    path = tmp_path / "k.tc"
    path.write_text("def scale(float(N) X) -> (Y) { Y(i) = 2 * X(i) }\n")
    assert main(["explain", str(path), "--sizes", "N=1000"]) == 0
    out = capsys.readouterr().out
    # 1000 FLOP over 8000 B: memory-bound at 10 GB/s, 0.8 us at best
    assert "0.12 FLOP/B; this machine: sgemm 100 GFLOP/s, triad 10.0 GB/s -> " \
           "memory-bound, at best 0.0008 ms" in out
