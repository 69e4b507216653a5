"""The CUDA emulation catches missing synchronisation.

The same GPU-mapped kernels run with and without their barriers: with them the results
match NumPy; without them the emulated threads read shared memory before the other threads
of their block have written it, and the results are wrong. This is what makes running the
generated CUDA under emulation in CI worth it.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from backends.cuda.emulation.build import available
from polyhedral import loop_ir as L
from polyhedral.pipeline import schedule_definition
from tclang.lang.frontend import check_source
from tclang.options import Options
from tclang.target import Target

pytestmark = pytest.mark.skipif(not available(), reason="g++ is needed for the emulation")

GPU = Target("cuda-emulated", "grid", max_threads_per_block=1024)


def without_barriers(node: L.Node) -> L.Node:
    match node:
        case L.Block(body=items):
            return L.Block(tuple(without_barriers(i) for i in items if not isinstance(i, L.Barrier)))
        case L.For() | L.Launch():
            return dataclasses.replace(node, body=without_barriers(node.body))
        case L.If(then=t, other=o):
            return dataclasses.replace(node, then=without_barriers(t),
                                       other=without_barriers(o) if o is not None else None)
    return node


def barriers(node: L.Node) -> int:
    return sum(isinstance(n, L.Barrier) for n in L.walk_nodes(node))


def run_emulated(kernel: L.Kernel, arrays: dict, sizes: dict) -> dict:
    from backends.cuda.emulated import EmulatedBackend
    backend = EmulatedBackend()
    artifact = backend.build(kernel, backend.target())
    ordered = [arrays[b.name] for b in kernel.buffers]
    artifact.run(ordered, [sizes[s] for s in kernel.sizes])
    return arrays


def kernel_for(source: str, sizes: dict, options: Options = Options()) -> L.Kernel:
    defn = check_source(source).definitions[0]
    return schedule_definition(defn, sizes, options, GPU).kernel


def test_shared_memory_matmul_needs_its_barriers():
    source = "def mm(float(M,K) A, float(K,N) B) -> (C) { C(m, n) +=! A(m, k) * B(k, n) }"
    sizes = dict(M=64, K=96, N=64)
    # (a manual block keeps isl's mapping and its promotion; the automatic schedule is a
    # tile contraction, whose barriers are the backend's: tests/e2e/test_tile_contractions.py)
    kernel = kernel_for(source, sizes, Options(block=(32, 8)))
    launch = next(n for n in L.walk_nodes(kernel.body) if isinstance(n, L.Launch))
    assert [b.kind for b in launch.buffers] == ["shared", "shared"]  # A and B promoted
    assert barriers(kernel.body) >= 2
    rng = np.random.default_rng(0)
    A, B = rng.random((64, 96), np.float32), rng.random((96, 64), np.float32)

    good = run_emulated(kernel, dict(A=A, B=B, C=np.zeros((64, 64), np.float32)), sizes)
    np.testing.assert_allclose(good["C"], A @ B, rtol=1e-4)

    broken = dataclasses.replace(kernel, body=without_barriers(kernel.body))
    assert barriers(broken.body) == 0
    bad = run_emulated(broken, dict(A=A, B=B, C=np.zeros((64, 64), np.float32)), sizes)
    assert not np.allclose(bad["C"], A @ B, rtol=1e-4), "a missing barrier went unnoticed"


def test_block_reduction_needs_its_barriers():
    source = "def total(float(N) A) -> (s) { s +=! A(i) }"
    sizes = dict(N=5000)
    # 16 threads: the tree over shared memory, one barrier a level (from a warp up, the
    # warps' shuffles combine each thread's own partial first: test_warp_shuffle_reduction)
    kernel = kernel_for(source, sizes, Options(block=(16,)))
    launch = next(n for n in L.walk_nodes(kernel.body) if isinstance(n, L.Launch))
    assert launch.block == (16,) and any(b.kind == "shared" for b in launch.buffers)
    A = np.random.default_rng(1).random(5000).astype(np.float32)

    good = run_emulated(kernel, dict(A=A, s=np.zeros((), np.float32)), sizes)
    np.testing.assert_allclose(good["s"], A.sum(dtype=np.float64), rtol=1e-4)

    broken = dataclasses.replace(kernel, body=without_barriers(kernel.body))
    bad = run_emulated(broken, dict(A=A, s=np.zeros((), np.float32)), sizes)
    assert not np.isclose(bad["s"], A.sum(dtype=np.float64), rtol=1e-4)


@pytest.mark.parametrize("dtype,op,threads", [(np.float32, "+", 32), (np.float64, "min", 64),
                                              (np.int32, "max", 256), (np.int64, "+", 1024),
                                              (np.uint32, "max", 128)])
def test_warp_shuffle_reduction(dtype, op, threads):
    """From a warp up, a block's partials combine by shuffles (L.BlockCombine): every
    operator and shuffled type, block sizes from one warp to 32 warps, a length no block
    size divides."""
    name = {np.float32: "float", np.float64: "double", np.int32: "int32",
            np.int64: "int64", np.uint32: "uint32"}[dtype]
    reduction = {"+": "+=!", "min": "min=!", "max": "max=!"}[op]
    source = f"def total({name}(N) A) -> (s) {{ s {reduction} A(i) }}"
    sizes = dict(N=4999)
    kernel = kernel_for(source, sizes, Options(block=(threads,)))
    assert any(isinstance(n, L.BlockCombine) for n in L.walk_nodes(kernel.body))
    rng = np.random.default_rng(threads)
    A = (rng.random(4999) * 1000).astype(dtype)
    got = run_emulated(kernel, dict(A=A, s=np.zeros((), dtype)), sizes)["s"]
    want = {"+": np.sum, "min": np.min, "max": np.max}[op](A.astype(np.float64))
    np.testing.assert_allclose(float(got), want, rtol=1e-5)


def test_interpreter_runs_the_block_combine():
    """The loop IR's meaning of L.BlockCombine (the interpreter's) is the reduction's."""
    from backends.interpreter import compile_kernel
    kernel = kernel_for("def total(float(N) A) -> (s) { s max=! A(i) }", dict(N=300),
                        Options(block=(64,)))
    assert any(isinstance(n, L.BlockCombine) for n in L.walk_nodes(kernel.body))
    A = np.random.default_rng(5).random(300).astype(np.float32)
    arrays = {"A": A, "s": np.zeros((), np.float32)}
    compile_kernel(kernel)(arrays, dict(N=300))
    assert float(arrays["s"]) == float(A.max())
