"""A long reduction to one value on the GPU: many blocks each reduce a share, combine it in
the block, and combine the block's result into the target atomically (after a one-thread
launch writes the identity for `op=!`). Checked against NumPy on the emulated GPU and
through the interpreter, for each operator and atomic type, lengths that no block count
divides, and the single-block plan kept where reductions may not be reordered."""

from __future__ import annotations

import numpy as np
import pytest

import tclang as tc
from backends.interpreter import compile_kernel
from polyhedral import loop_ir as L
from polyhedral.pipeline import schedule_definition
from tclang.lang.frontend import check_source
from tclang.target import Target

TYPES = {np.float32: "float", np.float64: "double", np.int32: "int32", np.int64: "int64",
         np.uint32: "uint32", np.uint64: "uint64"}
OPS = {"+": ("+=!", np.sum), "min": ("min=!", np.min), "max": ("max=!", np.max)}


def _atomic(kernel) -> bool:
    return "atomically" in kernel.loops


@pytest.mark.parametrize("dtype,op", [(np.float32, "+"), (np.float64, "min"),
                                      (np.int32, "max"), (np.int64, "+"), (np.uint32, "min"),
                                      (np.uint64, "max"), (np.float32, "max")])
def test_full_reductions_across_blocks(dtype, op):
    reduction, reference = OPS[op]
    source = f"def f({TYPES[dtype]}(N) A) -> (S) {{ S {reduction} A(n) }}"
    rng = np.random.default_rng(len(source))
    n = 70001  # prime: no block count divides it
    A = (rng.random(n) * 100).astype(dtype)
    fn = tc.define(source, backend="cuda-emulated").f
    assert _atomic(fn.compile(A))
    got = fn(A)
    np.testing.assert_allclose(float(got), float(reference(A.astype(np.float64))), rtol=1e-5)


def test_an_accumulating_reduction_adds_to_the_value_before():
    source = """def f(float(N, M) A) -> (S) {
        S = 2.5
        S += A(n, m)
    }"""
    A = np.random.default_rng(1).random((331, 211)).astype(np.float32)
    fn = tc.define(source, backend="cuda-emulated").f
    np.testing.assert_allclose(float(fn(A)), 2.5 + A.astype(np.float64).sum(), rtol=1e-5)


def test_ordered_reductions_keep_one_block():
    """reorder_reductions=False: the blocks' results would arrive in any order."""
    source = "def f(float(N) A) -> (S) { S +=! A(n) }"
    A = np.random.default_rng(2).random(70001).astype(np.float32)
    fn = tc.define(source, backend="cuda-emulated",
                   options=tc.Options(reorder_reductions=False)).f
    assert not _atomic(fn.compile(A))
    np.testing.assert_allclose(float(fn(A)), A.astype(np.float64).sum(), rtol=1e-5)


def test_interpreter_runs_the_reduction_across_blocks():
    defn = check_source("def f(float(N) A) -> (S) { S max=! A(n) }").definitions[0]
    kernel = schedule_definition(defn, dict(N=70001), tc.Options(),
                                 Target("cuda", "grid", arch="sm_90")).kernel
    assert any(isinstance(n, L.Combine) and n.atomic for n in L.walk_nodes(kernel.body))
    A = np.random.default_rng(3).random(70001).astype(np.float32)
    arrays = {"A": A, "S": np.full((), np.nan, np.float32)}
    compile_kernel(kernel)(arrays, dict(N=70001))
    assert float(arrays["S"]) == float(A.max())


@pytest.mark.skipif(__import__("shutil").which("nvcc") is None, reason="needs nvcc")
def test_atomic_combines_compile_with_nvcc(tmp_path):
    """The real CUDA atomics (CAS loops for float min/max) are not what the emulator
    compiles: nvcc must accept each kind."""
    import subprocess
    from backends.cuda.codegen import generate
    # one kernel per kind of atomic: float and double CAS loops, integer min/max, the
    # unsigned cast of a 64-bit signed add, a plain atomicAdd
    for dtype, op in ((np.float32, "min"), (np.float64, "max"), (np.int64, "+"),
                      (np.uint32, "min"), (np.float32, "+")):
        name, (reduction, _) = TYPES[dtype], OPS[op]
        defn = check_source(f"def f({name}(N) A) -> (S) {{ S {reduction} A(n) }}"
                            ).definitions[0]
        kernel = schedule_definition(defn, dict(N=70001), tc.Options(),
                                     Target("cuda", "grid", arch="sm_80")).kernel
        path = tmp_path / f"{name}_{op}.cu"
        path.write_text(generate(kernel).text)
        done = subprocess.run(["nvcc", "-arch=sm_80", "-cubin", "-o",
                               str(tmp_path / "k.cubin"), str(path)],
                              capture_output=True, text=True)
        assert done.returncode == 0, (name, op, done.stderr[-2000:])
