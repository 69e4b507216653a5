"""Source fuzzing through `tclang.define` (tests/lang fuzzes the front end alone).

Random bytes, token soup and mutated valid programs (the generator's and the e2e
corpus's): only TCError subclasses may come out of `define` or of a call of a kernel that
happened to be valid (run on random inputs), every syntax or semantic error points inside
the source, and `str(err)` works. 2,200 inputs in CI, derandomized; TCLANG_FUZZ_EXAMPLES
scales it for a long local run.
"""

from __future__ import annotations

import os
import random
from collections import Counter

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from tclang.fuzzing.driver import TOKENS, check_define, mutate
from tclang.fuzzing.generator import generate
from tests.corpus import CASES

SCALE = int(os.environ.get("TCLANG_FUZZ_EXAMPLES", "1000")) / 1000
# small generated programs: a mutation of a big one can take seconds to schedule
SEEDS = [s for s in (generate(random.Random(f"source-fuzz:{k}")).source for k in range(60))
         if len(s) < 500][:30] + [c.source for c in CASES]


def ci(examples: int) -> settings:
    return settings(derandomize=True, deadline=None, max_examples=int(examples * SCALE),
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def assert_clean(source: str, rng: random.Random, backend: str = "reference") -> None:
    stats = Counter()
    problem = check_define(source, rng, backend, stats)
    if _in_test():
        event("called" if stats["called"] else "defined" if stats["defined"] else "refused")
    assert problem is None, f"{problem}\nsource: {source!r}"


def _in_test() -> bool:
    from hypothesis.control import _current_build_context
    return _current_build_context.value is not None


@ci(600)
@given(st.binary(max_size=120), st.randoms(use_true_random=False))
def test_random_bytes(data, rng):
    assert_clean(data.decode("utf-8", errors="replace"), rng)


@ci(200)
@given(st.text(max_size=80), st.randoms(use_true_random=False))
def test_random_text(text, rng):
    assert_clean(text, rng)


@ci(500)
@given(st.lists(st.sampled_from(TOKENS), max_size=50).map(" ".join),
       st.randoms(use_true_random=False))
def test_token_soup(source, rng):
    assert_clean(source, rng)


@ci(800)
@given(st.sampled_from(SEEDS), st.randoms(use_true_random=False))
def test_mutated_valid_programs(seed, rng):
    """Many mutations leave a valid program: it is compiled and called too."""
    assert_clean(mutate(rng, seed), rng)


@ci(100)
@given(st.sampled_from(SEEDS), st.randoms(use_true_random=False))
def test_mutated_valid_programs_on_the_cpu(seed, rng):
    assert_clean(mutate(rng, seed), rng, backend="cpu")


def test_the_seeds_are_valid_and_run():
    rng = random.Random(0)
    for source in SEEDS[:10]:
        assert_clean(source, rng)
