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
    kernel = kernel_for(source, sizes)
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
    kernel = kernel_for(source, sizes, Options(block=(128,)))
    launch = next(n for n in L.walk_nodes(kernel.body) if isinstance(n, L.Launch))
    assert launch.block == (128,) and any(b.kind == "shared" for b in launch.buffers)
    A = np.random.default_rng(1).random(5000).astype(np.float32)

    good = run_emulated(kernel, dict(A=A, s=np.zeros((), np.float32)), sizes)
    np.testing.assert_allclose(good["s"], A.sum(dtype=np.float64), rtol=1e-4)

    broken = dataclasses.replace(kernel, body=without_barriers(kernel.body))
    bad = run_emulated(broken, dict(A=A, s=np.zeros((), np.float32)), sizes)
    assert not np.isclose(bad["s"], A.sum(dtype=np.float64), rtol=1e-4)
