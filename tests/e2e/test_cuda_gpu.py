"""backend="cuda" on a real NVIDIA GPU: the whole corpus against NumPy (every shape
specialized, shape-generic, Fortran-ordered and strided inputs), float16/32/64, PyTorch CUDA
tensors and CuPy arrays used in place (outputs on the device, of the caller's kind, `out=`
written in place), the disk cache of cubins, and a refused launch as a TCLaunchError.

Everything here is behind the `gpu` marker and skips cleanly without PyCUDA or a GPU (CI
has neither); tests/e2e/test_cuda_emulated.py runs the same generated CUDA on the CPU."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import numpy as np
import pytest

import tclang
from tests.corpus import CASES, Case, assert_close, check_call, define, make_inputs, run_case

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(importlib.util.find_spec("pycuda") is None,
                                 reason="backend='cuda' needs PyCUDA and an NVIDIA GPU")]

MM = "def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }"
GATHER = "def take(float(N) T, int32(K) I) -> (O) { O(k) = T(I(k)) }"


@pytest.fixture(scope="module", autouse=True)
def gpu():
    """Skip (not fail) when PyCUDA imports but finds no GPU."""
    from backends.cuda.backend import _device
    try:
        return _device()
    except tclang.TCCompileError as err:
        pytest.skip(str(err))


@pytest.mark.parametrize("case,k", [pytest.param(c, k, id=f"{c.name}-shape{k}")
                                    for c in CASES for k in range(len(c.shapes))])
def test_corpus(case: Case, k: int):
    outputs, expected = run_case(case, case.shapes[k], "cuda")
    assert_close(outputs, expected, case)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_corpus_shape_generic(case: Case):
    kernel = define(case, "cuda", tclang.Options(specialize=False))[case.entry]
    for shape in case.shapes:
        outputs, expected = check_call(case, kernel, make_inputs(case, shape))
        assert_close(outputs, expected, case)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_corpus_fortran_order(case: Case):
    outputs, expected = run_case(case, case.shapes[-1], "cuda", layout="F")
    assert_close(outputs, expected, case)


@pytest.mark.parametrize("dtype,tolerance", [("half", 2e-2), ("float", 1e-5),
                                             ("double", 1e-12)])
@pytest.mark.parametrize("shape", [(1, 1, 1), (7, 13, 5), (64, 33, 17)])
def test_matmul_dtypes(dtype, tolerance, shape):
    m, k, n = shape
    source = MM.replace("float", dtype)
    numpy_type = {"half": np.float16, "float": np.float32, "double": np.float64}[dtype]
    rng = np.random.default_rng(7)
    a = rng.uniform(-1, 1, (m, k)).astype(numpy_type)
    b = rng.uniform(-1, 1, (k, n)).astype(numpy_type)
    c = tclang.define(source, backend="cuda").mm(a, b)
    assert c.dtype == numpy_type
    expected = a.astype(np.float64) @ b.astype(np.float64)
    np.testing.assert_allclose(c.astype(np.float64), expected, rtol=tolerance,
                               atol=tolerance * max(k, 1) ** 0.5)


@pytest.mark.parametrize("shape", [(1, 1, 1), (7, 13, 5), (64, 33, 17)])
def test_bfloat16_matmul_on_torch_cuda_tensors(shape):
    """__nv_bfloat16 storage, float32 accumulators: torch.bfloat16 CUDA tensors in and out
    (NumPy has no bfloat16)."""
    torch = pytest.importorskip("torch")
    m, k, n = shape
    gen = torch.Generator().manual_seed(7)
    a = torch.randn(m, k, generator=gen).bfloat16().cuda()
    b = torch.randn(k, n, generator=gen).bfloat16().cuda().t().contiguous().t()
    c = tclang.define(MM.replace("float", "bf16"), backend="cuda").mm(a, b)
    assert c.dtype == torch.bfloat16 and c.device.type == "cuda"
    expected = (a.double() @ b.double()).float().bfloat16()
    torch.testing.assert_close(c.float(), expected.float(), rtol=1.6e-2, atol=1.6e-2)


def test_strided_numpy_views():
    rng = np.random.default_rng(3)
    base_a = rng.standard_normal((14, 26)).astype(np.float32)
    base_b = rng.standard_normal((13, 10)).astype(np.float32)
    a, b = base_a[::2, ::2], base_b[:, ::2]  # 7x13 and 13x5, neither contiguous
    c = tclang.define(MM, backend="cuda").mm(a, b)
    np.testing.assert_allclose(c, a @ b, rtol=1e-5, atol=1e-5)


def test_torch_cuda_tensors_in_place():
    torch = pytest.importorskip("torch")
    a = torch.randn(37, 19, device="cuda")
    b = torch.randn(19, 23, device="cuda").t().contiguous().t()  # strided: read as it is
    kernel = tclang.define(MM, backend="cuda").mm
    c = kernel(a, b)
    assert isinstance(c, torch.Tensor) and c.device.type == "cuda"
    torch.testing.assert_close(c, a @ b, rtol=1e-4, atol=1e-4)
    out = torch.full((37, 23), float("nan"), device="cuda")
    assert kernel(a, b, out=out) is out
    torch.testing.assert_close(out, a @ b, rtol=1e-4, atol=1e-4)
    strided_out = torch.full((23, 37), float("nan"), device="cuda").t()
    assert kernel(a, b, out=strided_out) is strided_out
    torch.testing.assert_close(strided_out, a @ b, rtol=1e-4, atol=1e-4)


def test_repeat_torch_calls_skip_the_checks(monkeypatch):
    """A call whose tensors look like one checked before takes the hot path (no argument
    checks: bind_arguments is made to fail), with new tensors, with and without out=; what
    depends on the pointers or on autograd is still refused."""
    torch = pytest.importorskip("torch")
    from tclang.runtime import kernels as runtime
    kernel = tclang.define(MM, backend="cuda").mm
    compiled = None
    for _ in range(2):  # Kernel calls, then CompiledKernel calls
        a, b = torch.randn(29, 7, device="cuda"), torch.randn(7, 31, device="cuda")
        out = torch.empty(29, 31, device="cuda")
        call = compiled or kernel
        call(a, b), call(a, b, out=out)  # checked in full, remembered
        real = runtime.bind_arguments

        def boom(*args, **kwargs):
            raise AssertionError("the hot path checked the arguments again")

        monkeypatch.setattr(runtime, "bind_arguments", boom)
        a2, b2 = torch.randn(29, 7, device="cuda"), torch.randn(7, 31, device="cuda")
        torch.testing.assert_close(call(a2, b2), a2 @ b2, rtol=1e-4, atol=1e-4)
        out2 = torch.empty(29, 31, device="cuda")
        assert call(a2, b2, out=out2) is out2
        torch.testing.assert_close(out2, a2 @ b2, rtol=1e-4, atol=1e-4)
        monkeypatch.setattr(runtime, "bind_arguments", real)
        square = torch.randn(7, 7, device="cuda")
        call7 = kernel if compiled is None else kernel.compile(square, square)
        call7(square, square)
        with pytest.raises(tclang.TCArgumentError):  # out= is an input: checked path
            call7(square, square, out=square)
        with pytest.raises(tclang.TCArgumentError, match="grad"):
            call(a2.clone().requires_grad_(), b2)
        compiled = kernel.compile(a, b)


def test_torch_work_on_another_stream_is_waited_for():
    """Launches go to the default stream; inside `with torch.cuda.stream(s)` a call waits
    for the device before launching (the inputs may still be in flight on s) and after."""
    torch = pytest.importorskip("torch")
    kernel = tclang.define(MM, backend="cuda").mm
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        for _ in range(3):
            a = torch.randn(512, 300, device="cuda") * 2  # queued on `stream`
            b = torch.randn(300, 257, device="cuda") + 1
            c = kernel(a, b)
            torch.testing.assert_close(c, a @ b, rtol=1e-3, atol=1e-3)


def test_torch_inputs_are_not_copied():
    """The kernel reads the tensor's own device memory: a probe kernel returns an element
    the host never saw after it was written on the device."""
    torch = pytest.importorskip("torch")
    from tclang.runtime.arguments import as_array
    t = torch.arange(12.0, device="cuda").reshape(3, 4)
    seen = as_array(t, "A", 1, device=True)
    assert seen.device_pointer == t.data_ptr()
    t[1, 2] = 99.0  # written on the device after the view was taken
    got = tclang.define("def f(float(M,N) A) -> (B) { B(m,n) = A(m,n) }", backend="cuda").f(t)
    assert got.data_ptr() != t.data_ptr() and float(got[1, 2]) == 99.0


def test_cupy_arrays_in_place():
    cupy = pytest.importorskip("cupy")
    rng = np.random.default_rng(5)
    a_host = rng.standard_normal((11, 7)).astype(np.float32)
    b_host = rng.standard_normal((7, 13)).astype(np.float32)
    a, b = cupy.asarray(a_host), cupy.asarray(b_host)
    kernel = tclang.define(MM, backend="cuda").mm
    c = kernel(a, b)
    assert isinstance(c, cupy.ndarray)
    np.testing.assert_allclose(cupy.asnumpy(c), a_host @ b_host, rtol=1e-5, atol=1e-5)
    out = cupy.zeros((11, 13), dtype=cupy.float32)
    assert kernel(a, b, out=out) is out
    np.testing.assert_allclose(cupy.asnumpy(out), a_host @ b_host, rtol=1e-5, atol=1e-5)


def test_gather_out_of_range_on_the_gpu():
    kernel = tclang.define(GATHER, backend="cuda").take
    table = np.arange(5, dtype=np.float32)
    np.testing.assert_array_equal(kernel(table, np.array([4, 0, 2], np.int32)), [4, 0, 2])
    with pytest.raises(tclang.TCIndexError, match="T"):
        kernel(table, np.array([1, 5], np.int32))
    np.testing.assert_array_equal(kernel(table, np.array([3], np.int32)), [3])  # still usable


def test_a_refused_launch_is_a_tclang_error(monkeypatch):
    from backends.cuda import launches
    kernel = tclang.define(MM, backend="cuda").mm
    a = np.ones((13, 11), np.float32)  # shapes no other test runs: planned afresh
    # every launch asks for a block no GPU has
    monkeypatch.setattr(launches.LaunchEntry, "dims",
                        lambda self, sizes: ((1, 1, 1), (4096, 1, 1)))
    with pytest.raises(tclang.TCLaunchError, match=r"refused to launch \w+.*block \(4096"):
        kernel(a, a.T.copy())


def test_cubins_come_back_from_the_disk_cache(tmp_path):
    """A second process compiles nothing: its kernel comes from the disk, and the key has
    the device's compute capability and the CUDA version."""
    script = ("import numpy as np, tclang\n"
              f"k = tclang.define({MM!r}, backend='cuda').mm\n"
              "a = np.ones((5, 3), np.float32)\n"
              "c = k.compile(a, a.T.copy())\n"
              "assert np.allclose(c(a, a.T.copy()), 3.0)\n"
              "print(c.cache)\n")
    env = dict(os.environ, TCLANG_CACHE_DIR=str(tmp_path))
    runs = [subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                           text=True, cwd=os.path.dirname(os.path.dirname(os.path.dirname(
                               os.path.abspath(__file__))))) for _ in range(2)]
    for run in runs:
        assert run.returncode == 0, run.stderr
    assert [r.stdout.strip() for r in runs] == ["compiled", "disk"]
    from backends.cuda.backend import CudaBackend
    assert "sm_" in CudaBackend().target().arch and "cuda" in CudaBackend().target().arch


