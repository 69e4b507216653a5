"""The disk cache under attack: several processes at once, damaged entries, a full disk.

Four processes compile and run the same kernels at once into one TCLANG_CACHE_DIR; then
entries are truncated, zeroed, replaced with another kernel's entry and made unreadable,
and four processes run again; then the disk "fills" (os.replace raises ENOSPC in the
children). Every run must give the right results; a bad entry is discarded with a
TCWarning and rebuilt, an entry written for another key is never loaded, a full disk only
costs a warning and leaves no temporary files. Bounded: about five rounds of four short
processes.
"""

from __future__ import annotations

import json
import os
import stat
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from tclang.driver.diskcache import MAGIC, TAG_BYTES

ROOT = Path(__file__).resolve().parents[2]
CHILD = r'''
import errno, json, os, sys, warnings
import numpy as np
if sys.argv[1] == "disk-full":
    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")
    os.replace = full
import tclang
SOURCE = """
def mm(float(M, K) A, float(K, N) B) -> (C) {
    C(m, n) +=! A(m, k) * B(k, n)
}
def softmax(float(N, D) X) -> (Y) {
    mx(n) max=! X(n, d)
    s(n) +=! exp(X(n, d) - mx(n))
    Y(n, d) = exp(X(n, d) - mx(n)) / s(n)
}
def scaled(double(N) X, int32(N) Q) -> (Y) {
    Y(i) = X(i) * Q(i) + 1.0
}
"""
rng = np.random.default_rng(0)
A, B = rng.standard_normal((5, 7)).astype(np.float32), rng.standard_normal((7, 3)).astype(np.float32)
X = rng.standard_normal((4, 6)).astype(np.float32)
D, Q = rng.standard_normal(9), rng.integers(-5, 6, 9).astype(np.int32)
e = np.exp(X - X.max(axis=1, keepdims=True))
cases = [("mm", (A, B), A @ B), ("softmax", (X,), e / e.sum(axis=1, keepdims=True)),
         ("scaled", (D, Q), D * Q + 1.0)]
results = {}
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    module = tclang.define(SOURCE)
    for name, args, expected in cases:
        compiled = module[name].compile(*args)
        ok = np.allclose(compiled(*args), expected, rtol=1e-5, atol=1e-6)
        results[name] = {"ok": bool(ok), "cache": compiled.cache}
print(json.dumps({"results": results, "warnings": [str(w.message) for w in caught
                                                   if issubclass(w.category, tclang.TCWarning)]}))
'''
KERNELS = ("mm", "softmax", "scaled")


