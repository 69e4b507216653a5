"""The CPU emulation of CUDA's thread model (backends/cuda/emulation).

Hand-written CUDA kernels, compiled as C++ by g++ with tclang_cuda_emulation.h, called through
ctypes on NumPy arrays. KERNELS is plain CUDA (nvcc checks it when present); HOST holds the
extern "C" entries that run each kernel with tclang_emu::launch.
"""

from __future__ import annotations

import ctypes
import decimal
import math
import shutil
import subprocess
import time
import zlib

import numpy as np
import pytest

from backends import reference_math
from backends.cuda.emulation import build

pytestmark = pytest.mark.skipif(not build.available(), reason="no g++ on PATH")

# name, C type, call, reference builtin, arity
MATH = [
    ("rsqrtf", "float", "rsqrtf(a[i])", "rsqrt", 1),
    ("rcbrtf", "float", "rcbrtf(a[i])", "rcbrt", 1),
    ("sinpif", "float", "sinpif(a[i])", "sinpi", 1),
    ("cospif", "float", "cospif(a[i])", "cospi", 1),
    ("erfinvf", "float", "erfinvf(a[i])", "erfinv", 1),
    ("erfcinvf", "float", "erfcinvf(a[i])", "erfcinv", 1),
    ("erfcxf", "float", "erfcxf(a[i])", "erfcx", 1),
    ("normcdff", "float", "normcdff(a[i])", "normcdf", 1),
    ("normcdfinvf", "float", "normcdfinvf(a[i])", "normcdfinv", 1),
    ("cyl_bessel_i0f", "float", "cyl_bessel_i0f(a[i])", "cyl_bessel_i0", 1),
    ("cyl_bessel_i1f", "float", "cyl_bessel_i1f(a[i])", "cyl_bessel_i1", 1),
    ("exp10f", "float", "exp10f(a[i])", "exp10", 1),
    ("rhypotf", "float", "rhypotf(a[i], b[i])", "rhypot", 2),
    ("fdividef", "float", "fdividef(a[i], b[i])", "fdivide", 2),
    ("norm3df", "float", "norm3df(a[i], b[i], c[i])", "norm3d", 3),
    ("rnorm3df", "float", "rnorm3df(a[i], b[i], c[i])", "rnorm3d", 3),
    ("norm4df", "float", "norm4df(a[i], b[i], c[i], d[i])", "norm4d", 4),
    ("rnorm4df", "float", "rnorm4df(a[i], b[i], c[i], d[i])", "rnorm4d", 4),
    # CUDA's float overloads of the double names
    ("erfinv_overload", "float", "erfinv(a[i])", "erfinv", 1),
    ("normcdfinv_overload", "float", "normcdfinv(a[i])", "normcdfinv", 1),
    # double precision
    ("rsqrt", "double", "rsqrt(a[i])", "rsqrt", 1),
    ("sinpi", "double", "sinpi(a[i])", "sinpi", 1),
    ("cospi", "double", "cospi(a[i])", "cospi", 1),
    ("erfinv", "double", "erfinv(a[i])", "erfinv", 1),
    ("erfcinv", "double", "erfcinv(a[i])", "erfcinv", 1),
    ("erfcx", "double", "erfcx(a[i])", "erfcx", 1),
    ("normcdf", "double", "normcdf(a[i])", "normcdf", 1),
    ("normcdfinv", "double", "normcdfinv(a[i])", "normcdfinv", 1),
    ("cyl_bessel_i0", "double", "cyl_bessel_i0(a[i])", "cyl_bessel_i0", 1),
    ("cyl_bessel_i1", "double", "cyl_bessel_i1(a[i])", "cyl_bessel_i1", 1),
    ("norm3d", "double", "norm3d(a[i], b[i], c[i])", "norm3d", 3),
    ("rhypot", "double", "rhypot(a[i], b[i])", "rhypot", 2),
]

