"""Options the CPU backend cannot honour are refused, not quietly ignored or spilled
(issue 31, item 13): `vector_width` is a power of two LLVM's vectorizer takes, and a
`register_tile` fits the target's vector registers (Target.vector_registers, the rule
of polyhedral/register_tiles.py's model and of the tuner's space)."""

from __future__ import annotations

import numpy as np
import pytest

import tclang as tc
from polyhedral.register_tiles import check_shape, dot_shape_for, shape_for
from tclang.target import Target

AVX2 = Target(name="cpu", mapping="threads", vector_bytes=32)  # 16 registers
AVX512 = Target(name="cpu", mapping="threads", vector_bytes=64)  # 32 registers


@pytest.mark.parametrize("width", [3, 6, 12, 100, 128, 256])
def test_vector_width_is_a_power_of_two_up_to_64(width):
    """LLVM ignores llvm.loop.vectorize.width unless it is a power of two up to 64: 3
    was accepted and then silently meant "the vectorizer's own choice"."""
    with pytest.raises(tc.TCScheduleError, match="vector_width must be a power of two up "
                                                 f"to 64, not {width}"):
        tc.Options(vector_width=width)


def test_every_width_llvm_takes_is_accepted():
    for k in range(7):
        assert tc.Options(vector_width=2 ** k).vector_width == 2 ** k


@pytest.mark.parametrize("target,kind,shape,fits", [
    (AVX2, "lanes", (4, 16), True), (AVX2, "lanes", (6, 16), True),    # 6 x 2 + 2 = 14
    (AVX2, "lanes", (7, 16), False), (AVX2, "lanes", (1, 120), False),  # 1 x 15 + 15
    (AVX512, "lanes", (4, 96), True), (AVX512, "lanes", (4, 100), False),
    (AVX512, "lanes", (100, 100), False),
    (AVX2, "dot", (2, 4), True), (AVX2, "dot", (4, 16), False),
    (AVX512, "dot", (4, 5), True), (AVX512, "dot", (5, 5), False),
])
def test_register_tiles_must_fit_the_vector_registers(target, kind, shape, fits):
    if fits:
        check_shape(shape, kind, target, 4)
        return
    with pytest.raises(tc.TCScheduleError, match=f"needs .* vector registers, but this CPU "
                                                 f"has {target.vector_registers}"):
        check_shape(shape, kind, target, 4)


@pytest.mark.parametrize("target", [AVX2, AVX512], ids=["16 registers", "32 registers"])
@pytest.mark.parametrize("element_bytes", [2, 4, 8])
def test_the_models_own_tiles_fit(target, element_bytes):
    """What the model picks passes the check it is held to."""
    check_shape(shape_for(target, element_bytes), "lanes", target, element_bytes)
    check_shape(dot_shape_for(target), "dot", target, element_bytes)


def test_a_register_tile_too_large_is_refused_at_its_statement():
    """register_tile=(100, 100) compiled 10,000 unrolled updates that spill on every FMA."""
    source = ("def mm(float(M,K) A, float(K,N) B) -> (C) {\n"
              "  C(m, n) +=! A(m, k) * B(k, n)\n}")
    kernel = tc.define(source, options=tc.Options(register_tile=(100, 100))).mm
    a = np.ones((64, 64), np.float32)
    with pytest.raises(tc.TCScheduleError, match=r"register_tile \(100, 100\) needs") as info:
        kernel(a, a)
    assert info.value.line == 2 and "a tile that fits here is register_tile=" in str(info.value)
