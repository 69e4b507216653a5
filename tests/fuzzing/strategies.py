"""Hypothesis strategies over the program generator, for tests that want generated
programs as hypothesis data (tclang/fuzzing/generator.py is the generator itself, usable
from a script with a plain `random.Random`)."""

from __future__ import annotations

from hypothesis import strategies as st

from tclang.fuzzing.generator import GeneratedProgram, generate


def programs() -> st.SearchStrategy[GeneratedProgram]:
    """Random valid programs with sizes that fit them. Hypothesis draws the generator's
    random choices, so a failing example replays from hypothesis' database and shrinks."""
    return st.randoms(use_true_random=False).map(generate)
