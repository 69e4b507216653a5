"""`tclang explain` and TCLANG_DUMP show the same stages under the same names
(tclang/stages.py), the optimized LLVM IR among them."""

from __future__ import annotations

import numpy as np
import pytest

import tclang as tc
from tclang.cli import main
from tclang.stages import STAGES

SAXPY = "def saxpy_{tag}(float(N) X, float(N) Y) -> (Z) {{ Z(i) = 3 * X(i) + Y(i) }}\n"


def explain(tmp_path, capsys, *extra) -> tuple[int, str, str]:
    path = tmp_path / "k.tc"
    path.write_text(SAXPY.format(tag="explained"))
    code = main(["explain", str(path), "--sizes", "N=1024", "--no-limits", *extra])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_explain_shows_the_summary_then_the_stages_asked_for(tmp_path, capsys):
    code, out, err = explain(tmp_path, capsys)
    assert code == 0, err
    assert "== summary" in out and "== loops:" not in out  # one screen by default
    code, out, err = explain(tmp_path, capsys, "--stage", "transform,loops,llvm-opt")
    assert code == 0, err
    assert "== summary" in out and "== transform:" in out and "== loops:" in out
    llvm_opt = out.split("== llvm-opt:")[1]
    assert "x float>" in llvm_opt  # a vectorized loop shows its vector type


@pytest.mark.parametrize("stage", [s for s in STAGES if s not in ("cuda", "python")])
def test_every_cpu_stage_has_text(tmp_path, capsys, stage):
    code, out, err = explain(tmp_path, capsys, "--stage", stage)
    assert code == 0, err
    body = out.split(f"== {stage}:")[1]
    assert body.strip(), f"stage {stage} printed nothing"


def test_an_unknown_or_missing_stage_is_a_clear_error(tmp_path, capsys):
    code, _, err = explain(tmp_path, capsys, "--stage", "loops,ast")
    assert code == 1 and "unknown stage 'ast'" in err and "llvm-opt" in err
    code, _, err = explain(tmp_path, capsys, "--stage", "cuda")
    assert code == 1 and "the cpu backend has no 'cuda' stage" in err


def test_tclang_dump_writes_each_named_stage(tmp_path, monkeypatch):
    monkeypatch.setenv("TCLANG_DUMP", "scop,loops,llvm-opt")
    monkeypatch.setenv("TCLANG_DUMP_DIR", str(tmp_path / "dump"))
    monkeypatch.setenv("TCLANG_DISK_CACHE", "0")
    kernel = tc.define(SAXPY.format(tag="dumped"))["saxpy_dumped"]
    x = np.ones(37, np.float32)
    np.testing.assert_allclose(kernel(x, x), 4 * x)
    written = sorted(p.name for p in (tmp_path / "dump").iterdir())
    assert written == ["saxpy_dumped.llvm-opt.txt", "saxpy_dumped.loops.txt",
                       "saxpy_dumped.scop.txt"]
    assert "domain:" in (tmp_path / "dump" / "saxpy_dumped.scop.txt").read_text()


def test_tclang_dump_goes_to_stderr_without_a_folder(monkeypatch, capsys):
    monkeypatch.setenv("TCLANG_DUMP", "loops")
    monkeypatch.delenv("TCLANG_DUMP_DIR", raising=False)
    monkeypatch.setenv("TCLANG_DISK_CACHE", "0")
    kernel = tc.define(SAXPY.format(tag="to_stderr"))["saxpy_to_stderr"]
    kernel(np.ones(5, np.float32), np.ones(5, np.float32))
    err = capsys.readouterr().err
    assert "== saxpy_to_stderr: loops" in err and "for (" in err
