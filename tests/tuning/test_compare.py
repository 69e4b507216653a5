"""tclang compare / tc.compare: automatic vs manual vs tuned and NumPy, one table."""

from __future__ import annotations

import numpy as np
import pytest

import tclang as tc
from tclang.cli import main
from tclang.tuning.compare import parse_manual

from pathlib import Path

EXAMPLE = str(Path(__file__).resolve().parents[2] / "examples" / "operators.tc")
OPS = Path(EXAMPLE).read_text()


def test_manual_specs_parse_into_options():
    assert parse_manual("tile=32x32x64,unroll=4") == tc.Options(tile=(32, 32, 64), unroll=4)
    assert parse_manual("loop_order=k:m:n, register_tile=4x16, pack=off, fusion=max") == \
        tc.Options(loop_order=("k", "m", "n"), register_tile=(4, 16), pack=False,
                   fusion="max")
    assert parse_manual("register_tile=off,parallel=on") == \
        tc.Options(register_tile=False, parallel=True)
    for bad, words in (("tile=32xx", "not an integer"), ("tiles=4", "unknown knob"),
                       ("unroll", "not name=value"), ("pack=maybe", "on or off"),
                       ("fusion=most", "fusion must be one of")):
        with pytest.raises(tc.TCScheduleError, match=words):
            parse_manual(bad)


def test_peers_are_what_the_structure_says():
    from tclang.peers import recognise
    mod = tc.define(OPS)
    sizes = dict(M=8, K=8, N=8, B=4, I=8, O=8, D=8, C=2, H=6, W=6, KH=3, KW=3)
    assert recognise(mod.matmul.definition, sizes).numpy_text == \
        "np.einsum('ij,jk->ik', optimize=True)"
    assert recognise(mod.softmax.definition, sizes).name == "softmax over axis 1"
    assert recognise(mod.conv2d.definition, sizes).torch_text == \
        "torch.nn.functional.conv2d"
    assert recognise(mod.maxpool2x2.definition, sizes).name.startswith("max_pool2d")
    assert recognise(mod.mlp_layer.definition, sizes).name == \
        "einsum 'ij,kj->ik' + bias, then ReLU"
    assert recognise(mod.embedding.definition, dict(E=4, D=3, B=2, L=2)) is None  # gather


def test_compare_times_every_schedule_and_refuses_an_illegal_one():
    total = tc.define("def total(float(N, M) A) -> (s) {\n  s +=! A(i, j)\n}").total
    a = np.random.default_rng(0).random((30, 20), np.float32)
    result = tc.compare(total, a, manual=["tile=8x8", "reorder_reductions=off,loop_order=1:0"],
                        tune=2, rounds=2, limits=False, progress=False, min_time=0.01,
                        peers=("numpy",))  # the same rows with or without torch installed
    labels = [r.label for r in result.rows]
    assert labels[:3] == ["automatic", "manual: tile=8x8",
                          "manual: reorder_reductions=off,loop_order=1:0"]
    assert labels[3].startswith("tuned (2 trials)") and labels[4] == "numpy"
    illegal = result.rows[2]
    assert illegal.status == "refused" and "breaks a flow" in illegal.message
    assert illegal.seconds is None
    timed = [r for r in result.rows if r.status == "ok"]
    assert len(timed) == 4 and all(len(r.samples) == 2 for r in timed)
    assert result.row("automatic").compile_seconds > 0  # compiled cold in round one
    table = result.table()
    assert "| automatic |" in table and "refused: " in table
    assert "np.einsum('ij->', optimize=True)" in table


def test_tclang_compare_on_the_examples_prints_the_table_and_draws_the_chart(tmp_path,
                                                                          capsys):
    code = main(["compare", EXAMPLE, "--entry", "matmul", "--sizes",
                 "M=40,K=33,N=24", "--manual", "tile=16x16x16,unroll=2", "--rounds", "2",
                 "--out", str(tmp_path), "--no-limits"])
    out = capsys.readouterr().out
    assert code == 0
    assert "| manual: tile=16x16x16,unroll=2 |" in out and "| numpy |" in out
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert "pip install matplotlib" in out
    else:
        assert (tmp_path / "compare-matmul.png").stat().st_size > 1000


def test_tclang_compare_names_a_bad_manual_schedule(capsys):
    code = main(["compare", EXAMPLE, "--entry", "matmul", "--sizes",
                 "M=4,K=4,N=4", "--manual", "tile=4x4,speed=max"])
    assert code == 1
    assert "unknown knob 'speed'" in capsys.readouterr().err


def test_tclang_tune_stores_what_it_found(tmp_path, capsys):
    db = tmp_path / "t.sqlite"
    code = main(["tune", EXAMPLE, "--entry", "matmul", "--sizes", "M=9,K=7,N=16",
                 "--budget", "2", "--database", str(db)])
    out = capsys.readouterr().out
    assert code == 0 and out.startswith("tuned matmul: ") and f"stored in {db}" in out
    assert 'options="tuned"' in out
    # how to use them from the command line, with this (not the default) database
    assert f"TCLANG_TUNING_DB={db} tclang run {EXAMPLE} --entry matmul --sizes M=9,K=7,N=16 " \
        "--tuned" in out


def test_register_tiles_are_searched_only_for_contractions():
    from tclang.tuning.space import SearchSpace
    mod = tc.define(OPS)
    sizes = dict(M=8, K=8, N=8, B=4, I=8, O=8, D=8, C=2, H=6, W=6, KH=3, KW=3)
    knobs = {name: SearchSpace.of(mod[name].definition, sizes, "cpu").knobs
             for name in ("matmul", "mlp_layer", "conv2d", "softmax", "maxpool2x2")}
    for name in ("matmul", "mlp_layer", "conv2d"):
        assert "register_tile" in knobs[name] and "pack" in knobs[name]
    for name in ("softmax", "maxpool2x2"):
        assert "register_tile" not in knobs[name] and "pack" not in knobs[name]
    # a +=! is two statements to the scheduler (its initialisation and its update)
    assert "fusion" in knobs["softmax"] and "fusion" in knobs["matmul"]