def test_cuda_out_tensors_get_their_version_bumped():
    """As on the CPU (tests/e2e/test_torch_interop.py): an out= tensor autograd saved makes
    its backward raise, on the checked path and on the hot path of a repeat call."""
    torch = pytest.importorskip("torch")
    kernel = tclang.define("def plus(float(N) X) -> (Y) { Y(i) = X(i) + 1.0 }",
                           backend="cuda").plus
    x = torch.randn(5, device="cuda", requires_grad=True)
    for _ in range(2):  # checked in full, then the hot path
        h = torch.tanh(x)
        kernel(x.detach(), out=h.detach())
        assert h._version == 1
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            h.sum().backward()


def test_autotune_on_the_gpu_in_spawned_workers(tmp_path):
    """tc.autotune(backend="cuda"): trials in a spawned worker per GPU (a forked child
    cannot use a CUDA context), timed with CUDA events on device arrays; the best options
    compute A @ B; options="tuned" finds them."""
    from backends.cuda.backend import _device
    from tclang.tuning import workers
    rng = np.random.default_rng(0)
    a, b = rng.random((256, 192), np.float32), rng.random((192, 320), np.float32)
    kernel = tclang.define(MM, backend="cuda").mm
    db = tmp_path / "t.sqlite"
    result = tclang.autotune(kernel, a, b, budget=6, min_time=0.02, progress=False,
                             database=db, time_limit=120)
    assert result.counts()["ok"] >= 6 and not result.counts()["wrong"], \
        [(t.status, t.message) for t in result.trials]
    assert 0 < result.best_seconds <= result.automatic_seconds
    from tclang.tuning import trials
    pool = workers.pool("cuda", trials._measure)
    cuda, _, _ = _device()
    assert pool.size == cuda.Device.count() and pool.workers[0].alive
    tuned = tclang.define(MM, backend="cuda", options=result.best).mm(a, b)
    np.testing.assert_allclose(tuned, a @ b, rtol=1e-4, atol=1e-4)
    os.environ["TCLANG_TUNING_DB"] = str(db)
    try:
        assert tclang.define(MM, backend="cuda", options="tuned").mm.compile(a, b).options \
            == result.best
    finally:
        del os.environ["TCLANG_TUNING_DB"]


