"""Shape-generic code stays proportional to the loops it comes from: shared index
subexpressions are emitted once, outlined loops take only their own buffers, and code too
large for LLVM is refused with a TCCompileError rather than minutes and gigabytes of O3."""

from __future__ import annotations

import llvmlite.ir as ir
import numpy as np
import pytest

import tclang as tc
from backends.llvm import jit
from backends.llvm.kernel_module import FunctionBuilder, KernelModule
from polyhedral import loop_ir as L


def _independent(n: int) -> str:
    outputs = ", ".join(f"O{k}" for k in range(n))
    body = " ".join(f"O{k}(i) = A(i) + {k}.0" for k in range(n))
    return f"def many(float(N) A) -> ({outputs}) {{ {body} }}"


def _generic_ir(source: str, *inputs) -> str:
    return tc.define(source, options=tc.Options(specialize=False)).many.compile(*inputs).source


def test_independent_statements_make_linear_code():
    a = np.ones(16, np.float32)
    small, large = _generic_ir(_independent(10), a), _generic_ir(_independent(40), a)
    # each outlined loop once took every buffer and loaded every stride: 4x the
    # statements made 12x the code
    assert len(large) < 4.5 * len(small)


def test_independent_statements_still_compute():
    a = np.arange(8, dtype=np.float32)
    outputs = tc.define(_independent(12), options=tc.Options(specialize=False)).many(a)
    assert all(np.array_equal(o, a + k) for k, o in enumerate(outputs))


def test_shared_index_subexpressions_are_emitted_once():
    compiled = tc.define("def many(float(N) A) -> (B) { B(i) = A(i) }",
                         options=tc.Options(specialize=False)).many.compile(np.ones(4, np.float32))
    km = KernelModule(compiled.loop_ir, jit.host()[0], jit.data_layout())
    fn = ir.Function(km.module, ir.FunctionType(ir.IntType(32), km.buffer_types +
                                                [ir.IntType(64).as_pointer()] * 3), "probe")
    fb = FunctionBuilder(km, fn, {}, None, tuple(b.name for b in km.kernel.buffers))
    e: L.IExpr = L.Var("N")
    for _ in range(16):  # a DAG of 16 levels: 65,536 operations as a tree
        e = L.Op("add", (L.Op("max", (e, L.Int(1))), L.Op("max", (e, L.Int(1)))))
    fb.index(e)
    assert len(fb.builder.block.instructions) < 100


def test_code_over_the_limit_is_refused(monkeypatch):
    monkeypatch.setenv("TCLANG_MAX_LLVM_IR_MB", "0.001")
    kernel = tc.define(_independent(3), options=tc.Options(specialize=False)).many
    with pytest.raises(tc.TCCompileError, match=r"MB of LLVM IR \(limit 0.001 MB\).*split"):
        kernel.compile(np.ones(4, np.float32))
