"""GPU contractions computed a tile per block (polyhedral/tile_contraction.py,
backends/cuda/tile_kernels.py), checked against NumPy on the emulated GPU and through the
loop-IR interpreter, over a generated family of contractions (layouts, several indices of
one kind, batch indices, transposed operands, `+=!` and `+=`, elementwise followers, half
operands on the tensor cores), with odd, prime and size-1 extents, and contiguous, Fortran-
ordered and strided arguments (the vector copies' run-time check)."""

from __future__ import annotations

import itertools
import random
import shutil
import subprocess

import numpy as np
import pytest

import tclang as tc
from backends.interpreter import compile_kernel
from polyhedral import loop_ir as L
from polyhedral.pipeline import schedule_definition
from tclang.lang.frontend import check_source
from tclang.target import Target

BACKEND = "cuda-emulated"
TILED = "tile of the sum"

pytestmark = pytest.mark.skipif(shutil.which("g++") is None and shutil.which("c++") is None,
                                reason="the emulated GPU needs a C++ compiler")


def _uses_tiles(kernel, args) -> bool:
    return TILED in kernel.compile(*args).loops


def _rand(shape, dtype, rng):
    return rng.standard_normal(shape).astype(dtype)


# ---- a generated family -------------------------------------------------------------------

def _family(seed: int):
    """One contraction: (source, entry, inputs maker, NumPy reference, whether it is big
    enough for the tile plan)."""
    rng = random.Random(seed)
    names = iter("abcdefgh")
    rows = [next(names) for _ in range(rng.choice((1, 1, 2)))]
    cols = [next(names) for _ in range(rng.choice((1, 1, 2)))]
    depth = [next(names) for _ in range(rng.choice((1, 1, 2)))]
    batch = [next(names) for _ in range(rng.choice((0, 0, 1)))]
    small = (1, 2, 3, 5, 7)
    extent = {}
    for group, big in ((rows, (67, 97, 129)), (cols, (61, 70, 131)), (depth, (17, 29, 40)),
                       (batch, (2, 3))):
        for k, i in enumerate(group):
            extent[i] = rng.choice(big) if k == 0 else rng.choice(small)
    if rng.random() < 0.2:  # a size-1 row or column
        extent[rows[0] if rng.random() < 0.5 else cols[0]] = 1
    a_idx = rows + depth + batch
    b_idx = depth + cols + batch
    rng.shuffle(a_idx)
    rng.shuffle(b_idx)
    out = rows + cols + batch
    rng.shuffle(out)
    dtype = "half" if rng.random() < 0.3 else "float"
    follower = rng.random() < 0.4
    reset = rng.random() < 0.8
    size = {i: "S" + i.upper() for i in extent}

    def decl(idx):
        return ", ".join(size[i] for i in idx)

    lhs = ", ".join(out)
    body = f"C({lhs}) {'+=!' if reset else '+='} A({', '.join(a_idx)}) * B({', '.join(b_idx)})"
    if not reset:
        body = f"C({lhs}) = {dtype}(0.5)\n    " + body
    if follower:
        body += f"\n    C({lhs}) = {dtype}(fmax(C({lhs}), 0.25))"
    source = (f"def f({dtype}({decl(a_idx)}) A, {dtype}({decl(b_idx)}) B) -> "
              f"({dtype}({decl(out)}) C) {{\n"
              f"    {body}\n}}")
    np_dtype = np.float16 if dtype == "half" else np.float32

    def inputs(r):
        return (_rand([extent[i] for i in a_idx], np_dtype, r),
                _rand([extent[i] for i in b_idx], np_dtype, r))

    def reference(A, B):
        spec = f"{''.join(a_idx)},{''.join(b_idx)}->{''.join(out)}"
        value = np.einsum(spec, A.astype(np.float64), B.astype(np.float64))
        if not reset:
            value = value + 0.5
        if follower:
            value = np.maximum(value, 0.25)
        return value

    points = 1
    for i in rows + cols:
        points *= extent[i]
    d = 1
    for i in depth:
        d *= extent[i]
    # (a `+=` after an assignment in the same band keeps the isl mapping: the tile plan
    # starts every sum from zero or from the target, not from an earlier statement's value)
    big = points >= 64 * 64 and d >= 16 and reset
    return source, inputs, reference, big, np_dtype


@pytest.mark.parametrize("seed", [*range(10), 18, 21])  # (18, 21: half on the tensor cores)
def test_generated_contractions_match_numpy(seed):
    source, inputs, reference, big, dtype = _family(seed)
    rng = np.random.default_rng(seed)
    kernel = tc.define(source, backend=BACKEND).f
    args = inputs(rng)
    got = kernel(*args)
    want = reference(*args)
    tolerance = 3e-3 if dtype == np.float16 else 2e-5
    scale = max(1.0, float(np.abs(want).max()))
    assert np.abs(got.astype(np.float64) - want).max() <= tolerance * scale, source
    if big:
        assert _uses_tiles(kernel, args), source