KERNELS = r"""
#include <cuda_fp16.h>

// 1, 2: each block reverses its chunk through shared memory.
extern "C" __global__ void reverse_sync(const float* in, float* out, int n) {
  __shared__ float buf[256];
  int t = threadIdx.x, base = blockIdx.x * blockDim.x, i = base + t;
  int r = blockDim.x - 1 - t;
  if (i < n) buf[t] = in[i];
  __syncthreads();
  if (i < n && base + r < n) out[i] = buf[r];
}
extern "C" __global__ void reverse_nosync(const float* in, float* out, int n) {
  __shared__ float buf[256];
  int t = threadIdx.x, base = blockIdx.x * blockDim.x, i = base + t;
  int r = blockDim.x - 1 - t;
  if (i < n) buf[t] = in[i];
  if (i < n && base + r < n) out[i] = buf[r];          // missing __syncthreads()
}

// 3: grid-stride accumulation, then a tree reduction in shared memory.
extern "C" __global__ void __launch_bounds__(256) block_sum(const float* __restrict__ in,
                                                            float* __restrict__ partial, int n) {
  __shared__ float s[256];
  int t = threadIdx.x;
  float acc = 0.0f;
  for (int i = blockIdx.x * blockDim.x + t; i < n; i += blockDim.x * gridDim.x) acc += in[i];
  s[t] = acc;
  __syncthreads();
#pragma unroll
  for (int stride = blockDim.x / 2; stride > 0; stride >>= 1) {
    if (t < stride) s[t] += s[t + stride];
    __syncthreads();
  }
  if (t == 0) partial[blockIdx.x] = s[0];
}

// 4: atomics from every thread of every block.
extern "C" __global__ void atomics(const int* vals, int n, int* count,
                                   unsigned long long* total, float* fsum, double* dsum,
                                   int* imin, int* imax, unsigned* umax, unsigned* claim,
                                   int* winners, int* last) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  atomicAdd(count, 1);
  atomicAdd(total, (unsigned long long)vals[i]);
  atomicAdd(fsum, 1.0f);
  atomicAdd(dsum, 0.5);
  atomicMin(imin, -vals[i]);
  atomicMax(imax, vals[i]);
  atomicMax(umax, (unsigned)vals[i] * 3u);
  if (atomicCAS(&claim[i % 64], 0u, (unsigned)i + 1u) == 0u) atomicAdd(winners, 1);
  atomicExch(last, i);
}

// Blocks 0 and 1 each raise a flag and wait for the other's: that succeeds only when they
// run at the same time, and their __shared__ variables must stay distinct meanwhile.
extern "C" __global__ void rendezvous(int* flags, int* ok, long long spins) {
  __shared__ int mine;
  if (threadIdx.x == 0) mine = blockIdx.x;
  __syncthreads();
  if (threadIdx.x == 0) {
    atomicExch(&flags[blockIdx.x], 1);
    long long k = 0;
    while (atomicAdd(&flags[1 - blockIdx.x], 0) == 0 && k < spins) ++k;
    ok[3 * blockIdx.x] = k < spins;
  }
  __syncthreads();
  if (threadIdx.x == 0) ok[3 * blockIdx.x + 1] = mine;
  if (threadIdx.x == 0) ok[3 * blockIdx.x + 2] = flags[1 - blockIdx.x];
}

// 5, 9: every thread writes its ids.
extern "C" __global__ void ids(int* out) {
  unsigned b = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  unsigned t = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  int* o = out + 12 * (b * blockDim.x * blockDim.y * blockDim.z + t);
  o[0] = blockIdx.x; o[1] = blockIdx.y; o[2] = blockIdx.z;
  o[3] = threadIdx.x; o[4] = threadIdx.y; o[5] = threadIdx.z;
  o[6] = blockDim.x; o[7] = blockDim.y; o[8] = blockDim.z;
  o[9] = gridDim.x; o[10] = gridDim.y; o[11] = gridDim.z;
}

// 6: half conversions.
extern "C" __global__ void f2h(const float* in, __half* out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = __float2half_rn(in[i]);
}
extern "C" __global__ void d2h(const double* in, __half* out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = __double2half(in[i]);
}
extern "C" __global__ void h2f(const __half* in, float* out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = __half2float(in[i]);
}

// Intrinsics: saturating conversions and bit casts.
extern "C" __global__ void conversions(const float* x, int* rz, long long* llrz, float* sat,
                                       int* bits, float* back, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  rz[i] = __float2int_rz(x[i]);
  llrz[i] = __float2ll_rz(x[i]);
  sat[i] = __saturatef(x[i]);
  bits[i] = __float_as_int(x[i]);
  back[i] = __int_as_float(bits[i]) * __expf(0.0f) + __logf(1.0f) + __fdividef(0.0f, 3.0f);
}

// Warp shuffles, votes and __syncthreads_count.
extern "C" __global__ void warp_ops(const float* in, float* warp_sums, unsigned* ballots,
                                    int* counts, float* broadcast, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  float v = i < n ? in[i] : 0.0f;
  float first = __shfl_sync(0xffffffffu, v, 0);
  for (int off = 16; off > 0; off >>= 1) v += __shfl_down_sync(0xffffffffu, v, off);
  unsigned b = __ballot_sync(0xffffffffu, i < n && in[i] > 0.0f);
  int c = __syncthreads_count(i < n && in[i] > 0.0f);
  if ((threadIdx.x & 31) == 0) { warp_sums[i / 32] = v; ballots[i / 32] = b; }
  if (threadIdx.x == 0) counts[blockIdx.x] = c;
  if (i < n) broadcast[i] = first;
}

// Errors.
extern "C" __global__ void trapper(int* out) {
  if (blockIdx.x == 3 && threadIdx.x == 5) __trap();
  out[blockIdx.x * blockDim.x + threadIdx.x] = 1;
}
extern "C" __global__ void divergent(int* out) {
  if (threadIdx.x < 16) __syncwarp(); else __syncthreads();
  out[threadIdx.x] = 1;
}
extern "C" __global__ void two_sites(int* out) {
  if (threadIdx.x < 16) { out[threadIdx.x] = 1; __syncthreads(); }
  else { out[threadIdx.x] = 2; __syncthreads(); }
}

// A thread with a large stack frame.
extern "C" __global__ void big_stack(int* out) {
  volatile char big[96 * 1024];
  for (int i = 0; i < (int)sizeof(big); i += 4096) big[i] = (char)(i >> 12);
  out[threadIdx.x] = big[4096 * 3] + (int)threadIdx.x;
}

// Overhead: two barriers per thread.
extern "C" __global__ void two_barriers(float* data) {
  __shared__ float s[256];
  int t = threadIdx.x, i = blockIdx.x * blockDim.x + t;
  s[t] = data[i];
  __syncthreads();
  float v = s[(t + 1) % blockDim.x];
  __syncthreads();
  s[t] = v * 2.0f;
  data[i] = s[t];
}
""" + "\n".join(
    f'extern "C" __global__ void k_{name}(const {ty}* a, const {ty}* b, const {ty}* c, '
    f'const {ty}* d, {ty}* y, int n) {{\n'
    f"  int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
    f"  if (i < n) y[i] = {call};\n}}"
    for name, ty, call, _, _ in MATH)

