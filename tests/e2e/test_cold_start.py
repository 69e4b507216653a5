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
    assert first["cache"] == ["compiled", "compiled"]
    # compiling, isl loads only in the middle end's process (tclang/driver/middle_end.py)
    # and LLVM only in the optimizer's (jit.py): both started at tc.define, beside the parse
    assert first["heavy"] == ["backends.llvm.kernel_module"] and len(first["helpers"]) >= 2
    assert first["refused"] and first["loops"]
    second = run_probe(tmp_path)
    assert second == dict(cache=["disk", "disk"], heavy=[], helpers=[], refused=True,
                          loops=True)


def probe(code: str, cache_dir: Path, **env) -> dict:
    """Run `code` in a fresh Python with a private cache; its last line printed, as JSON."""
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                            text=True, timeout=300,
                            env={**__import__("os").environ, "TCLANG_CACHE_DIR": str(cache_dir),
                                 **env})
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


DEFINE_ONLY = """
import json
import tclang as tc
from tclang.driver import middle_end
from tclang.forked_server import helper_pids
tc.define("def add(float(N) A) -> (B) { B(i) = A(i) + 1 }")
print(json.dumps(dict(middle_end=middle_end._helper.pid, helpers=helper_pids())))
"""


def test_a_process_that_only_defines_leaves_no_helper_behind(tmp_path):
    """tc.define starts the middle end and the optimizer (they load isl and LLVM beside the
    parse); a process that ends without compiling takes them with it."""
    import time
    seen = probe(DEFINE_ONLY, tmp_path)
    assert seen["middle_end"] is not None and len(seen["helpers"]) >= 2
    deadline = time.monotonic() + 30
    alive = seen["helpers"]
    while alive and time.monotonic() < deadline:
        time.sleep(0.1)
        alive = [pid for pid in alive if _running(pid)]
    assert not alive, f"helpers still running after their parent ended: {alive}"


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_no_helper_is_started_where_a_polyhedral_stage_is_dumped(tmp_path):
    """TCLANG_DUMP=schedule schedules in this process (its dumps go to this stderr)."""
    seen = probe(DEFINE_ONLY, tmp_path, TCLANG_DUMP="schedule")
    assert seen["middle_end"] is None


NO_FORK = """
import json, os
import numpy as np
def refused():
    raise OSError(11, "Resource temporarily unavailable")
os.fork = refused
import tclang as tc
from tclang.forked_server import helper_pids
mm = tc.define("def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }")
a = np.arange(35, dtype=np.float32).reshape(7, 5)
b = np.arange(15, dtype=np.float32).reshape(5, 3)
print(json.dumps(dict(right=bool(np.allclose(mm.mm(a, b), a @ b)), helpers=helper_pids())))
"""


def test_define_and_compile_where_no_process_can_be_forked(tmp_path):
    """Where no helper can start (a process limit), tc.define and the first call work in
    this process: scheduling and LLVM's optimizer run here."""
    assert probe(NO_FORK, tmp_path) == dict(right=True, helpers=[])


THREADED = """
import json, sys, threading
import numpy as np
done = threading.Event()
threading.Thread(target=done.wait, daemon=True).start()  # another Python thread runs
import tclang as tc
from tclang.driver import middle_end
mm = tc.define("def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }")
early = middle_end._helper.pid
a = np.arange(35, dtype=np.float32).reshape(7, 5)
b = np.arange(15, dtype=np.float32).reshape(5, 3)
right = bool(np.allclose(mm.mm(a, b), a @ b))
print(json.dumps(dict(early=early, right=right, isl="islpy" in sys.modules,
                      helper=middle_end._helper.pid is not None)))
"""


def test_with_other_threads_the_helper_forks_after_this_process_imported_isl(tmp_path):
    """A child forked while another thread imports a module waits on that module's lock
    for ever: where other threads run, tc.define forks nothing, and the compile forks the
    helper once this process imported the polyhedral layer (the helper imports nothing)."""
    assert probe(THREADED, tmp_path) == dict(early=None, right=True, isl=True, helper=True)
