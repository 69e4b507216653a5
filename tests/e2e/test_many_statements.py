"""Programs of many statements (scheduled in groups and fused back, see
polyhedral/statement_groups.py) compute what NumPy computes, on the CPU and under the
reference interpreter, specialized and shape-generic, under each fusion strategy."""

from __future__ import annotations

import numpy as np
import pytest

import tclang as tc
from benchmarks.einsum_networks import network
from benchmarks.many_statements import expected, inputs, source

pytestmark = pytest.mark.filterwarnings("ignore::tclang.errors.TCWarning")


def _check(got, want):
    for g, w in zip(got if isinstance(got, tuple) else (got,),
                    want if isinstance(want, tuple) else (want,)):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kind", ["inplace", "temporaries", "independent"])
@pytest.mark.parametrize("backend, options", [
    ("cpu", None), ("reference", tc.Options(fusion="min")),
    ("reference", tc.Options(fusion="max")), ("cpu", tc.Options(specialize=False))],
    ids=["cpu", "reference-min", "reference-max", "cpu-generic"])
def test_a_60_statement_chain_matches_numpy(kind, backend, options):
    arrays = inputs(60, kind)
    kernel = tc.define(source(60, kind), backend=backend, options=options).many
    _check(kernel(*arrays), expected(60, kind, arrays))


@pytest.mark.parametrize("backend, options", [
    ("cpu", None), ("reference", None), ("reference", tc.Options(fusion="min")),
    pytest.param("cpu", tc.Options(specialize=False), marks=pytest.mark.slow)],
    ids=["cpu", "reference", "reference-min", "cpu-generic"])
def test_a_20_step_tensor_network_matches_numpy(backend, options):
    """20 contraction steps: 40 statements (an init and an update each). Shape-generic,
    60 sizes as isl parameters: about 3 s of CPU time (slow)."""
    net = network(20, seed=3)
    arrays = net.arrays()
    got = tc.define(net.source, backend=backend, options=options).network(*arrays)
    np.testing.assert_allclose(got, net.reference(arrays), rtol=1e-4)
