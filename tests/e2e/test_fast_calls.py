"""The fastest call path (runtime.HotCalls.fastest / fastest_out over the native entry of
backends/llvm/call_trampoline.py): one native call checks that the arrays look exactly
like the most recent call's (type, dtype, shape, strides) and runs; anything else takes
the checked path with the same results and errors as before."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import tclang as tc
from backends.llvm import fast_calls
from tclang.runtime import kernels as runtime

pytestmark = pytest.mark.skipif(not fast_calls.AVAILABLE,
                                reason="no native entry on this interpreter")

ADD = "def add(float(N) A, float(N) B) -> (C) { C(i) = A(i) + B(i) }"


def _fails(*args, **kwargs):
    raise AssertionError("the fastest path went through the hot key or the checks")


def kernel(source=ADD, **kwargs):
    module = tc.define(source, **kwargs)
    return module[module.names[0]]


@pytest.mark.parametrize("compiled", [False, True], ids=["Kernel", "CompiledKernel"])
def test_repeat_calls_take_the_fastest_path(compiled, monkeypatch):
    a, b = np.arange(7, dtype=np.float32), np.ones(7, np.float32)
    add = kernel()
    call = add.compile(a, b) if compiled else add
    np.testing.assert_array_equal(call(a, b), a + b)
    assert call._hot.fastest is not None
    with monkeypatch.context() as patched:  # a repeat takes neither the key nor the checks
        patched.setattr(runtime, "hot_key", _fails)
        patched.setattr(runtime, "bind_arguments", _fails)
        x, y = np.arange(7, dtype=np.float32), np.full(7, 3.0, np.float32)
        np.testing.assert_array_equal(call(x, y), x + y)
    for n in (7, 5, 7):  # a new shape, then the first one again
        x, y = np.arange(n, dtype=np.float32), np.full(n, 2.0, np.float32)
        if compiled and n != 7:
            with pytest.raises(tc.TCArgumentError, match="compiled for"):
                call(x, y)
            continue
        np.testing.assert_array_equal(call(x, y), x + y)


def test_arrays_unlike_the_last_call_take_the_checked_path():
    add = kernel()
    a = np.arange(8, dtype=np.float32)
    add(a, a)
    np.testing.assert_array_equal(add(a[::2], a[::2]), a[::2] * 2)  # other strides
    np.testing.assert_array_equal(add(a[:3], a[:3]), a[:3] * 2)  # other shape
    with pytest.raises(tc.TCArgumentError):
        add(a.astype(np.float64), a)  # other dtype: refused by the checks
    with pytest.raises(tc.TCArgumentError):
        add(a, a, a)  # one array too many
    with pytest.raises(tc.TCArgumentError):
        add(a)
    np.testing.assert_array_equal(add(list(a), a), a * 2)  # a list
    masked = np.ma.masked_array(a)  # a subclass with the same dtype, shape and strides
    with pytest.raises(tc.TCArgumentError, match="masked array"):
        add(masked, a)
    np.testing.assert_array_equal(add(a, a), a * 2)


def test_float_scalars_and_mixed_arguments():
    scale = kernel("def s(float(N) X, float a) -> (Y) { Y(i) = X(i) * a }")
    x = np.arange(5, dtype=np.float32)
    for a in (2.0, 3.0, np.float32(4.0), np.array(5.0, np.float32)):
        np.testing.assert_array_equal(scale(x, a), x * np.float32(a))


def test_out_is_written_in_place_and_checked_every_call():
    add = kernel()
    a, b = np.arange(6, dtype=np.float32), np.ones(6, np.float32)
    out = np.empty(6, np.float32)
    assert add(a, b, out=out) is out and add(a, b, out=out) is out
    assert add._hot.fastest_out is not None
    np.testing.assert_array_equal(out, a + b)
    other = np.zeros(6, np.float32)
    assert add(b, b, out=other) is other and np.array_equal(other, b + b)
    with pytest.raises(tc.TCArgumentError):
        add(a, b, out=a)  # out= is an input: the checked path refuses it
    frozen = np.empty(6, np.float32)
    frozen.flags.writeable = False
    with pytest.raises(tc.TCArgumentError):
        add(a, b, out=frozen)
    np.testing.assert_array_equal(a, np.arange(6, dtype=np.float32))
    with pytest.raises(tc.TCArgumentError):
        add(a, b, out=np.empty(5, np.float32))


def test_an_out_of_range_gather_says_where_from_the_fastest_path():
    gather = kernel("def g(float(E, D) T, int32(B) I) -> (O) { O(b, d) = T(I(b), d) }")
    table = np.arange(12, dtype=np.float32).reshape(4, 3)
    ids = np.array([0, 3], np.int32)
    np.testing.assert_array_equal(gather(table, ids), table[ids])
    assert gather._hot.fastest is not None
    with pytest.raises(tc.TCIndexError, match="index 9 is out of bounds for dimension 0 of T"):
        gather(table, np.array([0, 9], np.int32))
    np.testing.assert_array_equal(gather(table, ids), table[ids])


def test_several_outputs_and_temporaries():
    moments = kernel("""
def moments(float(N, D) X) -> (mean, var) {
    mean(n) +=! X(n, d) / float(D)
    c(n, d) = X(n, d) - mean(n)
    var(n) +=! c(n, d) * c(n, d) / float(D)
}""")
    x = np.random.default_rng(0).random((5, 7), np.float32)
    for _ in range(3):
        mean, var = moments(x)
        np.testing.assert_allclose(mean, x.mean(1), rtol=1e-5)
        np.testing.assert_allclose(var, x.var(1), rtol=1e-4)


def test_threads_with_different_shapes_get_their_own_results():
    add = kernel()
    errors = []

    def work(n):
        x = np.arange(n, dtype=np.float32)
        for _ in range(200):
            if not np.array_equal(add(x, x), x * 2):
                errors.append(n)

    threads = [threading.Thread(target=work, args=(n,)) for n in (3, 4, 5, 6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_a_kernel_of_many_arrays_takes_the_fastest_path_too():
    many = 30
    inputs = ", ".join(f"float(N) A{k}" for k in range(many))
    total = " + ".join(f"A{k}(i)" for k in range(many))
    big = kernel(f"def big({inputs}) -> (S) {{ S(i) = {total} }}")
    xs = [np.full(4, k, np.float32) for k in range(many)]
    for _ in range(2):
        np.testing.assert_array_equal(big(*xs), np.full(4, sum(range(many)), np.float32))
    assert big._hot.fastest is not None


def test_the_native_entry_refuses_a_wrong_count_of_arrays():
    a = np.arange(4, dtype=np.float32)
    compiled = kernel().compile(a, a)
    call = compiled.compiled.artifact.bind((a, a))
    out = np.empty(4, np.float32)
    assert call(a, a, out) == 0 and np.array_equal(out, a + a)
    assert call(a, a) != 0 and call(a, a, out, out) != 0  # nothing ran
    assert call(a[:2], a[:2], out) != 0 and call(a.astype(np.float64), a, out) != 0
