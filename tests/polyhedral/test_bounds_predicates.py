"""Shape-generic bounds checks run without isl: the predicate isl's AST generator wrote for
each set of bad sizes says "bad" for exactly the sizes in the set."""

from __future__ import annotations

import itertools
import random

import pytest

from polyhedral.bounds import bounds_conditions
from polyhedral.bounds_runtime import _bad, _bad_by_isl, check_generic_bounds
from polyhedral.scop import build_scop
from tclang import TCArgumentError
from tclang.lang.frontend import check_source
from tclang.fuzzing.generator import generate
from tests.corpus import CASES

SHIFTED = """def shifted(float(N) A, float(M) B) -> (C) {
  C(i) = A(i + 2) + B(2 * i) where i in 0:N-2
}"""


def conditions_of(source: str):
    """(condition, the definition's size names) of each read that some sizes break."""
    for definition in check_source(source).definitions:
        for cond in bounds_conditions(build_scop(definition, None)):
            yield cond, sorted(definition.sizes)


def test_predicates_agree_with_isl():
    sources = [SHIFTED] + [c.source for c in CASES] + \
        [generate(random.Random(f"bounds:{k}")).source for k in range(40)]
    rng = random.Random(0)
    checked = bad = 0
    for source in sources:
        for cond, names in conditions_of(source):
            assert cond.predicate is not None, cond.bad_sizes
            for _ in range(40):
                sizes = {n: rng.choice([1, 2, 3, 4, 5, 7, 8, 13, 16, 31]) for n in names}
                expected = _bad_by_isl(cond, sizes)
                assert _bad(cond, sizes) == expected, (cond.bad_sizes, sizes)
                checked += 1
                bad += expected
    assert checked >= 200 and bad > 10


def test_the_generic_check_raises_with_the_read():
    (cond, _), *_ = conditions_of(SHIFTED)
    with pytest.raises(TCArgumentError, match="out of bounds"):
        check_generic_bounds([cond], dict(N=10, M=5), SHIFTED)
    check_generic_bounds([cond], dict(N=10, M=20), SHIFTED)


@pytest.mark.parametrize("n, m", itertools.product([1, 2, 3, 9], [1, 16, 17]))
def test_predicate_matches_isl_on_a_grid(n, m):
    for cond, _ in conditions_of(SHIFTED):
        assert _bad(cond, dict(N=n, M=m)) == _bad_by_isl(cond, dict(N=n, M=m))