HOST = r"""
#define L1(g, b, call) return tclang_emu::launch(dim3(g), dim3(b), [&] { call; });
extern "C" int run_reverse_sync(const float* in, float* out, int n, int bs) {
  L1((n + bs - 1) / bs, bs, reverse_sync(in, out, n)) }
extern "C" int run_reverse_nosync(const float* in, float* out, int n, int bs) {
  L1((n + bs - 1) / bs, bs, reverse_nosync(in, out, n)) }
extern "C" int run_block_sum(const float* in, float* partial, int n, int blocks) {
  L1(blocks, 256, block_sum(in, partial, n)) }
extern "C" int run_atomics(const int* vals, int n, int* count, unsigned long long* total,
                           float* fsum, double* dsum, int* imin, int* imax, unsigned* umax,
                           unsigned* claim, int* winners, int* last) {
  L1((n + 127) / 128, 128,
     atomics(vals, n, count, total, fsum, dsum, imin, imax, umax, claim, winners, last)) }
extern "C" int run_rendezvous(int* flags, int* ok, long long spins) {
  L1(2, 32, rendezvous(flags, ok, spins)) }
extern "C" int run_ids(int* out, int gx, int gy, int gz, int bx, int by, int bz) {
  return tclang_emu::launch(dim3(gx, gy, gz), dim3(bx, by, bz), [&] { ids(out); }); }
extern "C" int run_f2h(const float* in, __half* out, int n) { L1((n + 255) / 256, 256, f2h(in, out, n)) }
extern "C" int run_d2h(const double* in, __half* out, int n) { L1((n + 255) / 256, 256, d2h(in, out, n)) }
extern "C" int run_h2f(const __half* in, float* out, int n) { L1((n + 255) / 256, 256, h2f(in, out, n)) }
extern "C" int run_conversions(const float* x, int* rz, long long* llrz, float* sat, int* bits,
                               float* back, int n) {
  L1((n + 127) / 128, 128, conversions(x, rz, llrz, sat, bits, back, n)) }
extern "C" int run_warp_ops(const float* in, float* ws, unsigned* ballots, int* counts,
                            float* broadcast, int n) {
  L1((n + 127) / 128, 128, warp_ops(in, ws, ballots, counts, broadcast, n)) }
extern "C" int run_trapper(int* out) { L1(8, 32, trapper(out)) }
extern "C" int run_divergent(int* out) { L1(1, 32, divergent(out)) }
extern "C" int run_two_sites(int* out) { L1(1, 32, two_sites(out)) }
extern "C" int run_big_stack(int* out) { L1(2, 4, big_stack(out)) }
extern "C" int run_two_barriers(float* data, int blocks) { L1(blocks, 256, two_barriers(data)) }
extern "C" int worker_of_calling_thread() { return tclang_emu::worker_id(); }
""" + "\n".join(
    f'extern "C" int run_{name}(const {ty}* a, const {ty}* b, const {ty}* c, const {ty}* d, '
    f"{ty}* y, int n) {{ L1((n + 127) / 128, 128, k_{name}(a, b, c, d, y, n)) }}"
    for name, ty, _, _, _ in MATH)


def ptr(a: np.ndarray) -> ctypes.c_void_p:
    return ctypes.c_void_p(a.ctypes.data)


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("emulation-cache")


@pytest.fixture(scope="module")
def lib(cache):
    return build.compile_emulated(KERNELS + HOST, cache_dir=cache)


def test_reverse_with_barrier(lib):
    n, bs = 1024, 256
    x = np.arange(1, n + 1, dtype=np.float32)
    out = np.zeros_like(x)
    assert lib.run_reverse_sync(ptr(x), ptr(out), n, bs) == 0
    assert np.array_equal(out, x.reshape(-1, bs)[:, ::-1].ravel())
    assert build.last_error(lib) == ""


