"""Every example in examples/ runs and matches NumPy (each checks itself)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SCRIPTS = sorted(p.stem for p in EXAMPLES.glob("*.py") if not p.stem.startswith("_"))


def test_there_are_enough_examples():
    assert len(SCRIPTS) >= 6


@pytest.mark.parametrize("name", SCRIPTS)
def test_example_runs(name, monkeypatch, capsys):
    if "import torch" in (EXAMPLES / f"{name}.py").read_text():
        pytest.importorskip("torch")
    monkeypatch.syspath_prepend(str(EXAMPLES))
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.main()
    out = capsys.readouterr().out
    assert "matches NumPy" in out or "matches PyTorch" in out
    sys.modules.pop("_check", None)
