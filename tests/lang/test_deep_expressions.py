"""Long flat chains (`a + b + ... `) are not nesting: they compile and run on every backend,
while real nesting and absurd heights are still refused with a located error (issue 11,
item 8)."""

from __future__ import annotations

import sys
import threading

import numpy as np
import pytest

import tclang as tc
from tclang.lang.parser import MAX_DEPTH, MAX_HEIGHT, recursion_room


def _chain(terms: int) -> str:
    """A flat mix of + and - over `terms` operands, one of them a product."""
    parts = ["A(i)"]
    for k in range(1, terms):
        parts += ["+" if k % 2 else "-", "A(i) * B(i)" if k % 3 == 0 else "B(i)"]
    return "def f(float(N) A, float(N) B) -> (O) {\n  O(i) = " + " ".join(parts) + "\n}"


def _expected(terms: int, a, b):
    total = a.astype(np.float64).copy()
    for k in range(1, terms):
        term = a * b if k % 3 == 0 else b
        total = total + term if k % 2 else total - term
    return total


# 2,000 terms on the CPU by default; the interpreter and the emulated GPU at 2,000 cost
# 25 s more of the default run (behind `slow`), 450 terms already passes their recursion
@pytest.mark.parametrize("terms,backend", [
    (450, "cpu"), (2000, "cpu"), (450, "reference"), (450, "cuda-emulated"),
    pytest.param(2000, "reference", marks=pytest.mark.slow),
    pytest.param(2000, "cuda-emulated", marks=pytest.mark.slow)])
def test_a_long_flat_chain_compiles_and_runs(terms, backend):
    a = np.arange(4, dtype=np.float32)
    b = np.full(4, 0.5, np.float32)
    got = tc.define(_chain(terms), backend=backend).f(a, b)
    np.testing.assert_allclose(got, _expected(terms, a, b), rtol=1e-5)


def test_a_chain_taller_than_the_limit_is_refused():
    with pytest.raises(tc.TCSyntaxError, match=f"more than {MAX_HEIGHT} levels deep"):
        tc.define(_chain(MAX_HEIGHT + 1))


def test_real_nesting_is_still_refused():
    src = "def f(float(N) A) -> (O) {\n  O(i) = " + "-(" * (MAX_DEPTH + 1) + "A(i)" + \
        ")" * (MAX_DEPTH + 1) + "\n}"
    with pytest.raises(tc.TCSyntaxError, match=f"nested more than {MAX_DEPTH} levels deep"):
        tc.define(src)


def test_recursion_room_is_kept_until_the_last_thread_leaves():
    before = sys.getrecursionlimit()
    entered, leave = threading.Event(), threading.Event()

    def first_in_first_out():
        with recursion_room():
            entered.set()
            leave.wait(10)

    first = threading.Thread(target=first_in_first_out)
    first.start()
    entered.wait(10)
    with recursion_room():
        room = sys.getrecursionlimit()
        leave.set()
        first.join()  # the first thread left while this one is still inside
        assert sys.getrecursionlimit() == room > before
    assert sys.getrecursionlimit() == before
