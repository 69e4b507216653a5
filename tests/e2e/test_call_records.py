"""Call records (tclang/driver/call_records.py): a fresh process whose first call looks exactly like
one checked in full before runs it with no compiler work at all (no parse, no Lark, no
LLVM, no isl), and gets the same results and the same errors as the full path; anything
that would change the code or the checks finds no record."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

import tclang as tc
from tclang.driver import call_records, compiler, diskcache

ROOT = Path(__file__).resolve().parents[2]
MM = "def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }"

PROBE = """
import json, sys
import numpy as np
import tclang as tc
mm = tc.define(%r)
a = np.arange(6, dtype=np.float32).reshape(2, 3)
b = np.arange(15, dtype=np.float32).reshape(3, 5)
c = mm.mm(a, b)
out = np.empty((2, 5), np.float32)
assert mm.mm(a, b, out=out) is out and np.array_equal(out, a @ b)
big = np.ones((67, 61), np.float32), np.ones((61, 71), np.float32)  # parallel loops
ok = np.allclose(c, a @ b) and np.allclose(mm.mm(*big), 61.0)
heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("lark", "islpy", "llvmlite",
               "polyhedral") or m in ("tclang.lang.program", "tclang.driver.compiler", "tclang.lang.parser",
                                      "tclang.runtime.arguments"))
print(json.dumps(dict(ok=ok, heavy=heavy)))
"""


def run(code: str, cache: Path, **env) -> dict:
    environment = {**os.environ, "TCLANG_CACHE_DIR": str(cache), **env}
    environment.pop("TCLANG_CALL_RECORDS", None)
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                            text=True, timeout=300, env=environment)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_a_recorded_first_call_loads_no_compiler(tmp_path):
    first = run(PROBE % MM, tmp_path)
    assert first["ok"] and "lark" in first["heavy"] and "polyhedral.loop_ir" in first["heavy"]
    assert "islpy" not in first["heavy"]  # the middle end's process schedules
    second = run(PROBE % MM, tmp_path)
    assert second == dict(ok=True, heavy=[])


def test_the_same_source_with_other_options_or_threads_takes_the_full_path(tmp_path):
    run(PROBE % MM, tmp_path)
    assert run(PROBE % MM, tmp_path, TCLANG_NUM_THREADS="1")["heavy"]  # another target
    assert run(PROBE % MM, tmp_path, TCLANG_CHECK_BOUNDS="1")["heavy"]
    assert run(PROBE % MM.replace("mm(", "mm (", 1), tmp_path)["heavy"]  # another text


@pytest.fixture
def records(tmp_path, monkeypatch) -> Path:
    """A private cache with records on, and nothing in this process's memory."""
    monkeypatch.setenv("TCLANG_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("TCLANG_CACHE_KEY_FILE", str(tmp_path / "key" / "cache.key"))
    monkeypatch.delenv("TCLANG_CALL_RECORDS", raising=False)
    compiler.forget_compiled()
    monkeypatch.setattr(diskcache, "_warned", set(), raising=False)
    return tmp_path / "cache"


def fresh(source: str, **kwargs):
    """tc.define as a new process sees it: nothing of this source in memory."""
    compiler.forget_compiled()
    return tc.define(source, **kwargs)


def test_a_module_from_a_source_record_checks_its_source_when_asked(records):
    first = fresh(MM)
    a, b = np.ones((3, 4), np.float32), np.ones((4, 5), np.float32)
    first.mm(a, b)
    again = fresh(MM)
    assert again._program is None  # not parsed
    np.testing.assert_array_equal(again.mm(a, b), a @ b)
    assert again._program is None and len(again.mm._hot) == 1
    assert again.mm.definition.name == "mm" and again.program.source == MM
    assert again.mm.compile(a, b).cache == "disk" and "for" in again.mm.compile(a, b).loops


def test_other_shapes_dtypes_and_layouts_take_the_checked_path(records):
    fresh(MM).mm(np.ones((3, 4), np.float32), np.ones((4, 5), np.float32))
    mod = fresh(MM)
    b = np.ones((4, 5), np.float32)
    with pytest.raises(tc.TCArgumentError):
        mod.mm(np.ones((3, 6), np.float32), b)  # K disagrees: the checks say so
    with pytest.raises(tc.TCArgumentError):
        mod.mm(np.ones((3, 4), np.float64), b)
    a_t = np.ones((4, 3), np.float32).T  # same shape, other strides
    np.testing.assert_array_equal(mod.mm(a_t, b), a_t @ b)


def test_a_gather_out_of_range_says_the_same_from_a_record(records):
    source = "def g(float(E, D) T, int32(B) I) -> (O) { O(b, d) = T(I(b), d) }"
    table, ids = np.arange(12, dtype=np.float32).reshape(4, 3), np.array([0, 3], np.int32)
    fresh(source).g(table, ids)
    with pytest.raises(tc.TCIndexError) as full:
        fresh(source).g(table, np.array([0, 9], np.int32))  # not recorded: full path
    mod = fresh(source)
    np.testing.assert_array_equal(mod.g(table, ids), table[ids])  # from the record
    with pytest.raises(tc.TCIndexError) as recorded:
        mod.g(table, np.array([0, 9], np.int32))  # same key: the recorded kernel runs
    assert str(recorded.value) == str(full.value)


def test_a_source_that_warned_is_checked_and_warns_every_time(records):
    source = "def f(float(N, M) A) -> (O) { O(i) += A(i, j) }"  # += onto nothing written
    with warnings.catch_warnings(record=True) as first:
        warnings.simplefilter("always")
        fresh(source).f(np.ones((3, 2), np.float32))
    assert any(issubclass(w.category, tc.TCWarning) for w in first)
    with warnings.catch_warnings(record=True) as second:
        warnings.simplefilter("always")
        mod = fresh(source)
    assert mod._program is not None
    assert [str(w.message) for w in second] == [str(w.message) for w in first
                                                if issubclass(w.category, tc.TCWarning)]


def test_a_bad_source_is_never_recorded(records):
    with pytest.raises(tc.TCSyntaxError):
        fresh("def f(float(N) A) -> (B) { B(i) = A(i) + }")
    assert call_records.signatures("def f(float(N) A) -> (B) { B(i) = A(i) + }") is None


def test_a_tampered_record_is_not_used(records):
    a, b = np.ones((3, 4), np.float32), np.ones((4, 5), np.float32)
    fresh(MM).mm(a, b)
    for entry in records.glob("*.tck"):
        data = bytearray(entry.read_bytes())
        data[-1] ^= 0xFF  # the last blob's last byte
        entry.write_bytes(bytes(data))
    with pytest.warns(tc.TCWarning, match="not authenticated"):
        mod = fresh(MM)
        np.testing.assert_array_equal(mod.mm(a, b), a @ b)


def test_tuned_and_reference_modules_keep_no_records(records):
    assert not fresh(MM, options="tuned").records
    assert not fresh(MM, backend="reference").records
    assert fresh(MM).records
