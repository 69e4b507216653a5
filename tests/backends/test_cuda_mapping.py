"""How loops meet the GPU's threads, through the generated CUDA and its CPU emulation:
the innermost coincident members on the grid (x walking stride 1), enough blocks for
the machine, 256-thread blocks for one mapped member, a thread's rows jammed into one
reduction loop; each checked against NumPy on odd, prime and size-1 extents."""

from __future__ import annotations

import numpy as np
import pytest

import tclang as tc
from backends.cuda.emulation.build import available
from benchmarks import kernels as K

pytestmark = pytest.mark.skipif(not available(), reason="the emulation needs g++")
CUDA = "cuda-emulated"


def _conv(x, w):
    n, c, h, wd = x.shape
    m, _, kh, kw = w.shape
    out = np.zeros((n, m, h - kh + 1, wd - kw + 1), np.float64)
    for i in range(kh):
        for j in range(kw):
            out += np.einsum("nchw,mc->nmhw", x[:, :, i:i + h - kh + 1, j:j + wd - kw + 1],
                             w[:, :, i, j])
    return out


def test_four_parallel_dimensions_map_the_innermost_three():
    x = np.ones((2, 3, 9, 40), np.float32)
    w = np.ones((5, 3, 3, 3), np.float32)
    loops = tc.compile(K.CONV2D, "conv2d", x, w, backend=CUDA).loops
    # w (stride 1) on x, h on y, m on z; the batch n a loop in every thread
    assert "w=(32 * b0) + t0" in loops
    assert "n=c" in loops


@pytest.mark.parametrize("shape", [(1, 1, 3, 3), (2, 3, 9, 40), (3, 2, 7, 5)])
def test_conv2d_matches_numpy(shape):
    rng = np.random.default_rng(sum(shape))
    x = rng.standard_normal(shape).astype(np.float32)
    w = rng.standard_normal((5, shape[1], 3, 3)).astype(np.float32)
    got = tc.define(K.CONV2D, backend=CUDA).conv2d(x, w)
    np.testing.assert_allclose(got, _conv(x, w), rtol=1e-4, atol=1e-4)


# isl's mapping of a contraction, as the tile plan leaves it to integer ones (float32 and
# half ones are tile contractions: tests/e2e/test_tile_contractions.py)
INT_MATMUL = K.MATMUL.replace("float", "int32")


def test_a_small_grid_takes_smaller_tiles_on_y():
    a = np.ones((64, 64), np.int32)
    loops = tc.compile(INT_MATMUL, "matmul", a, a, backend=CUDA).loops
    assert "grid(2, 8)" in loops  # not 2x2 blocks of 32x32 points


def test_large_contractions_take_32x128_tiles():
    a = np.ones((2048, 64), np.int32)
    b = np.ones((64, 2048), np.int32)
    kernel = tc.compile(INT_MATMUL, "matmul", a, b, backend=CUDA)
    assert "B_shared[32][129]" in kernel.loops
    assert "16 points in registers across" in kernel.source


def test_one_mapped_member_runs_256_threads_a_block():
    x = np.ones(1000, np.float32)
    assert "block(256)" in tc.compile(K.CHAIN, "chain", x, x, backend=CUDA).loops


@pytest.mark.parametrize("tile", [(32, 32, 32), (32, 128, 32), (32, 128, 8)])
@pytest.mark.parametrize("m,k,n", [(64, 37, 256), (64, 3, 128), (37, 5, 33), (1, 3, 128),
                                   (96, 1, 128)])
def test_register_tiles_match_numpy(m, k, n, tile):
    """With 32x32 or 32x128 tiles (as large matrices get), each thread takes 4 rows (and 4
    columns) of a tile: full tiles run them jammed into one reduction loop, their
    accumulators in registers across the k tiles; partial tiles run plainly."""
    rng = np.random.default_rng(m * k * n)
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    kernel = tc.define(K.MATMUL, backend=CUDA, options=tc.Options(tile=tile)).matmul
    source = kernel.compile(a, b).source
    if m % 32 == 0 and k > 1:  # (one step of k is no loop)
        points = 16 if tile[1] == 128 else 4
        assert f"{points} points in registers across" in source or \
            f"{points} points jammed into one reduction loop" in source
    np.testing.assert_allclose(kernel(a, b), a @ b, rtol=1e-4, atol=1e-4)


def test_index_width_follows_the_largest_offset():
    """An output of 2^32 elements (inputs broadcast: nothing allocated to compile) needs
    64-bit index arithmetic; the same kernel on small shapes gets 32-bit."""
    def source(m, n):
        a = np.broadcast_to(np.ones(1, np.int32), (m, 16))
        b = np.broadcast_to(np.ones(1, np.int32), (16, n))
        return tc.compile(INT_MATMUL, "matmul", a, b, backend=CUDA).source

    big, small = source(65536, 65536), source(512, 512)
    assert "const long long i_" in big and "const int i_" not in big
    assert "const int i_" in small and "const long long i_" not in small
