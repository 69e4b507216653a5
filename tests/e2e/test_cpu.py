"""Every corpus program through the CPU backend (LLVM), against NumPy.

- every shape under the automatic schedule, with C-ordered and Fortran-ordered inputs;
- the first shape under each fusion strategy (max, min, preserve_parallel);
- shape-generic code, compiled once per program and run on every shape.
Kernels are compiled by LLVM at O3, so the set of (program, option) pairs is chosen to
keep the run near a minute on two cores.
"""

from __future__ import annotations

import pytest

import tclang
from tests.corpus import CASES, Case, assert_close, check_call, define, make_inputs, run_case

FUSIONS = ("max", "min", "preserve_parallel")


@pytest.mark.parametrize("layout", ["C", "F"])
@pytest.mark.parametrize("case,k", [pytest.param(c, k, id=f"{c.name}-shape{k}")
                                    for c in CASES for k in range(len(c.shapes))])
def test_automatic_schedule(case: Case, k: int, layout: str):
    outputs, expected = run_case(case, case.shapes[k], "cpu", None, layout=layout)
    assert_close(outputs, expected, case)


@pytest.mark.parametrize("fusion", FUSIONS)
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_fusion_strategies(case: Case, fusion: str):
    outputs, expected = run_case(case, case.shapes[0], "cpu", tclang.Options(fusion=fusion))
    assert_close(outputs, expected, case)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_shape_generic(case: Case):
    kernel = define(case, "cpu", tclang.Options(specialize=False))[case.entry]
    compiled = kernel.compile(*make_inputs(case, case.shapes[0]))
    for shape in case.shapes:
        inputs = make_inputs(case, shape)
        assert kernel.compile(*inputs) is compiled
        outputs, expected = check_call(case, compiled, inputs)
        assert_close(outputs, expected, case)
