"""The runtime as users meet it: argument checks before anything runs, outputs, layouts,
the two-level compile cache (memory and disk, across processes, corrupted entries), and
thread safety."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import warnings
from pathlib import Path

import numpy as np
import pytest

import tclang as tc
from tclang.driver import compiler

MATMUL = "def mm(float(M,K) A, float(K,N) B) -> (C) {\n  C(m, n) +=! A(m, k) * B(k, n)\n}"
rng = np.random.default_rng(0)


def f32(*shape):
    return rng.standard_normal(shape).astype(np.float32)


# ---- argument checks ---------------------------------------------------------------------

@pytest.mark.parametrize("args,words", [
    ((f32(2, 3),), "takes 2 arguments (A, B), but 1 was given"),
    ((f32(2, 3), f32(4, 5)), "size K of mm is 3 by dimension 1 of A but 4"),
    ((f32(2, 3), f32(3)), "must have 2 dimensions"),
    ((f32(2, 3).astype(np.float64), f32(3, 4)), "must be float32, but it is float64"),
    ((f32(2, 3), [[1.0]] * 3), "must be float32, but it is float64"),
    (("hello", f32(3, 4)), "is a str, not an array of numbers"),
])
def test_bad_arguments_are_refused_before_running(args, words):
    with pytest.raises(tc.TCArgumentError) as info:
        tc.define(MATMUL).mm(*args)
    assert words in str(info.value)
    assert isinstance(info.value, ValueError)


def test_literal_dimensions_and_obligations_are_checked():
    mod = tc.define("def f(float(3, N) A, float(N) B) -> (O) { O(j) +=! A(i, j) * B(j) }")
    with pytest.raises(tc.TCArgumentError, match="must have extent 3 in dimension 0"):
        mod.f(f32(4, 5), f32(5))
    conv = tc.define("def c(float(H) I, float(KH) W) -> (O) {\n  O(h) +=! I(h + k) * W(k)\n}")
    with pytest.raises(tc.TCArgumentError, match="negative extent") as info:
        conv.c(f32(2), f32(5))
    assert info.value.line is not None


def test_python_numbers_for_scalar_inputs():
    mod = tc.define("def f(float(N) X, float a, int32 k) -> (Y) { Y(i) = a * X(i) + k }")
    x = f32(5)
    np.testing.assert_allclose(mod.f(x, 2.0, 3), 2 * x + 3, rtol=1e-6)
    with pytest.raises(tc.TCArgumentError, match="a float"):
        mod.f(x, 2.0, 3.5)
    with pytest.raises(tc.TCArgumentError, match="does not fit"):
        mod.f(x, 2.0, 2**40)


def test_unknown_entry_lists_the_definitions():
    mod = tc.define(MATMUL + "\ndef other(float(N) A) -> (B) { B(i) = A(i) }")
    with pytest.raises(tc.TCError, match="defines mm, other"):
        mod["nope"]
    with pytest.raises(AttributeError, match="did you mean 'mm'"):
        mod.mmm
    assert mod.names == ("mm", "other")


def test_compiled_kernel_refuses_other_shapes():
    compiled = tc.compile(MATMUL, "mm", f32(2, 3), f32(3, 4))
    np.testing.assert_allclose(compiled(f32(2, 3), f32(3, 4)).shape, (2, 4))
    with pytest.raises(tc.TCArgumentError, match="compiled for the sizes"):
        compiled(f32(3, 3), f32(3, 4))


# ---- outputs, layouts, inputs --------------------------------------------------------------

def test_inputs_are_never_modified_and_outputs_are_fresh():
    a, b = f32(4, 5), f32(5, 3)
    a0, b0 = a.copy(), b.copy()
    mod = tc.define(MATMUL)
    c1, c2 = mod.mm(a, b), mod.mm(a, b)
    np.testing.assert_array_equal(a, a0)
    np.testing.assert_array_equal(b, b0)
    assert c1 is not c2 and not np.shares_memory(c1, c2)


@pytest.mark.parametrize("layout", ["fortran", "sliced", "reversed", "transposed", "broadcast"])
def test_non_contiguous_inputs(layout):
    base_a, base_b = f32(9, 12), f32(12, 10)
    a, b = {
        "fortran": (np.asfortranarray(base_a), np.asfortranarray(base_b)),
        "sliced": (base_a[::2, ::3], base_b[::3, ::2]),
        "reversed": (base_a[::-1, ::-1], base_b[::-1]),
        "transposed": (np.ascontiguousarray(base_a.T).T, np.ascontiguousarray(base_b.T).T),
        "broadcast": (np.broadcast_to(f32(1, 12), (9, 12)), base_b),
    }[layout]
    np.testing.assert_allclose(tc.define(MATMUL).mm(a, b), a @ b, rtol=1e-4, atol=1e-5)


def test_out_arrays():
    a, b = f32(4, 5), f32(5, 3)
    mod = tc.define(MATMUL)
    out = np.empty((4, 3), np.float32)
    assert mod.mm(a, b, out=out) is out
    np.testing.assert_allclose(out, a @ b, rtol=1e-5)
    strided = np.zeros((8, 6), np.float32)[::2, ::2]  # not contiguous: written through a copy
    mod.mm(a, b, out=strided)
    np.testing.assert_allclose(strided, a @ b, rtol=1e-5)
    for bad, words in [(np.empty((3, 3), np.float32), "must have shape (4, 3)"),
                       (np.empty((4, 3), np.float64), "must be float32"),
                       (np.empty((4, 3), np.float32)[:, :0], "must have shape")]:
        with pytest.raises(tc.TCArgumentError, match=re_escape(words)):
            mod.mm(a, b, out=bad)
    readonly = np.empty((4, 3), np.float32)
    readonly.flags.writeable = False
    with pytest.raises(tc.TCArgumentError, match="read-only"):
        mod.mm(a, b, out=readonly)
    square = tc.define("def sq(float(N) A) -> (B) { B(i) = A(i) * A(i) }")
    x = f32(5)
    with pytest.raises(tc.TCArgumentError, match="shares memory"):
        square.sq(x, out=x)


def re_escape(text: str) -> str:
    import re
    return re.escape(text)


def test_accumulating_into_out_keeps_the_callers_values():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tc.TCWarning)
        mod = tc.define("def acc(float(N, M) A) -> (S) { S(i) += A(i, j) }")
    a = f32(3, 4)
    start = np.full(3, 10, np.float32)
    np.testing.assert_allclose(mod.acc(a, out=start.copy()), 10 + a.sum(1), rtol=1e-5)
    np.testing.assert_allclose(mod.acc(a), a.sum(1), rtol=1e-5)  # zeros when allocated


def test_zero_sized_dimensions():
    mod = tc.define(MATMUL)
    np.testing.assert_array_equal(mod.mm(f32(3, 0), f32(0, 2)), np.zeros((3, 2), np.float32))
    assert mod.mm(f32(0, 4), f32(4, 2)).shape == (0, 2)


def test_several_outputs_come_back_as_a_tuple():
    mod = tc.define("def two(float(N) A) -> (B, C) { B(i) = A(i) + 1  C(i) = B(i) * 2 }")
    b, c = mod.two(np.ones(3, np.float32))
    np.testing.assert_array_equal(c, np.full(3, 4, np.float32))


# ---- the compile cache ---------------------------------------------------------------------

def test_memory_cache_reuses_compilations_across_modules():
    a, b = f32(6, 7), f32(7, 5)
    first = tc.define(MATMUL).mm.compile(a, b)
    again = tc.define("# the same definition, other comments\n" + MATMUL).mm.compile(a, b)
    assert again.cache == "memory" and first.source == again.source


def _entries(directory: Path) -> list[Path]:
    return sorted(directory.glob("*.tck"))


def test_corrupted_cache_entries_are_rebuilt(tmp_path, monkeypatch):
    monkeypatch.setenv("TCLANG_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("TCLANG_CALL_RECORDS", "0")  # the kernel's entry alone
    a, b = f32(5, 6), f32(6, 4)
    tc.define(MATMUL).mm(a, b)
    (entry,) = _entries(tmp_path)
    good = entry.read_bytes()
    damage = {"truncated": good[: len(good) // 2], "zeroed": bytes(len(good)),
              "flipped": good[:-10] + bytes(b ^ 0xFF for b in good[-10:]), "empty": b""}
    for name, data in damage.items():
        entry.write_bytes(data)
        compiler.forget_compiled()
        with pytest.warns(tc.TCWarning, match="discarding"):
            result = tc.define(MATMUL).mm(a, b)
        np.testing.assert_allclose(result, a @ b, rtol=1e-5, err_msg=name)
        assert entry.read_bytes() != data  # rebuilt and written again


def test_a_foreign_entry_is_never_loaded(tmp_path, monkeypatch):
    """An entry moved over another kernel's file does not authenticate (its HMAC covers
    the file name), so it is never parsed, let alone run."""
    monkeypatch.setenv("TCLANG_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("TCLANG_CALL_RECORDS", "0")  # the kernels' entries alone
    add = tc.define("def f(float(N) A) -> (B) { B(i) = A(i) + 1 }")
    sub = tc.define("def f(float(N) A) -> (B) { B(i) = A(i) - 1 }")
    x = np.zeros(4, np.float32)
    add.f(x)
    (plus,) = _entries(tmp_path)
    sub.f(x)
    minus = next(p for p in _entries(tmp_path) if p != plus)
    minus.write_bytes(plus.read_bytes())
    compiler.forget_compiled()
    with pytest.warns(tc.TCWarning, match="not authenticated"):
        result = tc.define("def f(float(N) A) -> (B) { B(i) = A(i) - 1 }").f(x)
    np.testing.assert_array_equal(result, x - 1)


def test_cache_directory_is_private(tmp_path, monkeypatch):
    target = tmp_path / "fresh" / "cache"
    monkeypatch.setenv("TCLANG_CACHE_DIR", str(target))
    tc.define(MATMUL).mm(f32(2, 2), f32(2, 2))
    assert target.stat().st_mode & 0o777 == 0o700


def test_unwritable_cache_only_warns(tmp_path, monkeypatch):
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the directory should be")
    monkeypatch.setenv("TCLANG_CACHE_DIR", str(blocked / "cache"))
    compiler.forget_compiled()
    with pytest.warns(tc.TCWarning):
        result = tc.define(MATMUL).mm(f32(2, 3), f32(3, 2))
    assert result.shape == (2, 2)


SECOND_PROCESS = r"""
import numpy as np, tclang as tc
a = np.ones((7, 5), np.float32); b = np.ones((5, 3), np.float32)
k = tc.define({src!r}).mm.compile(a, b)
assert (k(a, b) == 5).all()
print(k.cache, sorted(k.timings))
"""


def test_a_second_process_reuses_the_compiled_kernel(tmp_path):
    env = dict(os.environ, TCLANG_CACHE_DIR=str(tmp_path))
    code = SECOND_PROCESS.format(src=MATMUL)
    root = Path(__file__).resolve().parents[2]
    runs = [subprocess.run([sys.executable, "-c", code], env=env, cwd=root, text=True,
                           capture_output=True, timeout=120) for _ in range(2)]
    for r in runs:
        assert r.returncode == 0, r.stderr
    assert runs[0].stdout.startswith("compiled") and "schedule" in runs[0].stdout
    assert runs[1].stdout.startswith("disk") and "schedule" not in runs[1].stdout


def test_two_threads_compile_once(monkeypatch, tmp_path):
    monkeypatch.setenv("TCLANG_CACHE_DIR", str(tmp_path))  # nothing on disk answers first
    calls = []
    real = compiler._compile

    def slow_compile(*args, **kwargs):
        calls.append(threading.get_ident())
        import time
        time.sleep(0.2)  # widen the window in which the second thread could compile too
        return real(*args, **kwargs)

    monkeypatch.setattr(compiler, "_compile", slow_compile)
    compiler.forget_compiled()
    mod = tc.define(MATMUL.replace("mm", "mm_threads"))
    a, b = f32(8, 9), f32(9, 7)
    results, errors = [], []

    def call():
        try:
            results.append(mod.mm_threads(a, b))
        except Exception as err:  # reported below
            errors.append(err)

    workers = [threading.Thread(target=call) for _ in range(2)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert not errors and len(calls) == 1
    for r in results:
        np.testing.assert_allclose(r, a @ b, rtol=1e-5)


def test_out_calls_take_the_hot_path_and_write_in_place():
    """A repeated out= call skips the checks (one hot entry) and writes the caller's
    array; an out= that overlaps an input, is read-only or not contiguous is checked on
    every call, hot entry or not."""
    kernel = tc.define("def axpy(float(N) X, float(N) Y) -> (Z) { Z(i) = 2 * X(i) + Y(i) }").axpy
    x, y = np.arange(7, dtype=np.float32), np.ones(7, np.float32)
    out = np.full(7, -1, np.float32)
    assert kernel(x, y, out=out) is out and len(kernel._hot) == 1
    out[:] = -1
    assert kernel(x, y, out=out) is out and len(kernel._hot) == 1
    np.testing.assert_array_equal(out, 2 * x + y)
    other = np.zeros(7, np.float32)
    assert kernel(x, y, out=(other,)) is other and len(kernel._hot) == 1
    np.testing.assert_array_equal(other, 2 * x + y)
    with pytest.raises(tc.TCArgumentError, match="shares memory"):
        kernel(x, y, out=x)
    readonly = np.zeros(7, np.float32)
    readonly.flags.writeable = False
    with pytest.raises(tc.TCArgumentError, match="read-only"):
        kernel(x, y, out=readonly)
    strided = np.zeros(14, np.float32)[::2]
    assert kernel(x, y, out=strided) is strided
    np.testing.assert_array_equal(strided, 2 * x + y)
    with pytest.raises(tc.TCArgumentError, match="must have shape"):
        kernel(x, y, out=np.zeros(6, np.float32))
    compiled = kernel.compile(x, y)
    mine = np.zeros(7, np.float32)
    assert compiled(x, y, out=mine) is mine and compiled(x, y, out=mine) is mine
    np.testing.assert_array_equal(mine, 2 * x + y)