MATMUL = "def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }"
HALF_MATMUL = MATMUL.replace("float", "half")


@pytest.mark.parametrize("source,dtype", [(MATMUL, np.float32), (HALF_MATMUL, np.float16)])
@pytest.mark.parametrize("m,k,n", [(64, 16, 64), (67, 45, 131), (1, 31, 4099), (97, 1, 89),
                                   (128, 64, 256)])
def test_matmul_tiles_at_odd_prime_and_unit_sizes(source, dtype, m, k, n):
    rng = np.random.default_rng(m * k * n)
    A, B = _rand((m, k), dtype, rng), _rand((k, n), dtype, rng)
    kernel = tc.define(source, backend=BACKEND).mm
    want = A.astype(np.float64) @ B.astype(np.float64)
    got = kernel(A, B).astype(np.float64)
    tolerance = 3e-3 if dtype == np.float16 else 2e-5
    assert np.abs(got - want).max() <= tolerance * max(1.0, np.abs(want).max())
    if k >= 16:
        assert _uses_tiles(kernel, (A, B))


@pytest.mark.parametrize("layout", ["fortran", "strided", "offset"])
@pytest.mark.parametrize("source,dtype", [(MATMUL, np.float32), (HALF_MATMUL, np.float16)])
def test_scalar_copies_take_over_where_vectors_would_be_wrong(layout, source, dtype):
    """The vector copies need consecutive, aligned points; a Fortran-ordered, strided or
    misaligned argument must give the same numbers through the scalar copies."""
    rng = np.random.default_rng(1)
    m, k, n = 96, 40, 72
    A, B = _rand((m, k), dtype, rng), _rand((k, n), dtype, rng)
    if layout == "fortran":
        A, B = np.asfortranarray(A), np.asfortranarray(B)
    elif layout == "strided":
        A = _rand((m, 2 * k), dtype, rng)[:, ::2]
        B = _rand((2 * k, n), dtype, rng)[::2]
    else:  # one element past an aligned start
        A = _rand((m * k + 1,), dtype, rng)[1:].reshape(m, k)
    kernel = tc.define(source, backend=BACKEND).mm
    want = A.astype(np.float64) @ B.astype(np.float64)
    got = kernel(A, B).astype(np.float64)
    tolerance = 3e-3 if dtype == np.float16 else 2e-5
    assert np.abs(got - want).max() <= tolerance * max(1.0, np.abs(want).max())


def test_accumulating_into_an_earlier_value_adds():
    source = """def f(float(M,K) A, float(K,N) B, float(M,N) C0) -> (C) {
        C(m, n) = C0(m, n)
        C(m, n) += A(m, k) * B(k, n)
    }"""
    rng = np.random.default_rng(2)
    A, B, C0 = _rand((70, 33), np.float32, rng), _rand((33, 65), np.float32, rng), \
        _rand((70, 65), np.float32, rng)
    kernel = tc.define(source, backend=BACKEND).f
    np.testing.assert_allclose(kernel(A, B, C0), C0 + A @ B, rtol=1e-5, atol=1e-5)


def test_interpreter_runs_the_tile_node():
    """The loop IR's meaning of the node, run by the interpreter, is NumPy's product: the
    contract the CUDA code is held to."""
    defn = check_source(MATMUL).definitions[0]
    sizes = dict(M=67, K=45, N=131)
    kernel = schedule_definition(defn, sizes, tc.Options(), Target("cuda", "grid",
                                                                   arch="sm_90")).kernel
    assert any(isinstance(n, L.TileContraction) for n in L.walk_nodes(kernel.body))
    rng = np.random.default_rng(3)
    A, B = _rand((67, 45), np.float32, rng), _rand((45, 131), np.float32, rng)
    arrays = {"A": A, "B": B, "C": np.full((67, 131), np.nan, np.float32)}
    compile_kernel(kernel)(arrays, sizes)
    np.testing.assert_allclose(arrays["C"], A @ B, rtol=1e-5, atol=1e-5)


