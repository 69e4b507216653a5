"""The TCLANG_* environment variables: each value is one the variable takes, or a
`TCConfigError` that names the variable (tclang/environment.py; issue 31, item 13).

Before, `TCLANG_DISK_CACHE=no` left the disk cache on, `TCLANG_MAX_LLVM_IR_MB=nan` turned
the limit off, `TCLANG_NUM_THREADS=four` and an unknown `TCLANG_DUMP` stage were ignored,
and `TCLANG_CACHE_MAX_BYTES=lots` only warned.
"""

from __future__ import annotations

import ast
import itertools
from pathlib import Path

import numpy as np
import pytest

import tclang as tc
from tclang.driver import compiler, diskcache
from tclang import environment
from tclang.machine import available_cores

ROOT = Path(__file__).resolve().parents[2]
_count = itertools.count()

SWITCHES = ["TCLANG_DISK_CACHE", "TCLANG_CALL_RECORDS", "TCLANG_CHECK_BOUNDS", "TCLANG_VERIFY",
            "TCLANG_EMULATION_PCH"]


def fresh_kernel(body: str = "B(i) = A(i) + 1"):
    """A kernel no earlier test compiled (its own name), so that this call compiles."""
    name = f"env_{next(_count)}"
    return tc.define(f"def {name}(float(N) A) -> (B) {{ {body} }}")[name]


@pytest.mark.parametrize("word,value", [(w, True) for w in ("1", "true", "YES", " on ")] +
                         [(w, False) for w in ("0", "False", "no", "OFF")])
@pytest.mark.parametrize("name", SWITCHES)
def test_switches_take_the_usual_words(monkeypatch, name, word, value):
    monkeypatch.setenv(name, word)
    assert environment.switch(name, not value) is value


@pytest.mark.parametrize("name", SWITCHES)
def test_an_unknown_switch_value_is_refused(monkeypatch, name):
    monkeypatch.setenv(name, "maybe")
    with pytest.raises(tc.TCConfigError, match=f"{name} must be one of 1, true, yes, on"):
        environment.switch(name, True)


def test_disk_cache_no_turns_the_cache_off(tmp_path, monkeypatch):
    """`no` was read as "on": only 0, off and false turned the cache off."""
    monkeypatch.setenv("TCLANG_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("TCLANG_DISK_CACHE", "no")
    assert not diskcache.enabled()
    fresh_kernel()(np.ones(3, np.float32))
    assert not list(tmp_path.glob("*.tck"))


def test_bounds_checks_off_means_off(monkeypatch):
    """Any value but "" and "0" turned bounds checks on, "off" and "false" too."""
    from tclang.machine import bounds_checking
    for word, on in (("off", False), ("false", False), ("no", False), ("on", True)):
        monkeypatch.setenv("TCLANG_CHECK_BOUNDS", word)
        assert bounds_checking() is on, word


def test_a_bad_switch_stops_the_call_with_its_name(tmp_path, monkeypatch):
    monkeypatch.setenv("TCLANG_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("TCLANG_DISK_CACHE", "sometimes")
    with pytest.raises(tc.TCConfigError, match="TCLANG_DISK_CACHE .*'sometimes'"):
        fresh_kernel()(np.ones(3, np.float32))


@pytest.mark.parametrize("value", ["nan", "inf", "-1", "0", "lots", " "])
def test_the_llvm_ir_limit_must_be_a_finite_positive_number(monkeypatch, value):
    """nan disabled the limit (no size compares larger than nan); " " is unset."""
    monkeypatch.setenv("TCLANG_MAX_LLVM_IR_MB", value)
    monkeypatch.setenv("TCLANG_DISK_CACHE", "0")
    kernel = fresh_kernel()
    if not value.strip():
        kernel(np.ones(3, np.float32))
        return
    with pytest.raises(tc.TCConfigError, match=f"TCLANG_MAX_LLVM_IR_MB must be a finite "
                                               f"number above 0, not '{value}'"):
        kernel(np.ones(3, np.float32))


@pytest.mark.parametrize("value", ["four", "0", "-2", "2.5", "9" * 5000])
def test_thread_count_must_be_a_whole_positive_number(monkeypatch, value):
    monkeypatch.setenv("TCLANG_NUM_THREADS", value)
    with pytest.raises(tc.TCConfigError, match="TCLANG_NUM_THREADS must be a whole number"):
        available_cores()
    monkeypatch.setenv("TCLANG_NUM_THREADS", "3")
    assert available_cores() == 3


@pytest.mark.parametrize("name", ["TCLANG_CACHE_MAX_BYTES", "TCLANG_MAX_VARIANTS"])
@pytest.mark.parametrize("value", ["lots", "0", "-5", "1e9"])
def test_counts_must_be_whole_positive_numbers(monkeypatch, name, value):
    monkeypatch.setenv(name, value)
    read = diskcache.max_bytes if name == "TCLANG_CACHE_MAX_BYTES" else \
        __import__("tclang.recent", fromlist=["max_variants"]).max_variants
    with pytest.raises(tc.TCConfigError, match=f"{name} must be a whole number of at least 1, "
                                               f"not '{value}'"):
        read()


def test_an_unknown_dump_stage_names_the_stages(monkeypatch):
    """A typo in TCLANG_DUMP dumped nothing, silently."""
    monkeypatch.setenv("TCLANG_DUMP", "scop,lopps")
    monkeypatch.setenv("TCLANG_DISK_CACHE", "0")
    with pytest.raises(tc.TCConfigError, match="TCLANG_DUMP names no stage 'lopps'; the "
                                               "stages are passes, scop.*llvm-opt.*or all"):
        fresh_kernel()(np.ones(3, np.float32))


def test_an_unknown_loader_is_refused(monkeypatch):
    monkeypatch.setenv("TCLANG_LOADER", "mcjt")
    monkeypatch.setenv("TCLANG_DISK_CACHE", "0")
    compiler.forget_compiled()
    with pytest.raises(tc.TCConfigError, match="TCLANG_LOADER must be one of elf, mcjit"):
        fresh_kernel()(np.ones(3, np.float32))


PATHS = {"TCLANG_CACHE_DIR", "TCLANG_CACHE_KEY_FILE", "TCLANG_TUNING_DB", "TCLANG_DUMP_DIR",
         "TCLANG_EMULATION_CXX"}
"""Variables holding a path or a program name: any text is one."""


def test_every_variable_is_read_through_the_environment_module():
    """Every TCLANG_* variable the Python code reads with os.environ.get is a path, or
    TCLANG_DUMP (its stages: tclang/stages.py); the others go through
    tclang/environment.py, so none can again take a value it does not understand."""
    direct = set()
    for folder in ("tclang", "polyhedral", "backends"):
        for path in (ROOT / folder).rglob("*.py"):
            if path.name == "environment.py":
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "get" \
                        and "environ" in ast.unparse(node.func) and node.args \
                        and isinstance(node.args[0], ast.Constant):
                    direct.add(node.args[0].value)
    assert {v for v in direct if v.startswith("TCLANG_")} - PATHS == {"TCLANG_DUMP"}
