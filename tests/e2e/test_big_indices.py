"""Index and size values past 2^31 are never wrapped (issue 11, item 4).

The language types `i` and `N` used as values as int32, but extents may exceed 2^31: every
integer expression built on them is computed exactly (tclang/lang/wide_indices.py) and takes its
declared type only where stored or explicitly cast. The inputs are stride-0 broadcasts of
one element (no memory), the outputs are a few elements, and the loops that reach the big
values run a handful of iterations (`where i in N-4:N`), so every backend runs in moments.
"""

from __future__ import annotations

import numpy as np
import pytest

import tclang as tc
from tclang.options import Options
from tclang.lang.wide_indices import widen_value
from tclang.lang import program as P
from tclang.dtypes import DType

BIG = 2**31 + 5  # an extent whose last indices do not fit in int32
BACKENDS = ["cpu", "reference", "cuda-emulated"]

SOURCE = """
def size_value(float(N) A) -> (O) { O(k) = int64(N) where k in 0:1 }
def index_sum(float(N) A) -> (O) { O(k) +=! int64(i) where k in 0:1, i in N-4:N }
def shifted(float(N) A) -> (O) { O(j) = int64(j + N - 4) where j in 0:4 }
def exact_double(float(N) A) -> (O) { O(j) = double(j + N - 4) where j in 0:4 }
def compared(float(N) A) -> (O) { O(k) = (N > 2147483647) ? 1 : 0 where k in 0:1 }
def divided(float(N) A) -> (O) { O(j) = int64((j + N) / 4) + int64((j + N) % 7) where j in 0:2 }
def largest(float(N) A) -> (O) { O(k) max=! int64(max(i, 0)) where k in 0:1, i in N-4:N }
def wrapped(float(N) A) -> (O) { O(j) = j + N where j in 0:2 }
def guarded(float(M) A, float(N) B) -> (O) {
  O(k) +=! (i <= 2147483647) ? A(i) : 0.0 where k in 0:1, i in N-4:N
}
"""


def broadcast(extent: int, value: float = 0.0) -> np.ndarray:
    """An array of `extent` float32s that occupies one element (stride 0)."""
    return np.broadcast_to(np.full(1, value, np.float32), (extent,))


@pytest.fixture(params=BACKENDS)
def backend(request):
    return request.param


@pytest.mark.parametrize("specialize", [True, False])
def test_size_and_index_values_past_int32_are_exact(backend, specialize):
    A = broadcast(BIG)
    m = tc.define(SOURCE, backend=backend, options=Options(specialize=specialize))
    assert m.size_value(A).tolist() == [BIG]
    assert m.index_sum(A).tolist() == [4 * BIG - 10]
    assert m.shifted(A).tolist() == [BIG - 4, BIG - 3, BIG - 2, BIG - 1]
    assert m.exact_double(A).tolist() == [float(BIG - 4 + j) for j in range(4)]
    assert m.compared(A).tolist() == [1]
    assert m.divided(A).tolist() == [BIG // 4 + BIG % 7, (BIG + 1) // 4 + (BIG + 1) % 7]
    assert m.largest(A).tolist() == [BIG - 1]


def test_a_stored_int32_value_wraps_as_int32_arithmetic_does(backend):
    """`O(j) = j + N` keeps its int32 type: the store narrows the exact value."""
    O = tc.define(SOURCE, backend=backend).wrapped(broadcast(BIG))
    assert O.dtype == np.int32
    assert O.tolist() == np.array([BIG, BIG + 1], np.int64).astype(np.int32).tolist()


def test_a_guard_on_a_big_index_never_reads_outside(backend):
    """i = 2^31 + 1 wrapped to a negative int32 made the guard true: A was read past its end
    (check_bounds proves that no read leaves A now)."""
    m = tc.define(SOURCE, backend=backend, options=Options(check_bounds=True))
    O = m.guarded(broadcast(2**31, 1.0), broadcast(BIG))
    assert O.tolist() == [0.0]


def test_widening_types_index_arithmetic_int64_and_narrows_at_the_root():
    i = P.IndexValue("i")
    total = P.Binary("add", i, P.Const(1, DType.INT32), DType.INT32)
    widened = widen_value(total)
    assert widened == P.Cast(P.Binary("add", P.IndexValue("i", DType.INT64),
                                      P.Cast(P.Const(1, DType.INT32), DType.INT64),
                                      DType.INT64), DType.INT32)
    floats = P.Binary("mul", P.Const(2.0, DType.FLOAT32), P.Const(3.0, DType.FLOAT32),
                      DType.FLOAT32)
    assert widen_value(floats) == floats