def test_compare_on_the_gpu():
    rng = np.random.default_rng(1)
    a, b = rng.random((128, 64), np.float32), rng.random((64, 96), np.float32)
    kernel = tclang.define(MM, backend="cuda").mm
    result = tclang.compare(kernel, a, b, manual=["block=32x4,tile=16x64x16",
                                                  "shared_memory=off"],
                            tune=2, rounds=2, min_time=0.02, progress=False, limits=False)
    for row in result.rows:
        assert row.status == "ok" and row.seconds > 0, (row.label, row.status, row.message)
    labels = [r.label for r in result.rows]
    assert labels[:3] == ["automatic", "manual: block=32x4,tile=16x64x16",
                          "manual: shared_memory=off"]
    if importlib.util.find_spec("torch") is not None:
        import torch
        assert ("torch (cuda)" if torch.cuda.is_available() else "torch") in labels


def test_tclang_compare_backend_cuda(tmp_path):
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    done = subprocess.run(
        [sys.executable, "-m", "tclang.cli", "compare", os.path.join(root, "examples",
                                                                     "operators.tc"),
         "--entry", "matmul", "--sizes", "M=96,K=64,N=80", "--backend", "cuda",
         "--manual", "block=32x2", "--tune", "2", "--rounds", "2", "--peers", "numpy",
         "--database", str(tmp_path / "t.sqlite"), "--out", str(tmp_path)],
        capture_output=True, text=True, cwd=root, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "manual: block=32x2" in done.stdout and "tuned (2 trials)" in done.stdout