def test_manual_gpu_schedules_keep_the_isl_mapping():
    rng = np.random.default_rng(4)
    A, B = _rand((80, 40), np.float32, rng), _rand((40, 90), np.float32, rng)
    for options in (tc.Options(block=(16, 8)), tc.Options(tile=16),
                    tc.Options(shared_memory=False), tc.Options(private_memory=False)):
        kernel = tc.define(MATMUL, backend=BACKEND, options=options).mm
        assert not _uses_tiles(kernel, (A, B))
        np.testing.assert_allclose(kernel(A, B), A @ B, rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_tile_kernels_compile_with_nvcc(arch, tmp_path):
    """The real CUDA path (WMMA, cp.async, float4) is not what the emulator compiles:
    nvcc must accept it, without spills, for each layout of the shared slices."""
    from backends.cuda.codegen import generate
    sources = {
        "simt": (MATMUL, dict(M=256, K=64, N=256)),
        "mma": (HALF_MATMUL, dict(M=256, K=64, N=256)),
        "mma_transposed": ("def f(half(K,M) A, half(N,K) B) -> (C) "
                           "{ C(m,n) +=! A(k,m) * B(n,k) }", dict(M=256, K=64, N=256)),
        "conv": ("def conv(float(N,C,H,W) I, float(M,C,KH,KW) W1) -> (O) "
                 "{ O(n,m,h,w) +=! I(n,c,h+kh,w+kw) * W1(m,c,kh,kw) }",
                 dict(N=2, C=8, H=34, W=34, M=64, KH=3, KW=3)),
    }
    for name, (source, sizes) in sources.items():
        defn = check_source(source).definitions[0]
        kernel = schedule_definition(defn, sizes, tc.Options(),
                                     Target("cuda", "grid", arch=arch)).kernel
        assert any(isinstance(n, L.TileContraction) for n in L.walk_nodes(kernel.body)), name
        path = tmp_path / f"{name}.cu"
        path.write_text(generate(kernel).text)
        done = subprocess.run(["nvcc", f"-arch={arch}", "-cubin", "-Xptxas", "-v", "-o",
                               str(tmp_path / f"{name}.cubin"), str(path)],
                              capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-3000:]
        assert " 0 bytes spill stores" in done.stderr, done.stderr[-2000:]


BF16_MATMUL = MATMUL.replace("float", "bfloat16")


@pytest.mark.parametrize("m,k,n", [(67, 45, 131), (128, 200, 64), (1, 33, 4099)])
def test_bfloat16_matmul_on_the_tensor_cores(m, k, n):
    torch = pytest.importorskip("torch")
    gen = torch.Generator().manual_seed(m + k + n)
    A = torch.randn(m, k, generator=gen).to(torch.bfloat16)
    B = torch.randn(k, n, generator=gen).to(torch.bfloat16)
    kernel = tc.define(BF16_MATMUL, backend=BACKEND).mm
    got = kernel(A, B)
    assert got.dtype == torch.bfloat16
    want = (A.double() @ B.double())
    assert float((got.double() - want).abs().max()) <= 1e-2 * max(1.0, float(want.abs().max()))
    assert _uses_tiles(kernel, (A, B))


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_bfloat16_tiles_compile_with_nvcc(arch, tmp_path):
    from backends.cuda.codegen import generate
    defn = check_source(BF16_MATMUL).definitions[0]
    kernel = schedule_definition(defn, dict(M=256, K=64, N=256), tc.Options(),
                                 Target("cuda", "grid", arch=arch)).kernel
    tile = next(n for n in L.walk_nodes(kernel.body) if isinstance(n, L.TileContraction))
    assert tile.engine == "mma"
    path = tmp_path / "bf16.cu"
    path.write_text(generate(kernel).text)
    done = subprocess.run(["nvcc", f"-arch={arch}", "-cubin", "-o", str(tmp_path / "k.cubin"),
                           str(path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]


def test_bfloat16_before_sm_80_keeps_the_cuda_cores():
    defn = check_source(BF16_MATMUL).definitions[0]
    kernel = schedule_definition(defn, dict(M=256, K=64, N=256), tc.Options(),
                                 Target("cuda", "grid", arch="sm_75")).kernel
    assert not any(isinstance(n, L.TileContraction) and n.engine == "mma"
                   for n in L.walk_nodes(kernel.body))


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_cuda_export_asks_for_the_tiles_dynamic_shared_memory(tmp_path):
    """Three stages of 128 x 128 slices take over 48 KB: the exported library opts its
    launch into that much and passes it at the launch, as the PyCUDA backend does."""
    module = tc.define(HALF_MATMUL)
    lib = module.mm.export(tmp_path / "lib", dict(M=4096, K=512, N=4096), target="cuda",
                           arch="sm_80")
    text = (lib.library.parent / "mm.cu").read_text()
    assert "cudaFuncSetAttribute(tclang_mm_0, cudaFuncAttributeMaxDynamicSharedMemorySize" \
        in text
    assert "tclang_mm_0<<<grid, block, 56832, stream>>>" in text
