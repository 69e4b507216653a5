"""Arguments and knobs that once slipped past the checks (issue 11, items 5 and 8): views the
checks had to copy, other byte orders, masked arrays, floats that overflow their type,
huge outputs, interleaved out= arrays, the sign of a zero remainder, and cache keys that
left out a knob."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from numpy.lib.stride_tricks import as_strided

import tclang as tc
from tclang.options import Options
from tclang.target import Target

COPY = "def copy(float(N) A) -> (B) {\n  B(i) = A(i) * 2\n}"
SCALE = "def scale(float(N) A, float s) -> (B) {\n  B(i) = A(i) * s\n}"
ADD = "def add(float(N) A, float(N) B) -> (C) {\n  C(i) = A(i) + B(i)\n}"


def _field_view() -> np.ndarray:
    """A float32 view whose stride (6 bytes) is not a whole number of elements."""
    records = np.zeros(10, dtype=[("a", "f4"), ("b", "f2")])
    records["a"] = np.arange(10)
    return records["a"]


def _half_stride_view() -> np.ndarray:
    """float32 elements 2 bytes apart (overlapping), built from a known byte buffer."""
    base = np.arange(40, dtype=np.float32).view(np.uint8)
    return as_strided(base.view(np.float32), shape=(10,), strides=(2,))


# ---- item 5: the hot path never keys on an argument the checks converted ------------------

@pytest.mark.parametrize("make", [_field_view, _half_stride_view])
@pytest.mark.parametrize("entry", ["kernel", "compiled"])
def test_a_converted_argument_is_right_on_every_call(make, entry):
    view = make()
    expected = np.ascontiguousarray(view) * 2
    kernel = tc.define(COPY).copy
    call = kernel if entry == "kernel" else kernel.compile(view)
    for _ in range(3):  # the second call took the hot path with the raw pointer
        np.testing.assert_array_equal(call(make()), expected)


@pytest.mark.parametrize("entry", ["kernel", "compiled"])
def test_big_endian_inputs_are_read_as_numbers(entry):
    a = np.arange(8, dtype=">f4")
    kernel = tc.define(ADD).add
    call = kernel if entry == "kernel" else kernel.compile(a, a)
    for _ in range(2):
        np.testing.assert_array_equal(call(a, a), np.arange(8, dtype=np.float32) * 2)


def test_big_endian_out_is_refused():
    a = np.arange(8, dtype=np.float32)
    with pytest.raises(tc.TCArgumentError, match="byte order"):
        tc.define(COPY).copy(a, out=np.empty(8, dtype=">f4"))


def test_big_endian_gpu_arrays_are_refused():
    class BigEndianOnGpu:  # what a GPU library could hand over: no copy can fix it on the host
        __cuda_array_interface__ = {"shape": (4,), "typestr": ">f4", "data": (0, False),
                                    "version": 3}

    with pytest.raises(tc.TCArgumentError, match="must be float32, but it is >f4"):
        tc.define(COPY, backend="cuda").copy(BigEndianOnGpu())


def test_masked_arrays_are_refused_in_and_out():
    a = np.ma.masked_array(np.arange(4, dtype=np.float32), mask=[0, 1, 0, 0])
    kernel = tc.define(COPY).copy
    with pytest.raises(tc.TCArgumentError, match="masked array"):
        kernel(a)
    with pytest.raises(tc.TCArgumentError, match="masked array"):
        kernel(a.data, out=np.ma.masked_array(np.empty(4, np.float32)))


@pytest.mark.filterwarnings("ignore:the matrix subclass:PendingDeprecationWarning")
def test_matrix_inputs_are_taken_as_plain_arrays():
    mm = "def t(float(M,N) A) -> (B) {\n  B(j, i) = A(i, j)\n}"
    a = np.matrix(np.arange(6, dtype=np.float32).reshape(2, 3))
    result = tc.define(mm).t(a)
    assert type(result) is np.ndarray
    np.testing.assert_array_equal(result, np.asarray(a).T)


@pytest.mark.parametrize("entry", ["kernel", "compiled"])
def test_a_python_float_that_overflows_the_parameter_is_refused(entry):
    a = np.ones(4, np.float32)
    kernel = tc.define(SCALE).scale
    call = kernel if entry == "kernel" else kernel.compile(a, 1.0)
    np.testing.assert_array_equal(call(a, 3.0), a * 3)  # warm the hot path
    with pytest.raises(tc.TCArgumentError, match="does not fit"):
        call(a, 1e300)
    np.testing.assert_array_equal(call(a, float("inf")), a * np.inf)  # inf is a float32


# ---- item 8: small ones ------------------------------------------------------------------

def test_an_output_too_big_to_allocate_is_a_located_error():
    src = "def big(float(N) A) -> (B) {\n  B(i) = A(0) where i in 0:N*1000000000000\n}"
    with pytest.raises(tc.TCArgumentError) as info:
        tc.define(src).big(np.ones(1000, np.float32))
    text = str(info.value)
    assert "B of big would have shape (1000000000000000,)" in text
    assert "where i in 0:N*1000000000000" in text  # the statement, with its caret


@pytest.mark.parametrize("backend", ["cpu", "reference", "cuda-emulated"])
def test_a_zero_float_remainder_has_the_divisors_sign(backend):
    src = "def m(float(N) A, float(N) B) -> (C) {\n  C(i) = A(i) % B(i)\n}"
    a = np.array([-0.0, 0.0, -4.0, 4.0, 0.0, -0.0, 4.0, -3.0], np.float32)
    b = np.array([2.0, 2.0, 2.0, -2.0, -2.0, -2.0, 2.0, 2.0], np.float32)
    got = tc.define(src, backend=backend).m(a, b)
    expected = np.array([x % y for x, y in zip(a.tolist(), b.tolist())], np.float32)
    np.testing.assert_array_equal(got, expected)
    np.testing.assert_array_equal(np.signbit(got), np.signbit(expected))


def test_an_interleaved_out_that_shares_no_element_is_accepted():
    base = np.arange(20, dtype=np.float32)
    result = tc.define(COPY).copy(base[1::2], out=base[0::2])
    np.testing.assert_array_equal(result, np.arange(1, 20, 2, dtype=np.float32) * 2)
    np.testing.assert_array_equal(base[1::2], np.arange(1, 20, 2, dtype=np.float32))
    with pytest.raises(tc.TCArgumentError, match="shares memory"):
        tc.define(COPY).copy(base[0:10], out=base[5:15])


def test_tile_as_one_int_differs_from_a_one_member_tuple():
    every, first = Options(tile=32), Options(tile=(32,))
    assert every != first and every.key() != first.key()
    assert every.tile_sizes(3) == (32, 32, 32) and first.tile_sizes(3) == (32, 0, 0)
    assert dataclasses.replace(every, unroll=4).tile_sizes(2) == (32, 32)
    assert Options(tile=0).tile_sizes(2) == (0, 0) == Options(tile=()).tile_sizes(2)


def test_every_target_field_is_in_its_key():
    one = Target(name="cpu", mapping="threads", cores=1)
    assert one.key() != dataclasses.replace(one, cores=16).key()
    for field in dataclasses.fields(Target):
        assert field.name in dict(one.key())
