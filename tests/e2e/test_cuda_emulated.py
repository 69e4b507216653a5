"""Every corpus program through the generated CUDA, run by the CPU emulation of the
thread model (backend="cuda-emulated"), against NumPy: the CUDA path is checked in CI,
where there is no GPU. Each program runs on every shape (specialized), and once more as
shape-generic code."""

from __future__ import annotations

import pytest

import tclang
from backends.cuda.emulation.build import available
from tests.corpus import CASES, Case, assert_close, check_call, define, make_inputs, run_case

pytestmark = pytest.mark.skipif(not available(), reason="the emulation needs g++")


@pytest.mark.parametrize("case,k", [pytest.param(c, k, id=f"{c.name}-shape{k}")
                                    for c in CASES for k in range(len(c.shapes))])
def test_emulated(case: Case, k: int):
    outputs, expected = run_case(case, case.shapes[k], "cuda-emulated", None)
    assert_close(outputs, expected, case)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_emulated_shape_generic(case: Case):
    kernel = define(case, "cuda-emulated", tclang.Options(specialize=False))[case.entry]
    for shape in case.shapes:
        outputs, expected = check_call(case, kernel, make_inputs(case, shape))
        assert_close(outputs, expected, case)
