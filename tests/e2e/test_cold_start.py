"""A process that finds its kernel in the disk cache does no compiler work: no isl, no
scheduling, no LLVM IR built or optimized, no helper process started; its loop IR and a
shape-generic kernel's bounds checks come from the entry. The times are
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
compiled = mm.mm.compile(a, b)
generic = tc.define(
    "def shifted(float(N) A, float(M) B) -> (C) { C(i) = A(i + 2) + B(2 * i) where i in 0:N-2 }",
    options=tc.Options(specialize=False)).shifted
x = np.arange(9, dtype=np.float32)
assert np.array_equal(generic(x, np.ones(20, np.float32)), x[2:] + 1)
try:
    generic(x, np.ones(5, np.float32))  # B too short: the call is refused
    refused = False
except tc.TCArgumentError:
    refused = True
from polyhedral.loop_format import format_kernel
loops_readable = format_kernel(compiled.loop_ir) == compiled.loops and \
    generic.compile(x, x).loop_ir.name == "shifted"
heavy = [m for m in ("islpy", "polyhedral.pipeline", "polyhedral.scop", "polyhedral.lowering",
                     "backends.llvm.kernel_module", "llvmlite.binding") if m in sys.modules]
print(json.dumps(dict(cache=[compiled.cache, generic.compile(x, x).cache], heavy=heavy,
                      helpers=helper_pids(), refused=refused, loops=loops_readable)))
"""


def run_probe(cache_dir: Path) -> dict:
    result = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True,
                            text=True, timeout=300,
                            env={**__import__("os").environ, "TCLANG_CACHE_DIR": str(cache_dir)})
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_a_disk_hit_loads_no_compiler(tmp_path):
    """Specialized and shape-generic kernels: the second process runs them, checks a
    shape-generic call's bounds and reads both loop IRs, all without isl."""
    first = run_probe(tmp_path)
    assert first["cache"] == ["compiled", "compiled"] and "islpy" in first["heavy"]
    # compiling, LLVM loads only in the optimizer process (jit.py), beside the scheduling
    assert "llvmlite.binding" not in first["heavy"] and len(first["helpers"]) >= 1
    assert first["refused"] and first["loops"]
    second = run_probe(tmp_path)
    assert second == dict(cache=["disk", "disk"], heavy=[], helpers=[], refused=True,
                          loops=True)
