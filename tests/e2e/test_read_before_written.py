"""A statement that reads points of an output or temporary that no earlier statement wrote
reads its initial contents: zeros when tclang allocates it (LANGUAGE.md), on every backend,
specialized or not, on every call (a buffer left from an earlier call must not show).
Found by hand in a gradient's forward: `O(j, k) max=! A(j, k) where k in 1:Q` followed by
`O(j, k) = O(j, k) * 2.0` wrote every point of O, so O was not zero-filled, yet the second
statement read column 0 first."""

from __future__ import annotations

import numpy as np
import pytest

import tclang as tc

BACKENDS = ["cpu", "reference", "cuda-emulated"]

PROGRAMS = {
    "max then scale": ("""def f(float(J, Q) A) -> (O) {
        O(j, k) max=! A(j, k) where k in 1:Q
        O(j, k) = O(j, k) * 2.0
    }""", lambda A: np.concatenate([np.zeros((A.shape[0], 1), A.dtype), 2 * A[:, 1:]], 1)),
    "temporary read before its writes": ("""def f(float(J, Q) A) -> (O) {
        T(j, k) = A(j, k) + 1.0 where k in 1:Q
        O(j, k) = T(j, k) * 3.0 where k in 0:Q
    }""", lambda A: np.concatenate([np.zeros((A.shape[0], 1), A.dtype), 3 * (A[:, 1:] + 1)],
                                   1)),
    "sum into a later row": ("""def f(float(J, Q) A) -> (O) {
        O(j, k) = A(j, k) where j in 1:J
        O(j, k) += A(j, k)
    }""", lambda A: np.concatenate([A[:1], 2 * A[1:]], 0)),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", list(PROGRAMS))
@pytest.mark.parametrize("specialize", [True, False])
def test_unwritten_points_read_as_zeros(backend, name, specialize):
    source, reference = PROGRAMS[name]
    fn = tc.define(source, backend=backend, options=tc.Options(specialize=specialize)).f
    for shape in [(3, 5), (1, 2), (7, 13)]:
        for _ in range(2):  # the second call may reuse the first call's memory
            A = np.random.default_rng(sum(shape)).standard_normal(shape).astype(np.float32)
            np.testing.assert_allclose(fn(A), reference(A), rtol=1e-6, atol=1e-6)