def test_missing_barrier_gives_wrong_result(lib):
    n, bs = 1024, 256
    x = np.random.default_rng(1).uniform(1, 2, n).astype(np.float32)
    out = np.zeros_like(x)
    assert lib.run_reverse_nosync(ptr(x), ptr(out), n, bs) == 0
    expected = x.reshape(-1, bs)[:, ::-1].ravel()
    assert not np.array_equal(out, expected)
    # Deterministic: threads run in order, so the first half of each block reads partners
    # that have not written yet, the second half reads partners that have.
    got, want = out.reshape(-1, bs), expected.reshape(-1, bs)
    assert np.array_equal(got[:, bs // 2:], want[:, bs // 2:])
    assert np.all(got[:, :bs // 2] != want[:, :bs // 2])


def test_tree_reduction(lib):
    x = np.random.default_rng(2).standard_normal(1000).astype(np.float32)
    partial = np.zeros(1, np.float32)
    assert lib.run_block_sum(ptr(x), ptr(partial), 1000, 1) == 0
    np.testing.assert_allclose(partial[0], x.astype(np.float64).sum(), rtol=1e-5, atol=1e-4)
    y = np.random.default_rng(3).uniform(0, 1, 100_000).astype(np.float32)
    partial = np.zeros(37, np.float32)
    assert lib.run_block_sum(ptr(y), ptr(partial), y.size, 37) == 0
    np.testing.assert_allclose(partial.astype(np.float64).sum(), y.astype(np.float64).sum(),
                               rtol=1e-5)


def test_atomics_across_os_threads(lib, monkeypatch):
    monkeypatch.setenv("TCLANG_EMULATION_THREADS", "2")
    n = 512 * 128
    vals = np.random.default_rng(4).integers(0, 1 << 20, n).astype(np.int32)
    count, winners, last = (np.zeros(1, np.int32) for _ in range(3))
    total = np.zeros(1, np.uint64)
    fsum = np.zeros(1, np.float32)
    dsum = np.zeros(1, np.float64)
    imin = np.full(1, np.iinfo(np.int32).max, np.int32)
    imax = np.full(1, -1, np.int32)
    umax = np.zeros(1, np.uint32)
    claim = np.zeros(64, np.uint32)
    rc = lib.run_atomics(ptr(vals), n, ptr(count), ptr(total), ptr(fsum), ptr(dsum), ptr(imin),
                         ptr(imax), ptr(umax), ptr(claim), ptr(winners), ptr(last))
    assert rc == 0
    assert count[0] == n
    assert total[0] == int(vals.astype(np.int64).sum())
    assert fsum[0] == n and dsum[0] == n / 2
    assert imin[0] == -vals.max() and imax[0] == vals.max()
    assert umax[0] == (vals.astype(np.uint32) * np.uint32(3)).max()
    assert winners[0] == 64
    assert np.all(claim > 0) and np.all((claim - 1) % 64 == np.arange(64))
    assert 0 <= last[0] < n


def test_blocks_run_concurrently_with_distinct_shared_memory(lib, monkeypatch):
    monkeypatch.setenv("TCLANG_EMULATION_THREADS", "2")
    flags = np.zeros(2, np.int32)
    ok = np.full(6, -1, np.int32)
    assert lib.run_rendezvous(ptr(flags), ptr(ok), ctypes.c_longlong(300_000_000)) == 0
    assert ok.tolist() == [1, 0, 1, 1, 1, 1]   # met; block 0 saw 0, block 1 saw 1


def _expected_ids(grid, block):
    gx, gy, gz = grid
    bx, by, bz = block
    rows = []
    for b in range(gx * gy * gz):
        bid = (b % gx, b // gx % gy, b // (gx * gy))
        for t in range(bx * by * bz):
            tid = (t % bx, t // bx % by, t // (bx * by))
            rows.append(bid + tid + tuple(block) + tuple(grid))
    return np.array(rows, np.int32)


@pytest.mark.parametrize("grid, block", [((3, 2, 2), (4, 3, 2)), ((5, 3, 1), (7, 5, 1)),
                                         ((2, 1, 1), (32, 32, 1)), ((1, 1, 3), (2, 2, 64))])
def test_ids_in_2d_and_3d_launches(lib, grid, block):
    rows = int(np.prod(grid)) * int(np.prod(block))
    out = np.full((rows, 12), -1, np.int32)
    assert lib.run_ids(ptr(out), *grid, *block) == 0
    assert np.array_equal(out, _expected_ids(grid, block))


@pytest.mark.parametrize("block", [(2048, 1, 1), (64, 32, 1), (1, 1, 65), (0, 1, 1)])
def test_invalid_block_is_reported(lib, block):
    out = np.zeros(12 * 4096, np.int32)
    rc = lib.run_ids(ptr(out), 1, 1, 1, *block)
    assert rc == build.ERR_INVALID_CONFIG
    message = build.last_error(lib)
    assert "invalid launch configuration" in message and "1024" in message
    with pytest.raises(build.EmulationLaunchError, match="at most 1024"):
        build.check_launch(lib, rc)
    assert not out.any()
    assert lib.run_ids(ptr(out), 1, 1, 1, 1024, 1, 1) == 0    # the next launch is fine
    assert build.last_error(lib) == ""


def test_half_conversions_match_numpy(lib):
    rng = np.random.default_rng(5)
    edges = np.array([0.0, -0.0, 1.0, -1.0, 65504.0, -65504.0, 65519.996, 65520.0, 65536.0,
                      1e10, -1e10, np.inf, -np.inf, np.nan, -np.nan, 6.1035156e-05,
                      6.0975552e-05, 5.9604645e-08, 2.9802322e-08, 2.9802326e-08,
                      8.940697e-08, 1.0e-45, -1.0e-45, 3.4028235e38, 0.1, 1.0 / 3.0],
                     np.float32)
    all_halves = np.arange(1 << 16, dtype=np.uint16).view(np.float16)
    finite = all_halves[np.isfinite(all_halves)].astype(np.float64)
    finite.sort()
    mids = ((finite[1:] + finite[:-1]) / 2).astype(np.float32)       # exact ties
    near = np.concatenate([np.nextafter(mids, np.float32(np.inf)),
                           np.nextafter(mids, np.float32(-np.inf))])
    random_bits = rng.integers(0, 1 << 32, 400_000, dtype=np.uint64).astype(np.uint32)
    x = np.concatenate([edges, mids, near, random_bits.view(np.float32),
                        rng.uniform(-70000, 70000, 20_000).astype(np.float32),
                        all_halves.astype(np.float32)])
    out = np.zeros(x.size, np.float16)
    assert lib.run_f2h(ptr(x), ptr(out), x.size) == 0
    with np.errstate(all="ignore"):
        want = x.astype(np.float16)
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(out), nan)
    assert np.array_equal(out[~nan].view(np.uint16), want[~nan].view(np.uint16))

    # double -> half rounds once (no double rounding through float)
    with np.errstate(all="ignore"):                  # x holds signalling NaNs
        xd = np.concatenate([x.astype(np.float64), (finite[1:] + finite[:-1]) / 2 + 1e-12,
                             (finite[1:] + finite[:-1]) / 2, rng.uniform(-1e-4, 1e-4, 10_000)])
    outd = np.zeros(xd.size, np.float16)
    assert lib.run_d2h(ptr(xd), ptr(outd), xd.size) == 0
    with np.errstate(all="ignore"):
        wantd = xd.astype(np.float16)
    nan = np.isnan(wantd)
    assert np.array_equal(np.isnan(outd), nan)
    assert np.array_equal(outd[~nan].view(np.uint16), wantd[~nan].view(np.uint16))

    # half -> float is exact, and every half survives the round trip
    back = np.zeros(all_halves.size, np.float32)
    assert lib.run_h2f(ptr(all_halves), ptr(back), all_halves.size) == 0
    ref = all_halves.astype(np.float32)
    assert np.array_equal(np.isnan(back), np.isnan(ref))
    ok = ~np.isnan(ref)
    assert np.array_equal(back[ok].view(np.uint32), ref[ok].view(np.uint32))
    again = np.zeros(all_halves.size, np.float16)
    assert lib.run_f2h(ptr(back), ptr(again), back.size) == 0
    assert np.array_equal(again[ok].view(np.uint16), all_halves[ok].view(np.uint16))
    assert np.all(np.isnan(again[~ok]))


def test_conversion_intrinsics(lib):
    x = np.array([0.0, -0.0, 1.9, -1.9, 2.5e9, -2.5e9, 2147483520.0, -2147483648.0, np.inf,
                  -np.inf, np.nan, 1e19, -1e19, 0.5, 1.5, -0.25], np.float32)
    n = x.size
    rz, bits = np.zeros(n, np.int32), np.zeros(n, np.int32)
    llrz = np.zeros(n, np.int64)
    sat, back = np.zeros(n, np.float32), np.zeros(n, np.float32)
    assert lib.run_conversions(ptr(x), ptr(rz), ptr(llrz), ptr(sat), ptr(bits), ptr(back), n) == 0
    imax, imin = np.iinfo(np.int32).max, np.iinfo(np.int32).min
    assert rz.tolist() == [0, 0, 1, -1, imax, imin, 2147483520, imin, imax, imin, 0, imax, imin,
                           0, 1, 0]
    lmax, lmin = np.iinfo(np.int64).max, np.iinfo(np.int64).min
    assert llrz.tolist()[:10] == [0, 0, 1, -1, 2500000000, -2500000000, 2147483520,
                                  -2147483648, lmax, lmin]
    assert llrz.tolist()[11:] == [lmax, lmin, 0, 1, 0]
    assert sat.tolist() == [0, 0, 1, 0, 1, 0, 1, 0, 1, 0, 0, 1, 0, 0.5, 1, 0]
    assert np.array_equal(bits, x.view(np.int32))
    assert np.array_equal(np.isnan(back), np.isnan(x))
    fin = np.isfinite(x)
    assert np.array_equal(back[fin], x[fin])


def test_warp_operations(lib):
    n = 1000
    x = np.random.default_rng(6).standard_normal(n).astype(np.float32)
    nw = (n + 127) // 128 * 4
    sums, broadcast = np.zeros(nw, np.float32), np.zeros(n, np.float32)
    ballots, counts = np.zeros(nw, np.uint32), np.zeros(nw // 4, np.int32)
    assert lib.run_warp_ops(ptr(x), ptr(sums), ptr(ballots), ptr(counts), ptr(broadcast), n) == 0
    padded = np.zeros(nw * 32, np.float32)
    padded[:n] = x
    warps = padded.reshape(nw, 32)
    np.testing.assert_allclose(sums, warps.astype(np.float64).sum(axis=1), rtol=1e-5, atol=1e-5)
    want_ballots = ((warps > 0) * (1 << np.arange(32, dtype=np.uint64))).sum(axis=1)
    assert np.array_equal(ballots, want_ballots.astype(np.uint32))
    assert np.array_equal(counts, (padded.reshape(-1, 128) > 0).sum(axis=1))
    assert np.array_equal(broadcast, np.repeat(warps[:, 0], 32)[:n])


@pytest.mark.parametrize("name, ty, call, ref, arity", MATH, ids=[m[0] for m in MATH])
def test_math_matches_reference(lib, name, ty, call, ref, arity):
    dtype = np.dtype(np.float32 if ty == "float" else np.float64)
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    domain = {
        "rsqrt": (1e-6, 1e6), "rcbrt": (-1e4, 1e4), "sinpi": (-40, 40), "cospi": (-40, 40),
        "erfinv": (-1, 1), "erfcinv": (0, 2), "erfcx": (-8, 300), "normcdf": (-30, 10),
        "normcdfinv": (0, 1), "cyl_bessel_i0": (-90, 90), "cyl_bessel_i1": (-90, 90),
        "exp10": (-30, 30), "rhypot": (-1e3, 1e3), "fdivide": (-1e3, 1e3),
        "norm3d": (-1e3, 1e3), "rnorm3d": (-1e3, 1e3), "norm4d": (-1e3, 1e3),
        "rnorm4d": (-1e3, 1e3)}[ref]
    count = 300
    args = [rng.uniform(*domain, count).astype(dtype) for _ in range(4)]
    special = {
        "sinpi": [0, -0.0, 0.5, 1, -1, 1.5, 2, -2.5, 1e7 + 0.5, 0.25, 0.75, 1e-30],
        "cospi": [0, 0.5, 1, -1, 1.5, 2, -2.5, 1e7 + 0.5, 0.25, 0.75, 1e-30],
        "erfinv": [0, -0.0, 0.5, -0.5, 0.9999, -0.99999, 1e-30, 0.99999994, 1, -1],
        "erfcinv": [1, 0.5, 1.5, 1e-10, 1e-30, 1e-38, 1.9999999, 2, 0],
        "normcdfinv": [0.5, 1e-10, 1e-30, 1e-38, 0.9999999, 0, 1, 0.3],
        "erfcx": [0, -1, 1, 25, 26, 27, 1e4, 1e10],
        "cyl_bessel_i0": [0, 1e-20, 29.9, 30, 30.1, -45],
        "cyl_bessel_i1": [0, -0.0, 1e-20, 29.9, 30, 30.1, -45],
        "normcdf": [0, -38, 5, -5],
    }.get(ref, [])
    if ty == "double" and ref == "erfcinv":
        special += [1e-300]
    if special:
        args[0][:len(special)] = np.array(special, dtype)
    if ref == "rsqrt":
        args[0] = np.abs(args[0])
    y = np.zeros(count, dtype)
    assert getattr(lib, f"run_{name}")(*(ptr(a) for a in args), ptr(y), count) == 0
    want = np.array([reference_math.call(ref, tuple(a[k] for a in args[:arity]), dtype)
                     for k in range(count)], dtype)
    assert np.array_equal(np.isnan(y), np.isnan(want)), name
    ok = ~np.isnan(want)
    got, exp = y[ok].astype(np.float64), want[ok].astype(np.float64)
    inf = np.isinf(exp)
    assert np.array_equal(got[inf], exp[inf]), name
    got, exp = got[~inf], exp[~inf]
    ulp = np.spacing(np.abs(exp).astype(dtype)).astype(np.float64)
    tiny = np.finfo(dtype).tiny
    if ref.startswith("cyl_bessel"):
        bound = np.maximum(1e-5 * np.abs(exp), tiny)
    elif ty == "double" and ref in ("sinpi", "cospi"):
        bound = 4 * ulp + 1e-15     # the float64 reference computes sin(pi * (x mod 2))
    elif ty == "double" and ref in ("erfcx", "normcdf", "erfinv", "erfcinv", "normcdfinv"):
        # the float64 reference rounds x*x (erfcx), sums 4 asymptotic terms (erfcx >= 25),
        # and runs Newton on erf near 1 (erfinv): it is good to ~1e-10 there; the tests below
        # check these, and sinpi/cospi, to a few ulp against better oracles
        bound = np.maximum(1e-9 * np.abs(exp), 4 * ulp)
    else:
        bound = 4 * ulp
    bad = np.abs(got - exp) > bound
    assert not bad.any(), (name, args[0][ok][~inf][bad][:5], got[bad][:5], exp[bad][:5])


def test_double_inverses_round_trip(lib):
    """erfc(erfcinv(y)) == y and erf(erfinv(y)) == y to within the conditioning of erfc."""
    y = np.concatenate([10.0 ** -np.linspace(0, 307, 400), [5e-324, 1e-310, 0.3, 0.9, 1.5]])
    zero = np.zeros_like(y)
    x = np.zeros_like(y)
    assert lib.run_erfcinv(ptr(y), ptr(zero), ptr(zero), ptr(zero), ptr(x), y.size) == 0
    for yi, xi in zip(y, x):
        if yi < 2.3e-308:                       # subnormal: erfc(x) itself is imprecise
            assert 26.5 < xi < 27.3
            continue
        cond = max(1.0, 2.0 * xi * xi)          # relative sensitivity of erfc at xi
        assert abs(math.erfc(xi) / yi - 1) < 8e-16 * cond, (yi, xi)
    t = np.linspace(-0.999999, 0.999999, 301)
    x = np.zeros_like(t)
    assert lib.run_erfinv(ptr(t), ptr(zero), ptr(zero), ptr(zero), ptr(x), t.size) == 0
    for ti, xi in zip(t, x):
        assert abs(math.erf(xi) - ti) <= 4e-16 + 4e-16 * abs(xi) * math.exp(-xi * xi), (ti, xi)
        assert abs(math.erfc(abs(xi)) / (1 - abs(ti)) - 1) < 1e-15 * max(1.0, 2 * xi * xi)


def _sincospi_decimal(x: float) -> tuple[float, float]:
    decimal.getcontext().prec = 60
    pi = decimal.Decimal("3.14159265358979323846264338327950288419716939937510582097494")
    t = pi * (decimal.Decimal(x) % 2)
    s, c, term, k = decimal.Decimal(0), decimal.Decimal(0), decimal.Decimal(1), 0
    while k < 200:
        if k % 4 == 0:
            c += term
        elif k % 4 == 1:
            s += term
        elif k % 4 == 2:
            c -= term
        else:
            s -= term
        k += 1
        term = term * t / k
    return float(s), float(c)


def test_double_sinpi_cospi_to_an_ulp(lib):
    rng = np.random.default_rng(7)
    x = np.concatenate([rng.uniform(-50, 50, 150), rng.uniform(-1e6, 1e6, 50),
                        np.arange(-4, 4.25, 0.25), [1e-300, 0.5 + 2 ** -40, 2.0 ** 52 + 1]])
    zero = np.zeros_like(x)
    s, c = np.zeros_like(x), np.zeros_like(x)
    assert lib.run_sinpi(ptr(x), ptr(zero), ptr(zero), ptr(zero), ptr(s), x.size) == 0
    assert lib.run_cospi(ptr(x), ptr(zero), ptr(zero), ptr(zero), ptr(c), x.size) == 0
    for xi, si, ci in zip(x, s, c):
        want_s, want_c = _sincospi_decimal(float(xi))
        if xi == np.round(xi):
            want_s = math.copysign(0.0, xi)
        if (2 * xi) % 2 == 1:                      # half an odd integer (2 * xi is exact)
            want_c = 0.0
        for got, want in ((si, want_s), (ci, want_c)):
            if want == 0:
                assert got == 0 and math.copysign(1, got) == math.copysign(1, want), (xi, got)
            else:
                assert abs(got - want) <= 2 * np.spacing(abs(want)), (xi, got, want)


def test_compile_error_raises_with_compiler_message(cache):
    source = 'extern "C" __global__ void broken(float* x) { x[0] = undefined_thing; }\n'
    with pytest.raises(build.EmulationBuildError) as info:
        build.compile_emulated(source, cache_dir=cache)
    text = str(info.value)
    assert "undefined_thing" in text and "error" in text
    assert len(text.splitlines()) <= build.ERROR_LINES + 3


def test_cache_hits_and_flags(cache, lib):
    # the same source is the same object; a different flag is a different build
    assert build.compile_emulated(KERNELS + HOST, cache_dir=cache) is lib
    small = 'extern "C" int twice(int x) { return min(2 * x, 100); }\n'
    a = build.compile_emulated(small, cache_dir=cache)
    b = build.compile_emulated(small, cache_dir=cache, extra_flags=["-O0"])
    assert a is not b and a.twice(7) == 14 and b.twice(70) == 100
    # sources are kept for messages; libraries never lie in cache_dir (no store: built per
    # process, loaded from a private copy)
    assert len(list(cache.glob("*.cu"))) >= 3 and not list(cache.glob("*.so"))
    assert not list(cache.glob("*.tmp"))


OVERLOADS = r"""
#include <type_traits>
#define SAME(e, T) static_assert(std::is_same<decltype(e), T>::value, #e);
__device__ __forceinline__ float helper(float x) { return x; }
extern "C" __global__ void overloads(float* f, double* d, int* i, unsigned* u) {
  float x = f[0]; double y = d[0];
  SAME(expf(x), float) SAME(exp(x), float) SAME(exp(y), double) SAME(fminf(x, x), float)
  SAME(fmaxf(x, x), float) SAME(min(1, 2), int) SAME(max(1u, 2), unsigned)
  SAME(min(x, x), float) SAME(max(y, y), double) SAME(max(x, y), double)
  SAME(min(1LL, 2ULL), unsigned long long) SAME(abs(x), float) SAME(fabs(x), float)
  SAME(rsqrt(x), float) SAME(rsqrt(y), double) SAME(sinpi(x), float) SAME(erfinv(y), double)
  SAME(erfcx(x), float) SAME(cyl_bessel_i0(x), float) SAME(exp10(x), float)
  SAME(exp10(y), double) SAME(lgammaf(x), float) SAME(j0f(x), float) SAME(erff(x), float)
  SAME(__float2ll_rz(x), long long) SAME(__saturatef(x), float) SAME(helper(x), float)
  SAME(threadIdx.x, unsigned int) SAME(warpSize, const int)
  f[1] = expf(x) + erff(x) + lgammaf(x) + j0f(x) + normcdff(x) + sinpif(x) + cospif(x);
  d[1] = exp(y) + rsqrt(y) + sinpi(y) + fdivide(y, 2.0) + rhypot(y, y) + norm4d(y, y, y, y);
  i[0] = min(i[1], i[2]) + max(i[1], i[2]);
  u[0] = umin(u[1], u[2]) + __popc(u[1]) + __brev(u[2]);
}
"""


def test_overloads_resolve_as_in_cuda(cache):
    build.compile_emulated(OVERLOADS, cache_dir=cache)


def test_errors_trap_deadlock_divergent_barrier(lib, monkeypatch):
    out = np.zeros(8 * 32, np.int32)
    rc = lib.run_trapper(ptr(out))
    assert rc == build.ERR_TRAP
    assert "(5,0,0) of block (3,0,0)" in build.last_error(lib)

    out = np.zeros(32, np.int32)
    assert lib.run_divergent(ptr(out)) == build.ERR_DEADLOCK
    assert "deadlock" in build.last_error(lib)

    # threads at two different __syncthreads() calls: released together (as bar.sync 0 on
    # the hardware) unless TCLANG_EMULATION_CHECK_BARRIERS asks for an error
    assert lib.run_two_sites(ptr(out)) == 0
    assert out.tolist() == [1] * 16 + [2] * 16
    monkeypatch.setenv("TCLANG_EMULATION_CHECK_BARRIERS", "1")
    assert lib.run_two_sites(ptr(out)) == build.ERR_DIVERGENT_BARRIER
    assert "different __syncthreads()" in build.last_error(lib)
    assert lib.worker_of_calling_thread() == -1


def test_fiber_stack_size(lib, monkeypatch):
    out = np.zeros(4, np.int32)
    monkeypatch.setenv("TCLANG_EMULATION_STACK_SIZE", "256k")   # 96 KiB frames need more
    assert lib.run_big_stack(ptr(out)) == 0                     # than the 64 KiB default
    assert out.tolist() == [3, 4, 5, 6]
    monkeypatch.setenv("TCLANG_EMULATION_STACK_SIZE", str(1 << 50))   # 1 PiB per fiber
    assert lib.run_big_stack(ptr(out)) == build.ERR_OUT_OF_MEMORY
    assert "cannot allocate 4 fiber stacks" in build.last_error(lib)


@pytest.mark.parametrize("name,value", [
    ("TCLANG_EMULATION_THREADS", "two"), ("TCLANG_EMULATION_THREADS", "-3"),
    ("TCLANG_EMULATION_THREADS", "4k"), ("TCLANG_EMULATION_STACK_SIZE", "64q"),
    ("TCLANG_EMULATION_STACK_SIZE", "0"), ("TCLANG_EMULATION_STACK_SIZE", "9" * 25 + "m"),
    ("TCLANG_EMULATION_CHECK_BARRIERS", "maybe")])
def test_a_bad_emulation_variable_fails_the_launch(lib, monkeypatch, name, value):
    """Such values were read as the default or as 0 (THREADS=two: every core; STACK_SIZE=64q:
    64 bytes, then the 16 KiB floor; CHECK_BARRIERS=maybe: on): now the launch says which."""
    out = np.zeros(32, np.int32)
    monkeypatch.setenv(name, value)
    assert lib.run_two_sites(ptr(out)) == build.ERR_ENVIRONMENT
    assert name in build.last_error(lib) and repr(value)[1:-1][:20] in build.last_error(lib)


def test_emulation_switches_take_the_usual_words(lib, monkeypatch):
    out = np.zeros(32, np.int32)
    for word, code in (("YES", build.ERR_DIVERGENT_BARRIER), ("off", 0), ("", 0)):
        monkeypatch.setenv("TCLANG_EMULATION_CHECK_BARRIERS", word)
        assert lib.run_two_sites(ptr(out)) == code, word


def test_launch_overhead(lib):
    blocks = 256
    data = np.arange(blocks * 256, dtype=np.float32)
    assert lib.run_two_barriers(ptr(data), blocks) == 0          # warm-up
    start = time.perf_counter()
    assert lib.run_two_barriers(ptr(data), blocks) == 0
    elapsed = time.perf_counter() - start
    rolled = np.arange(blocks * 256, dtype=np.float32).reshape(blocks, 256)
    for _ in range(2):
        rolled = np.roll(rolled, -1, axis=1) * 2
    assert np.array_equal(data, rolled.ravel())
    assert elapsed < 5.0, f"256 blocks x 256 threads with 2 barriers took {elapsed:.3f} s"


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
def test_kernels_are_valid_cuda(tmp_path):
    """The test kernels, without the emulation header, compile with nvcc for sm_80."""
    src = tmp_path / "kernels.cu"
    src.write_text(KERNELS + OVERLOADS)
    proc = subprocess.run(["nvcc", "-arch=sm_80", "-ptx", str(src), "-o",
                           str(tmp_path / "kernels.ptx")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-4000:]
    ptx = (tmp_path / "kernels.ptx").read_text()
    assert "bar.sync" in ptx and ".entry reverse_sync" in ptx
