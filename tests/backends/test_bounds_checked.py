"""Bounds-checked mode: every access of the generated code is checked.

Valid programs never trip it (their affine accesses are proven in bounds when compiled),
so these tests break a schedule on purpose: one loop runs one iteration too far. Without
the mode that would read and write outside the arrays; with it, every backend stops at the
first bad access and names the tensor, the element and the statement.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import tclang as tc
from backends.cuda.emulation.build import available
from polyhedral import loop_ir as L
from polyhedral.pipeline import schedule_definition
from tclang.driver.compiler import compile_target, get_backend
from tclang.lang.frontend import check_source
from tclang.layouts import Layout

SOURCE = "def scale(float(N, M) A) -> (B) {\n  B(i, j) = A(i, j) * 2\n}"
BACKENDS = ["cpu", "reference"] + (["cuda-emulated"] if available() else [])


def overrun(node: L.Node) -> L.Node:
    """The outermost loop runs once more than it should."""
    match node:
        case L.For():
            return dataclasses.replace(node, hi=L.add(node.hi, L.Int(1)))
        case L.Block(body=items):
            return L.Block((overrun(items[0]),) + items[1:])
        case L.Launch():
            return dataclasses.replace(node, body=overrun(node.body))
    raise AssertionError(f"no loop to break in {node!r}")


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_access_is_checked(backend):
    options = tc.Options(check_bounds=True, block=(1, 1))
    chosen = get_backend(backend)
    target = compile_target(backend, options)
    defn = check_source(SOURCE).definitions[0]
    kernel = schedule_definition(defn, dict(N=3, M=4), options, target, (Layout((4, 1)),)).kernel
    assert kernel.choices.check_bounds
    broken = dataclasses.replace(kernel, body=overrun(kernel.body))
    artifact = chosen.build(broken, target)
    a = np.ones((3, 4), np.float32)
    b = np.zeros((3, 4), np.float32)
    with pytest.raises(tc.TCIndexError) as info:
        artifact.run([a, b], [3, 4])
    message = str(info.value)
    assert "out of bounds for dimension 0" in message and "(shape (3, 4))" in message
    assert "element A[3," in message or "element B[3," in message
    assert "B(i, j) = A(i, j) * 2" in message and "line 2" in message


def test_option_and_environment_both_turn_it_on(monkeypatch):
    from tclang.target import bounds_checking
    assert not bounds_checking(tc.Options())
    assert bounds_checking(tc.Options(check_bounds=True))
    monkeypatch.setenv("TCLANG_CHECK_BOUNDS", "1")
    assert bounds_checking(tc.Options()) and bounds_checking(None)
    assert not bounds_checking(tc.Options(check_bounds=False))


def test_checked_code_gives_the_same_results():
    a = np.random.default_rng(0).random((5, 7), np.float32)
    for backend in BACKENDS:
        mod = tc.define(SOURCE, backend=backend, options=tc.Options(check_bounds=True))
        np.testing.assert_array_equal(mod.scale(a), a * 2)