def run_children(cache: Path, mode: str = "normal", count: int = 4) -> list[dict]:
    env = dict(os.environ, TCLANG_CACHE_DIR=str(cache), PYTHONPATH=str(ROOT))
    env.pop("TCLANG_VERIFY", None)  # not what this test is about, and it costs time
    env["TCLANG_CALL_RECORDS"] = "0"  # the kernels' entries alone (test_call_records.py)
    procs = [subprocess.Popen([sys.executable, "-c", CHILD, mode], env=env, cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(count)]
    reports = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, f"a child failed ({p.returncode}):\n{err[-3000:]}"
        reports.append(json.loads(out.strip().splitlines()[-1]))
    for r in reports:
        assert all(v["ok"] for v in r["results"].values()), r
    return reports


def entries(cache: Path) -> dict[str, Path]:
    """Each kernel's entry, found by the key stored in its header."""
    found = {}
    for path in cache.glob("*.tck"):
        data = path.read_bytes()
        start = len(MAGIC) + TAG_BYTES
        (length,) = struct.unpack_from("<Q", data, start)
        key = json.loads(data[start + 8:start + 8 + length])["key"]
        name = next(k for k in KERNELS if f"'{k}'" in key)
        found[name] = path
    return found


def make_unreadable(path: Path) -> str:
    """chmod 000; where that does not stop this process (root), a directory in its place."""
    path.chmod(0)
    try:
        path.read_bytes()
    except PermissionError:
        return "chmod"
    path.unlink()
    path.mkdir()
    return "directory"


def test_concurrent_processes_and_damaged_entries(tmp_path):
    cache = tmp_path / "cache"
    first = run_children(cache)
    assert sorted(entries(cache)) == sorted(KERNELS)
    assert not any(r["warnings"] for r in first), [r["warnings"] for r in first]

    found = entries(cache)
    foreign = found["scaled"].read_bytes()
    data = found["mm"].read_bytes()
    found["mm"].write_bytes(data[:len(data) // 2])                 # truncated
    found["softmax"].write_bytes(b"\0" * len(found["softmax"].read_bytes()))  # zeroed
    bad = {"mm": "not authenticated", "softmax": "not a tclang cache entry"}
    second = run_children(cache)
    for name, problem in bad.items():
        assert any(problem in w and found[name].name in w for r in second
                   for w in r["warnings"]), (name, [r["warnings"] for r in second])
    assert any(r["results"]["scaled"]["cache"] == "disk" for r in second)
    # two processes may both discard a bad entry, the second after the first rebuilt it:
    # harmless, but a lone process puts everything back before the next round
    run_children(cache, count=1)

    found = entries(cache)
    found["mm"].write_bytes(foreign)                               # another kernel's entry
    how = make_unreadable(found["softmax"])                        # unreadable
    third = run_children(cache)
    warnings = [w for r in third for w in r["warnings"]]
    assert any("not authenticated" in w and found["mm"].name in w for w in warnings), warnings
    assert any("unreadable" in w and found["softmax"].name in w for w in warnings), warnings
    if how == "directory":  # nothing could replace it: the writers warned instead
        assert any("could not write" in w for w in warnings), warnings
        found["softmax"].rmdir()
    run_children(cache, count=1)

    assert sorted(entries(cache)) == sorted(KERNELS)
    last = run_children(cache, count=1)[0]                         # all healthy again
    assert last["warnings"] == [] and \
        {v["cache"] for v in last["results"].values()} == {"disk"}, last


def test_a_full_disk_only_costs_a_warning(tmp_path):
    cache = tmp_path / "cache"
    reports = run_children(cache, mode="disk-full", count=3)
    for r in reports:
        assert len(r["warnings"]) == len(KERNELS), r["warnings"]
        assert all("could not write the compile cache entry" in w and "No space left" in w
                   for w in r["warnings"]), r["warnings"]
        assert {v["cache"] for v in r["results"].values()} == {"compiled"}
    assert list(cache.iterdir()) == [], "entries or temporary files were left behind"


@pytest.mark.skipif(os.name != "posix", reason="POSIX permissions")
def test_an_unwritable_cache_directory_only_costs_a_warning(tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    cache.chmod(stat.S_IRUSR | stat.S_IXUSR)
    try:
        probe = cache / "probe"
        try:
            probe.write_text("x")
            probe.unlink()
            pytest.skip("this user can write a read-only directory (root)")
        except PermissionError:
            pass
        report = run_children(cache, count=1)[0]
        assert report["warnings"] and all("could not write" in w for w in report["warnings"])
    finally:
        cache.chmod(stat.S_IRWXU)


EMULATED = r'''
import numpy as np, tclang
k = tclang.define("def f(float(N) A) -> (B) { B(i) = A(i) * 2.0 }", backend="cuda-emulated")
assert np.allclose(k.f(np.arange(5, dtype=np.float32)), 2 * np.arange(5))
'''


def test_the_emulated_gpu_keeps_to_the_cache_directory(tmp_path):
    from tclang.fuzzing.differential import cuda_emulation_available
    if not cuda_emulation_available():
        pytest.skip("no g++ for the emulated GPU")
    home = tmp_path / "xdg-cache"
    home.mkdir()
    env = dict(os.environ, TCLANG_CACHE_DIR=str(tmp_path / "cache"), PYTHONPATH=str(ROOT),
               XDG_CACHE_HOME=str(home), HOME=str(tmp_path))
    done = subprocess.run([sys.executable, "-c", EMULATED], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert list(home.rglob("*")) == [], "written outside TCLANG_CACHE_DIR"
