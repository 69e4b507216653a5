"""The fuzzer draws ranges bounded by other indices and guarded reads with no `where`
(issue 35 items 1 and 4): both families appear, check, and pass the differential runner."""

from __future__ import annotations

import random

import pytest

from tclang.fuzzing import differential
from tclang.fuzzing.reductions import reduction_program


def _programs(family, count):
    found = []
    for k in range(800):  # (one kind in 9 since "permuted" came)
        p = reduction_program(random.Random(f"ranges:{k}"))
        if p is not None and p.features.family == family:
            found.append(p)
        if len(found) == count:
            break
    return found


def test_both_families_are_drawn_with_their_forms():
    ranged = _programs("ranged", 40)
    unbounded = _programs("unbounded", 40)
    assert len(ranged) == 40 and len(unbounded) == 40
    text = "\n".join(p.source for p in ranged)
    for form in ("j in 0:i + 1", "j in i:T", "j in (i + 1) / 2:T", "Z(i, j) =", "+=!",
                 "max=!"):
        assert form in text, form
    text = "\n".join(p.source for p in unbounded)
    for form in ("(c == 0) ? ", "(i < M) ? ", "where j in 0:N + "):
        assert form in text, form
    assert all("r in" not in p.source for p in unbounded)  # no where for the rows


@pytest.mark.parametrize("family", ["ranged", "unbounded"])
def test_they_pass_the_differential_runner(family):
    for k, program in enumerate(_programs(family, 4)):
        report = differential.run_differential(program, backends=("cpu", "reference",
                                                                  "cuda-emulated"), seed=k)
        assert report.status == "pass", (program.source, report.failures)
