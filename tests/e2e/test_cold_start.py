"""A process that finds its kernel in the disk cache does no compiler work: no isl, no
scheduling, no LLVM IR built or optimized, no helper process started. The times are
benchmarks/compile_time.py's business; this checks what is loaded and run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PROBE = """
import json, sys
import numpy as np
import tclang as tc
from tclang.forked_server import helper_pids
mm = tc.define("def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }")
a = np.arange(6, dtype=np.float32).reshape(2, 3)
b = np.arange(15, dtype=np.float32).reshape(3, 5)
c = mm.mm(a, b)
assert np.allclose(c, a @ b)
heavy = [m for m in ("islpy", "polyhedral.pipeline", "polyhedral.scop", "polyhedral.lowering",
                     "backends.llvm.functions") if m in sys.modules]
print(json.dumps(dict(cache=mm.mm.compile(a, b).cache, heavy=heavy, helpers=helper_pids())))
"""


def run_probe(cache_dir: Path) -> dict:
    result = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True,
                            text=True, timeout=300,
                            env={**__import__("os").environ, "TCLANG_CACHE_DIR": str(cache_dir)})
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_a_disk_hit_loads_no_compiler(tmp_path):
    first = run_probe(tmp_path)
    assert first["cache"] == "compiled" and "islpy" in first["heavy"]
    second = run_probe(tmp_path)
    assert second == dict(cache="disk", heavy=[], helpers=[])
