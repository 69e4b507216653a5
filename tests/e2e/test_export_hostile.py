"""An exported library called with hostile arguments, through ctypes in a child process (a
crash fails the test instead of killing pytest): each gets the status code docs/export.md
documents, as a Python call gets a TCArgumentError, never a crash. Outputs that alias an
input or each other, a stride of 0 on an output, extents whose element count wraps 64 bits
under a NULL pointer, strides that span more bytes than 64 bits count, a NULL `shape`."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap

import pytest

import tclang

pytestmark = pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None,
                                reason="no C compiler")

OK, BAD_ARGUMENT, BAD_SIZES = 0, 1, 2
TWO = """def two(float(N) A, float(N) B) -> (C, D) {
    C(i) = A(i) + B(i)
    D(i) = A(i) * B(i)
}"""
MM = "def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }"

PRELUDE = """
import ctypes, sys
lib = ctypes.CDLL(sys.argv[1])
P, I64 = ctypes.c_void_p, ctypes.c_int64
def ints(*v): return (I64 * len(v))(*v)
def floats(*v): return (ctypes.c_float * len(v))(*v)
def at(array, k=0): return ctypes.addressof(array) + 4 * k
def call(name, *args):  # data pointers are addresses (ints or None)
    fn = getattr(lib, name)
    fn.restype = ctypes.c_int
    return fn(*[P(a) if isinstance(a, int) or a is None else a for a in args])
"""


def run(library, body: str) -> tuple[int, str]:
    """(status, message) of the calls in `body` (which sets `status` and `name`), made in a
    child process; a crash fails the test with its signal."""
    script = PRELUDE + textwrap.dedent(body) + \
        "\nerror = getattr(lib, name + '_error'); error.restype = ctypes.c_char_p\n" \
        "print(status, (error() or b'').decode())\n"
    done = subprocess.run([sys.executable, "-c", script, str(library)], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, f"the call crashed (exit {done.returncode}): {done.stderr}"
    status, _, message = done.stdout.strip().partition(" ")
    return int(status), message


@pytest.fixture(scope="module")
def two(tmp_path_factory):
    return tclang.define(TWO).two.export(tmp_path_factory.mktemp("two"), None).library


@pytest.fixture(scope="module")
def mm(tmp_path_factory):
    return tclang.define(MM).mm.export(tmp_path_factory.mktemp("mm"), None).library


# tclang_two(A, A_sizes, A_strides, B, ..., C, ..., D, ...) with N = 8
TWO_CALL = """
name = "tclang_two"
a, b, base = floats(*range(8)), floats(*[2.0] * 8), floats(*[0.0] * 24)
n, one = ints(8), ints(1)
status = call(name, at(a), n, None, at(b), n, None, {c}, n, {c_strides}, {d}, n, {d_strides})
"""


@pytest.mark.parametrize("c,c_strides,d,d_strides,expected,message", [
    ("at(a)", "None", "at(base)", "None", BAD_ARGUMENT, "output C shares memory with input A"),
    ("at(b, 4)", "None", "at(base)", "None", BAD_ARGUMENT, "output C shares memory with input B"),
    ("at(base)", "None", "at(base, 7)", "None", BAD_ARGUMENT,
     "output D shares memory with output C"),
    ("at(base)", "ints(0)", "at(base, 8)", "None", BAD_ARGUMENT, "output C has overlapping"),
    ("at(base)", "None", "at(base, 8)", "ints(0)", BAD_ARGUMENT, "output D has overlapping"),
    ("at(base, 15)", "ints(-2)", "at(base, 16)", "ints(-2)", OK, ""),  # interleaved, reversed
    ("at(base)", "ints(2)", "at(base, 1)", "ints(2)", OK, ""),  # base[0::2], base[1::2]
], ids=["C-is-A", "C-overlaps-B", "D-overlaps-C", "C-stride-0", "D-stride-0",
        "interleaved-reversed", "interleaved"])
def test_outputs_that_share_memory_are_refused(two, c, c_strides, d, d_strides, expected,
                                               message):
    status, said = run(two, TWO_CALL.format(c=c, c_strides=c_strides, d=d,
                                            d_strides=d_strides))
    assert (status, message in said) == (expected, True), said


def test_interleaved_outputs_are_written_right(two):
    status, said = run(two, TWO_CALL.format(c="at(base)", c_strides="ints(2)",
                                            d="at(base, 1)", d_strides="ints(2)") + """
assert [base[2 * i] for i in range(8)] == [i + 2.0 for i in range(8)], list(base)
assert [base[2 * i + 1] for i in range(8)] == [i * 2.0 for i in range(8)], list(base)
""")
    assert status == OK, said


# tclang_mm(A, A_sizes, A_strides, B, B_sizes, B_strides, C, C_sizes, C_strides)
@pytest.mark.parametrize("body,expected,message", [
    # 2^62 x 4 elements: the count wraps to 0 in 64 bits, and A is NULL (the kernel ran)
    ("""status = call(name, None, ints(1 << 62, 4), None, at(b), ints(4, 1), None,
                      at(c), ints(1 << 62, 1), None)""", BAD_SIZES, "64 bits"),
    ("""status = call(name, None, ints(1 << 40, 4), None, at(b), ints(4, 1), None,
                      at(c), ints(1 << 40, 1), None)""", BAD_ARGUMENT, "A is NULL"),
    # an output whose strides reach 2^64 bytes past its start
    ("""status = call(name, at(a), ints(2, 4), None, at(b), ints(4, 1), None,
                      at(c), ints(2, 1), ints(1 << 62, 1))""", BAD_SIZES, "64 bits"),
    ("""status = call(name, at(a), ints(2, 4), None, at(b), ints(4, 1), None,
                      at(c), ints(2, 1), ints(0, 1))""", BAD_ARGUMENT, "overlapping"),
    ("""status = call(name, at(a), ints(2, 4), None, at(b), ints(4, 1), None,
                      None, ints(2, 1), ints(-1, 1))""", BAD_ARGUMENT, "C is NULL"),
    ("""status = call(name, at(a), ints(2, 4), None, at(b), ints(4, 1), None,
                      at(a, 2), ints(2, 1), None)""", BAD_ARGUMENT, "shares memory with input A"),
    ("""status = call(name, at(a), ints(2, 4), None, at(b), ints(4, 1), None,
                      at(c), ints(2, 1), ints(1, 2))""", OK, ""),  # a transposed output
    ("""status = call(name + "_output_shape", 0, ints(2, 4), ints(4, 1), None)""",
     BAD_ARGUMENT, "shape is NULL"),
], ids=["null-count-wraps", "null", "stride-bytes-overflow", "zero-stride",
        "null-reversed-output", "C-in-A", "transposed", "null-shape"])
def test_hostile_matmul_arguments_get_a_status_code(mm, body, expected, message):
    status, said = run(mm, 'name = "tclang_mm"\na, b, c = floats(*[1.0] * 8), '
                           'floats(*[1.0] * 4), floats(*[0.0] * 8)\n' + textwrap.dedent(body))
    assert (status, message in said) == (expected, True), said
