"""The shared end-to-end corpus: tclang programs with NumPy references.

Every backend's end-to-end test runs these programs on each of their shapes and compares
with the reference. A `Case` is one program (one or more defs, `entry` is the one called),
several size assignments, an input generator and a NumPy reference.

Rules every case follows (tests/e2e/test_reference.py checks them):
- at least three shapes; across a case's shapes at least one extent is 1 and one is a prime
  (7, 11 or 13) wherever the program allows it;
- shapes are tiny: the reference backend is a Python interpreter, and shape-generic code
  runs whole reduction tiles;
- inputs have exactly the declared dtypes and keep results well conditioned (positive values
  under log/sqrt/rsqrt, gather indices in range, no integer overflow unless the case is
  about wraparound);
- references return the exact output dtypes (float32 results are computed in float64 and
  rounded once).

bfloat16 cases (tag "bfloat16"): NumPy has no bfloat16, so their bfloat16 inputs are CPU
torch tensors of torch.bfloat16 (the calls then return torch tensors), and their references
compute in float32 (sums in float64, rounded once) from the bfloat16 values and round the
results to bfloat16 (nearest even). `as_numpy` gives any input or output as a NumPy array
(bfloat16 as float32). Skipped where torch is not installed.

`run_case` runs one case on one shape and checks that the inputs were not modified;
`assert_close` compares with the case's tolerances (exactly for integer and bool outputs).
"""

from __future__ import annotations

import math
import warnings
import zlib
from dataclasses import dataclass
from typing import Callable

import numpy as np

import tclang


@dataclass(frozen=True)
class Case:
    name: str                      # unique, snake_case
    source: str                    # tclang source (one or more defs)
    entry: str                     # the def to call
    shapes: tuple[dict[str, int], ...]
    make_inputs: Callable[[dict[str, int], np.random.Generator], tuple]
    reference: Callable[..., object]
    rtol: float = 1e-4
    atol: float = 1e-5
    tags: tuple[str, ...] = ()


# ---- helpers ----------------------------------------------------------------------------

F32, F64, F16 = np.float32, np.float64, np.float16
I8, U8, I32, I64 = np.int8, np.uint8, np.int32, np.int64


def _u(rng, shape, lo=-1.0, hi=1.0, dtype=F32):
    """Uniform floats in [lo, hi) of exactly `dtype` (0-d arrays for shape ())."""
    return np.asarray(rng.uniform(lo, hi, size=shape)).astype(dtype)


def _i(rng, shape, lo, hi, dtype=I32):
    """Integers in [lo, hi) of exactly `dtype`."""
    return np.asarray(rng.integers(lo, hi, size=shape)).astype(dtype)


def _d(x):
    """The float64 working copy a reference computes with."""
    return np.asarray(as_numpy(x), dtype=F64)


def is_tensor(x) -> bool:
    return type(x).__module__.startswith("torch")


def as_numpy(x) -> np.ndarray:
    """An input or output as NumPy: a torch tensor's values (a bfloat16 one as float32)."""
    if is_tensor(x):
        import torch
        return (x.float() if x.dtype == torch.bfloat16 else x).numpy()
    return np.asarray(x)


def _bf16(rng, shape, lo=-1.0, hi=1.0):
    """Uniform values rounded to bfloat16: a CPU torch tensor of torch.bfloat16."""
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is an optional extra
        import pytest
        pytest.skip("bfloat16 cases take torch tensors: torch is not installed")
    return torch.from_numpy(np.asarray(rng.uniform(lo, hi, size=shape)).astype(F32)).bfloat16()


def _to_bf16(x):
    """Float results rounded once to float32, then to the nearest bfloat16 (ties to even):
    a torch tensor of torch.bfloat16."""
    import torch
    return torch.from_numpy(np.array(x, dtype=F32, order="C")).bfloat16()


def _f32(x):
    return np.asarray(x).astype(F32)


def _relu(x):
    return np.maximum(x, 0.0)


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


_erf = np.vectorize(math.erf, otypes=[F64])


def _c_round(x):
    """C's round(): halfway cases away from zero."""
    return np.sign(x) * np.floor(np.abs(x) + 0.5)


def _windows(x, k, stride, axes):
    """Sliding windows of x (k along each of `axes`, with `stride`) as extra trailing axes."""
    v = np.lib.stride_tricks.sliding_window_view(x, (k,) * len(axes), axis=axes)
    sl = [slice(None)] * x.ndim
    for a in axes:
        sl[a] = slice(None, None, stride)
    return v[tuple(sl)]


def _conv2d(I, W, stride=1):
    """Valid NCHW convolution: O[n,m,h,w] = sum_c,kh,kw I[n,c,s*h+kh,s*w+kw] W[m,c,kh,kw]."""
    N, C, H, Wd = I.shape
    M, _, KH, KW = W.shape
    OH, OW = (H - KH) // stride + 1, (Wd - KW) // stride + 1
    out = np.zeros((N, M, OH, OW))
    for kh in range(KH):
        for kw in range(KW):
            patch = I[:, :, kh:kh + stride * (OH - 1) + 1:stride,
                      kw:kw + stride * (OW - 1) + 1:stride]
            out += np.einsum("nchw,mc->nmhw", patch, W[:, :, kh, kw])
    return out


# ---- TC's classic operators -------------------------------------------------------------

CASES: list[Case] = []


def _add(*args, **kwargs):
    CASES.append(Case(*args, **kwargs))


_add(
    "matmul",
    """
def matmul(float(M, K) A, float(K, N) B) -> (C) {
    C(m, n) +=! A(m, k) * B(k, n)
}
""",
    "matmul",
    ({"M": 3, "K": 7, "N": 1}, {"M": 1, "K": 4, "N": 11}, {"M": 13, "K": 1, "N": 5},
     {"M": 6, "K": 9, "N": 7}),
    lambda s, r: (_u(r, (s["M"], s["K"])), _u(r, (s["K"], s["N"]))),
    lambda A, B: _f32(_d(A) @ _d(B)),
    tags=("tc", "reduction"),
)

_add(
    "matmul_transposed_a",
    """
def matmul_ta(float(K, M) A, float(K, N) B) -> (C) {
    C(m, n) +=! A(k, m) * B(k, n)
}
""",
    "matmul_ta",
    ({"M": 3, "K": 7, "N": 1}, {"M": 1, "K": 5, "N": 11}, {"M": 13, "K": 1, "N": 4}),
    lambda s, r: (_u(r, (s["K"], s["M"])), _u(r, (s["K"], s["N"]))),
    lambda A, B: _f32(_d(A).T @ _d(B)),
    tags=("tc", "reduction"),
)

_add(
    "tmm",
    """
# TC's tmm: C = A * B^T
def tmm(float(M, K) A, float(N, K) B) -> (C) {
    C(m, n) +=! A(m, kk) * B(n, kk)
}
""",
    "tmm",
    ({"M": 7, "K": 3, "N": 1}, {"M": 1, "K": 11, "N": 4}, {"M": 5, "K": 1, "N": 13}),
    lambda s, r: (_u(r, (s["M"], s["K"])), _u(r, (s["N"], s["K"]))),
    lambda A, B: _f32(_d(A) @ _d(B).T),
    tags=("tc", "reduction"),
)

_add(
    "matmul_transposed_both",
    """
def matmul_tt(float(K, M) A, float(N, K) B) -> (C) {
    C(m, n) +=! A(k, m) * B(n, k)
}
""",
    "matmul_tt",
    ({"M": 2, "K": 13, "N": 3}, {"M": 7, "K": 1, "N": 2}, {"M": 1, "K": 4, "N": 11}),
    lambda s, r: (_u(r, (s["K"], s["M"])), _u(r, (s["N"], s["K"]))),
    lambda A, B: _f32(_d(A).T @ _d(B).T),
    tags=("tc", "reduction"),
)

_add(
    "batch_matmul",
    """
def batch_matmul(float(B, N, M) X, float(B, M, K) Y) -> (Z) {
    Z(b, n, k) +=! X(b, n, mm) * Y(b, mm, k)
}
""",
    "batch_matmul",
    ({"B": 2, "N": 3, "M": 7, "K": 1}, {"B": 1, "N": 5, "M": 2, "K": 11},
     {"B": 3, "N": 1, "M": 1, "K": 4}),
    lambda s, r: (_u(r, (s["B"], s["N"], s["M"])), _u(r, (s["B"], s["M"], s["K"]))),
    lambda X, Y: _f32(np.einsum("bnm,bmk->bnk", _d(X), _d(Y))),
    tags=("tc", "reduction"),
)

_add(
    "batch_matmul_transposed",
    """
# TC's tbmm: the second operand transposed per batch
def tbmm(float(B, N, M) X, float(B, K, M) Y) -> (Z) {
    Z(b, n, k) +=! X(b, n, m) * Y(b, k, m)
}
""",
    "tbmm",
    ({"B": 2, "N": 3, "M": 7, "K": 1}, {"B": 1, "N": 4, "M": 3, "K": 11},
     {"B": 3, "N": 1, "M": 1, "K": 2}),
    lambda s, r: (_u(r, (s["B"], s["N"], s["M"])), _u(r, (s["B"], s["K"], s["M"]))),
    lambda X, Y: _f32(np.einsum("bnm,bkm->bnk", _d(X), _d(Y))),
    tags=("tc", "reduction"),
)

_add(
    "tensor_matrix_mul",
    """
# a 3-d tensor times a matrix along its last dimension
def tensor_matmul(float(B, M, K) T, float(K, N) W) -> (O) {
    O(b, m, n) +=! T(b, m, k) * W(k, n)
}
""",
    "tensor_matmul",
    ({"B": 1, "M": 3, "K": 7, "N": 2}, {"B": 2, "M": 1, "K": 1, "N": 11},
     {"B": 3, "M": 5, "K": 4, "N": 1}),
    lambda s, r: (_u(r, (s["B"], s["M"], s["K"])), _u(r, (s["K"], s["N"]))),
    lambda T, W: _f32(np.einsum("bmk,kn->bmn", _d(T), _d(W))),
    tags=("tc", "reduction"),
)

_add(
    "tensordot",
    """
def tensordot(float(N, C1, C2, H, W) I0, float(N, C2, C3, H, W) I1) -> (O) {
    O(n, c1, c3, h, w) +=! I0(n, c1, c2, h, w) * I1(n, c2, c3, h, w)
}
""",
    "tensordot",
    ({"N": 1, "C1": 2, "C2": 7, "C3": 3, "H": 2, "W": 1},
     {"N": 2, "C1": 1, "C2": 1, "C3": 2, "H": 1, "W": 11},
     {"N": 1, "C1": 3, "C2": 2, "C3": 1, "H": 3, "W": 2}),
    lambda s, r: (_u(r, (s["N"], s["C1"], s["C2"], s["H"], s["W"])),
                  _u(r, (s["N"], s["C2"], s["C3"], s["H"], s["W"]))),
    lambda A, B: _f32(np.einsum("nabhw,nbchw->nachw", _d(A), _d(B))),
    tags=("tc", "reduction"),
)

_add(
    "fcrelu",
    """
def fcrelu(float(B, M) I, float(N, M) W1, float(N) B1) -> (O1) {
    O1(b, n) +=! I(b, m) * W1(n, m)
    O1(b, n) = O1(b, n) + B1(n)
    O1(b, n) = fmax(O1(b, n), 0)
}
""",
    "fcrelu",
    ({"B": 1, "M": 7, "N": 3}, {"B": 4, "M": 1, "N": 11}, {"B": 13, "M": 3, "N": 1}),
    lambda s, r: (_u(r, (s["B"], s["M"])), _u(r, (s["N"], s["M"])), _u(r, (s["N"],))),
    lambda I, W, b: _f32(_relu(_d(I) @ _d(W).T + _d(b))),
    tags=("tc", "reduction", "multi_statement"),
)

_MLP_LAYERS = """
    O{k}(b, o) +=! {x}(b, i) * W{k}(o, i)
    O{k}(b, o) = O{k}(b, o) + B{k}(o)
    O{k}(b, o) = fmax(O{k}(b, o), 0)"""


def _mlp_case(layers: int, shapes):
    dims = ["M"] + [f"N{k}" for k in range(1, layers + 1)]
    params = ["float(B, M) I"]
    for k in range(1, layers + 1):
        params += [f"float({dims[k]}, {dims[k - 1]}) W{k}", f"float({dims[k]}) B{k}"]
    outs = ", ".join(f"O{k}" for k in range(1, layers + 1))
    body = "".join(_MLP_LAYERS.format(k=k, x="I" if k == 1 else f"O{k - 1}")
                   for k in range(1, layers + 1))
    name = f"mlp{layers}"
    source = f"\ndef {name}({', '.join(params)}) -> ({outs}) {{{body}\n}}\n"

    def make(s, r):
        arrays = [_u(r, (s["B"], s["M"]))]
        for k in range(1, layers + 1):
            arrays += [_u(r, (s[dims[k]], s[dims[k - 1]])), _u(r, (s[dims[k]],))]
        return tuple(arrays)

    def reference(I, *wb):
        x, outs_ = _d(I), []
        for k in range(layers):
            x = _relu(x @ _d(wb[2 * k]).T + _d(wb[2 * k + 1]))
            outs_.append(_f32(x))
        return tuple(outs_)

    _add(f"fcrelu_mlp{layers}", source, name, shapes, make, reference,
         tags=("tc", "reduction", "multi_output"))


_mlp_case(2, ({"B": 1, "M": 7, "N1": 3, "N2": 2}, {"B": 3, "M": 1, "N1": 11, "N2": 1},
              {"B": 5, "M": 4, "N1": 1, "N2": 13}))
_mlp_case(3, ({"B": 1, "M": 7, "N1": 3, "N2": 2, "N3": 4},
              {"B": 3, "M": 2, "N1": 1, "N2": 11, "N3": 1},
              {"B": 2, "M": 1, "N1": 5, "N2": 3, "N3": 13}))
_mlp_case(4, ({"B": 1, "M": 7, "N1": 3, "N2": 2, "N3": 4, "N4": 2},
              {"B": 3, "M": 2, "N1": 1, "N2": 11, "N3": 1, "N4": 3},
              {"B": 2, "M": 1, "N1": 5, "N2": 3, "N3": 2, "N4": 13}))

_add(
    "conv2d",
    """
def convolution(float(N, C, H, W) I, float(M, C, KH, KW) W1, float(M) B) -> (O) {
    O(n, m, h, w) +=! I(n, c, h + kh, w + kw) * W1(m, c, kh, kw)
    O(n, m, h, w) = O(n, m, h, w) + B(m)
}
""",
    "convolution",
    ({"N": 1, "C": 2, "H": 4, "W": 7, "M": 2, "KH": 3, "KW": 2},
     {"N": 2, "C": 1, "H": 3, "W": 3, "M": 1, "KH": 1, "KW": 3},
     {"N": 1, "C": 3, "H": 2, "W": 5, "M": 1, "KH": 2, "KW": 1}),
    lambda s, r: (_u(r, (s["N"], s["C"], s["H"], s["W"])),
                  _u(r, (s["M"], s["C"], s["KH"], s["KW"])), _u(r, (s["M"],))),
    lambda I, W, b: _f32(_conv2d(_d(I), _d(W)) + _d(b)[:, None, None]),
    tags=("tc", "conv", "reduction3"),
)

_add(
    "conv2d_stride2",
    """
def convolution_strided(float(N, C, H, W) I, float(M, C, KH, KW) W1, float(M) B) -> (O) {
    O(n, m, h, w) +=! I(n, c, 2 * h + kh, 2 * w + kw) * W1(m, c, kh, kw)
    O(n, m, h, w) = O(n, m, h, w) + B(m)
}
""",
    "convolution_strided",
    ({"N": 1, "C": 2, "H": 7, "W": 4, "M": 2, "KH": 3, "KW": 2},
     {"N": 2, "C": 1, "H": 3, "W": 5, "M": 1, "KH": 1, "KW": 3},
     {"N": 1, "C": 3, "H": 4, "W": 2, "M": 1, "KH": 2, "KW": 1}),
    lambda s, r: (_u(r, (s["N"], s["C"], s["H"], s["W"])),
                  _u(r, (s["M"], s["C"], s["KH"], s["KW"])), _u(r, (s["M"],))),
    lambda I, W, b: _f32(_conv2d(_d(I), _d(W), stride=2) + _d(b)[:, None, None]),
    tags=("tc", "conv", "reduction3", "strided"),
)


def _conv_same_ref(I, W):
    """3x3 convolution with zero padding 1 ('same' output size)."""
    P = np.pad(_d(I), ((0, 0), (0, 0), (1, 1), (1, 1)))
    return _f32(_conv2d(P, _d(W)))


_add(
    "conv2d_same_padding",
    """
# zero padding written as guarded reads: the output keeps the input's H x W; I is only
# read under the guard, so n needs a `where`
def conv_same(float(N, C, H, W) I, float(M, C, 3, 3) Wt) -> (O) {
    O(n, m, h, w) +=! ((h + kh >= 1 && h + kh <= H && w + kw >= 1 && w + kw <= W)
                          ? I(n, c, h + kh - 1, w + kw - 1) : 0.0) * Wt(m, c, kh, kw)
        where n in 0:N, h in 0:H, w in 0:W
}
""",
    "conv_same",
    ({"N": 1, "C": 1, "H": 3, "W": 7, "M": 1},
     {"N": 1, "C": 2, "H": 1, "W": 2, "M": 2},
     {"N": 2, "C": 1, "H": 2, "W": 3, "M": 1}),
    lambda s, r: (_u(r, (s["N"], s["C"], s["H"], s["W"])), _u(r, (s["M"], s["C"], 3, 3))),
    _conv_same_ref,
    tags=("conv", "guarded", "padding", "reduction3"),
)


def _depthwise_ref(I, W):
    C, KH, KW = W.shape
    v = np.lib.stride_tricks.sliding_window_view(_d(I), (KH, KW), axis=(2, 3))
    return _f32(np.einsum("nchwij,cij->nchw", v, _d(W)))


_add(
    "depthwise_conv",
    """
def depthwise_convolution(float(N, C, H, W) I, float(C, KH, KW) W1) -> (O) {
    O(n, c, h, w) +=! I(n, c, h + kh, w + kw) * W1(c, kh, kw)
}
""",
    "depthwise_convolution",
    ({"N": 1, "C": 2, "H": 4, "W": 7, "KH": 3, "KW": 2},
     {"N": 2, "C": 1, "H": 3, "W": 3, "KH": 1, "KW": 3},
     {"N": 1, "C": 3, "H": 5, "W": 2, "KH": 2, "KW": 1}),
    lambda s, r: (_u(r, (s["N"], s["C"], s["H"], s["W"])), _u(r, (s["C"], s["KH"], s["KW"]))),
    _depthwise_ref,
    tags=("tc", "conv"),
)


def _group_conv_ref(I, W, B):
    N, G, C, H, Wd = I.shape
    _, F, _, KH, KW = W.shape
    v = np.lib.stride_tricks.sliding_window_view(_d(I), (KH, KW), axis=(3, 4))
    return _f32(np.einsum("ngchwij,gfcij->ngfhw", v, _d(W)) + _d(B)[None, :, :, None, None])


_add(
    "group_conv",
    """
def group_convolution(float(N, G, C, H, W) I, float(G, F, C, KH, KW) W1, float(G, F) B) -> (O) {
    O(n, g, f, h, w) +=! I(n, g, c, h + kh, w + kw) * W1(g, f, c, kh, kw)
    O(n, g, f, h, w) = O(n, g, f, h, w) + B(g, f)
}
""",
    "group_convolution",
    ({"N": 1, "G": 2, "C": 2, "H": 3, "W": 7, "F": 1, "KH": 2, "KW": 3},
     {"N": 1, "G": 1, "C": 1, "H": 2, "W": 3, "F": 2, "KH": 1, "KW": 1},
     {"N": 2, "G": 1, "C": 3, "H": 2, "W": 2, "F": 1, "KH": 2, "KW": 2}),
    lambda s, r: (_u(r, (s["N"], s["G"], s["C"], s["H"], s["W"])),
                  _u(r, (s["G"], s["F"], s["C"], s["KH"], s["KW"])), _u(r, (s["G"], s["F"]))),
    _group_conv_ref,
    tags=("tc", "conv", "reduction3"),
)

_add(
    "maxpool",
    """
# 3x3 windows, stride 2; the window's range comes from `where`
def maxpool(float(N, C, H, W) I) -> (O) {
    O(n, c, h, w) max=! I(n, c, 2 * h + kh, 2 * w + kw) where kh in 0:3, kw in 0:3
}
""",
    "maxpool",
    ({"N": 1, "C": 2, "H": 7, "W": 3}, {"N": 2, "C": 1, "H": 3, "W": 4},
     {"N": 1, "C": 1, "H": 5, "W": 11}),
    lambda s, r: (_u(r, (s["N"], s["C"], s["H"], s["W"])),),
    lambda I: _windows(I, 3, 2, (2, 3)).max(axis=(-2, -1)).astype(F32),
    tags=("tc", "pool", "where"),
)

_add(
    "avgpool",
    """
def avgpool(float(N, C, H, W) I) -> (O) {
    O(n, c, h, w) +=! I(n, c, 2 * h + kh, 2 * w + kw) where kh in 0:2, kw in 0:2
    O(n, c, h, w) = O(n, c, h, w) / 4
}
""",
    "avgpool",
    ({"N": 1, "C": 2, "H": 7, "W": 2}, {"N": 2, "C": 1, "H": 2, "W": 5},
     {"N": 1, "C": 3, "H": 4, "W": 11}),
    lambda s, r: (_u(r, (s["N"], s["C"], s["H"], s["W"])),),
    lambda I: _f32(_windows(_d(I), 2, 2, (2, 3)).mean(axis=(-2, -1))),
    tags=("tc", "pool", "where"),
)


def _batchnorm_ref(I, rMeanIn, rVarIn, momentum, eps):
    I, m, e = _d(I), float(momentum), float(eps)
    mean = I.mean(axis=(0, 2, 3))
    rmean = (1 - m) * _d(rMeanIn) + m * mean
    centered = I - rmean[None, :, None, None]
    expvar = (centered * centered + e).mean(axis=(0, 2, 3))
    rvar = 1.0 / np.sqrt((1 - m) * _d(rVarIn) + m * expvar)
    O = -rvar[None, :, None, None] * (I - rmean[None, :, None, None])
    return _f32(O), _f32(rmean), _f32(rvar)


_add(
    "batchnorm",
    """
# TC's batchnorm: temporaries, scalar inputs, sizes used as values
def batchnorm(float(N, C, H, W) I, float(C) rMeanIn, float(C) rVarIn, float momentum,
              float eps) -> (O, rMeanOut, rVarOut) {
    mean(c) +=! I(nn, c, hh, ww)
    mean(c) = mean(c) / (N * H * W)
    rMeanOut(c) = (1 - momentum) * rMeanIn(c) + momentum * mean(c)
    centered(n, c, h, w) = I(n, c, h, w) - rMeanOut(c)
    variance(n, c, h, w) = centered(n, c, h, w) * centered(n, c, h, w)
    expectedVariance(c) +=! (variance(n, c, h, w) + eps) / (N * H * W)
    rVarOut(c) = rsqrt((1 - momentum) * rVarIn(c) + momentum * expectedVariance(c))
    O(n, c, h, w) = - rVarOut(c) * (I(n, c, h, w) - rMeanOut(c))
}
""",
    "batchnorm",
    ({"N": 1, "C": 2, "H": 3, "W": 7}, {"N": 2, "C": 1, "H": 1, "W": 2},
     {"N": 1, "C": 3, "H": 2, "W": 2}),
    lambda s, r: (_u(r, (s["N"], s["C"], s["H"], s["W"])), _u(r, (s["C"],)),
                  _u(r, (s["C"],), 0.5, 1.5), np.asarray(0.1, dtype=F32),
                  np.asarray(1e-3, dtype=F32)),
    _batchnorm_ref,
    tags=("tc", "norm", "temporary", "scalar_input", "size_value", "reduction3"),
)


def _layernorm_ref(I, gamma, beta):
    I = _d(I)
    mean = I.mean(axis=2, keepdims=True)
    var = ((I - mean) ** 2).mean(axis=2, keepdims=True)
    return _f32(_d(gamma) * (I - mean) / np.sqrt(var + 1e-5) + _d(beta))


_add(
    "layernorm",
    """
def layernorm(float(T, B, C) I, float(C) gamma, float(C) beta) -> (O) {
    mean(t, b) +=! I(t, b, c) / C
    centered(t, b, c) = I(t, b, c) - mean(t, b)
    var(t, b) +=! centered(t, b, c) * centered(t, b, c) / C
    O(t, b, c) = gamma(c) * centered(t, b, c) * rsqrt(var(t, b) + 1e-5) + beta(c)
}
""",
    "layernorm",
    ({"T": 1, "B": 2, "C": 7}, {"T": 3, "B": 1, "C": 1}, {"T": 2, "B": 3, "C": 11}),
    lambda s, r: (_u(r, (s["T"], s["B"], s["C"])), _u(r, (s["C"],)), _u(r, (s["C"],))),
    _layernorm_ref,
    atol=1e-4,
    tags=("norm", "temporary", "size_value"),
)


def _softmax_ref(I):
    I = _d(I)
    e = np.exp(I - I.max(axis=1, keepdims=True))
    return _f32(e / e.sum(axis=1, keepdims=True))


_add(
    "softmax",
    """
def softmax(float(N, D) I) -> (O) {
    maxVal(n) max=! I(n, d)
    expSum(n) +=! exp(I(n, d) - maxVal(n))
    O(n, d) = exp(I(n, d) - maxVal(n)) / expSum(n)
}
""",
    "softmax",
    ({"N": 1, "D": 7}, {"N": 3, "D": 1}, {"N": 11, "D": 4}),
    lambda s, r: (_u(r, (s["N"], s["D"]), -3.0, 3.0),),
    _softmax_ref,
    tags=("tc", "temporary"),
)


def _log_softmax_ref(I):
    I = _d(I)
    mx = I.max(axis=1, keepdims=True)
    return _f32(I - mx - np.log(np.exp(I - mx).sum(axis=1, keepdims=True)))


_add(
    "log_softmax",
    """
def log_softmax(float(N, D) I) -> (O) {
    maxVal(n) max=! I(n, d)
    expSum(n) +=! exp(I(n, d) - maxVal(n))
    O(n, d) = I(n, d) - maxVal(n) - log(expSum(n))
}
""",
    "log_softmax",
    ({"N": 1, "D": 7}, {"N": 3, "D": 1}, {"N": 13, "D": 3}),
    lambda s, r: (_u(r, (s["N"], s["D"]), -3.0, 3.0),),
    _log_softmax_ref,
    tags=("temporary",),
)

_add(
    "embedding",
    """
def embedding(float(E, D) LUT, int32(B, L) Ids) -> (O) {
    O(b, l, d) = LUT(Ids(b, l), d)
}
""",
    "embedding",
    ({"E": 7, "D": 3, "B": 1, "L": 4}, {"E": 1, "D": 11, "B": 2, "L": 1},
     {"E": 5, "D": 1, "B": 3, "L": 13}),
    lambda s, r: (_u(r, (s["E"], s["D"])), _i(r, (s["B"], s["L"]), 0, s["E"])),
    lambda LUT, Ids: LUT[Ids].astype(F32),
    tags=("gather",),
)

_add(
    "lut1",
    """
# TC's 1LUT: a bag of embeddings, summed
def _1LUT(float(E1, D) LUT1, int32(B, L1) I1) -> (O1) {
    O1(b, d) +=! LUT1(I1(b, r_l1), d)
}
""",
    "_1LUT",
    ({"E1": 7, "D": 3, "B": 2, "L1": 4}, {"E1": 1, "D": 2, "B": 1, "L1": 11},
     {"E1": 5, "D": 1, "B": 13, "L1": 1}),
    lambda s, r: (_u(r, (s["E1"], s["D"])), _i(r, (s["B"], s["L1"]), 0, s["E1"])),
    lambda LUT, I: _f32(_d(LUT)[I].sum(axis=1)),
    tags=("tc", "gather", "reduction"),
)

_add(
    "lut2",
    """
# TC's 2LUT: two tables, two outputs
def _2LUT(float(E1, D) LUT1, int32(B, L1) I1, float(E2, D) LUT2, int32(B, L2) I2) -> (O1, O2) {
    O1(b, d) +=! LUT1(I1(b, r_l1), d)
    O2(b, d) +=! LUT2(I2(b, r_l2), d)
}
""",
    "_2LUT",
    ({"E1": 7, "D": 3, "B": 2, "L1": 4, "E2": 3, "L2": 2},
     {"E1": 1, "D": 2, "B": 1, "L1": 11, "E2": 5, "L2": 1},
     {"E1": 5, "D": 1, "B": 3, "L1": 1, "E2": 1, "L2": 13}),
    lambda s, r: (_u(r, (s["E1"], s["D"])), _i(r, (s["B"], s["L1"]), 0, s["E1"]),
                  _u(r, (s["E2"], s["D"])), _i(r, (s["B"], s["L2"]), 0, s["E2"])),
    lambda L1, I1, L2, I2: (_f32(_d(L1)[I1].sum(axis=1)), _f32(_d(L2)[I2].sum(axis=1))),
    tags=("tc", "gather", "reduction", "multi_output"),
)

_add(
    "kronecker",
    """
# the Kronecker product, with division and modulo by sizes in the subscripts
def kronecker(float(M, N) A, float(P, Q) B) -> (O) {
    O(r, c) = A(r / P, c / Q) * B(r % P, c % Q) where r in 0:M*P, c in 0:N*Q
}
""",
    "kronecker",
    ({"M": 2, "N": 1, "P": 3, "Q": 2}, {"M": 1, "N": 3, "P": 2, "Q": 7},
     {"M": 3, "N": 2, "P": 1, "Q": 1}),
    lambda s, r: (_u(r, (s["M"], s["N"])), _u(r, (s["P"], s["Q"]))),
    lambda A, B: _f32(np.kron(_d(A), _d(B))),
    tags=("tc", "divmod"),
)

_add(
    "kronecker_literal",
    """
# the Kronecker product with a 2x3 right factor: quasi-affine subscripts
def kron23(float(M, N) A, float(2, 3) B) -> (O) {
    O(r, c) = A(r / 2, c / 3) * B(r % 2, c % 3)
}
""",
    "kron23",
    ({"M": 1, "N": 7}, {"M": 3, "N": 1}, {"M": 2, "N": 2}),
    lambda s, r: (_u(r, (s["M"], s["N"])), _u(r, (2, 3))),
    lambda A, B: _f32(np.kron(_d(A), _d(B))),
    tags=("tc", "divmod"),
)


def _kron3_ref(W0, W1, W2, X):
    W0, W1, W2, X = map(_d, (W0, W1, W2, X))
    XW2 = np.einsum("mabc,dc->mabd", X, W2)
    XW1 = np.einsum("mabd,eb->maed", XW2, W1)
    Y = np.einsum("maed,fa->mfed", XW1, W0)
    return _f32(Y), _f32(XW1), _f32(XW2)


_add(
    "kronecker3",
    """
# TC's Kronecker3_full: (W0 (x) W1 (x) W2) applied to X, mode by mode
def Kronecker3_full(float(D0, N0) W0, float(D1, N1) W1, float(D2, N2) W2,
                    float(M, N0, N1, N2) X) -> (Y, XW1, XW2) {
    XW2(m, n0, n1, d2) +=! X(m, n0, n1, n2_red) * W2(d2, n2_red)
    XW1(m, n0, d1, d2) +=! XW2(m, n0, n1_red, d2) * W1(d1, n1_red)
    Y(m, d0, d1, d2)   +=! XW1(m, n0_red, d1, d2) * W0(d0, n0_red)
}
""",
    "Kronecker3_full",
    ({"M": 1, "D0": 2, "N0": 3, "D1": 1, "N1": 2, "D2": 3, "N2": 7},
     {"M": 2, "D0": 1, "N0": 1, "D1": 3, "N1": 2, "D2": 2, "N2": 1},
     {"M": 1, "D0": 3, "N0": 2, "D1": 2, "N1": 1, "D2": 1, "N2": 3}),
    lambda s, r: (_u(r, (s["D0"], s["N0"])), _u(r, (s["D1"], s["N1"])),
                  _u(r, (s["D2"], s["N2"])), _u(r, (s["M"], s["N0"], s["N1"], s["N2"]))),
    _kron3_ref,
    tags=("tc", "reduction", "multi_output", "chain"),
)

_add(
    "transpose",
    """
def transpose(float(N, M) I) -> (O) {
    O(m, n) = I(n, m)
}
""",
    "transpose",
    ({"N": 1, "M": 7}, {"N": 11, "M": 1}, {"N": 4, "M": 13}),
    lambda s, r: (_u(r, (s["N"], s["M"])),),
    lambda I: np.ascontiguousarray(I.T),
    tags=("tc",),
)

_add(
    "permute4d",
    """
def permute(float(A, B, C, D) I) -> (O) {
    O(a, d, b, c) = I(a, b, c, d)
}
""",
    "permute",
    ({"A": 1, "B": 2, "C": 7, "D": 3}, {"A": 2, "B": 1, "C": 1, "D": 11},
     {"A": 3, "B": 4, "C": 2, "D": 1}),
    lambda s, r: (_u(r, (s["A"], s["B"], s["C"], s["D"])),),
    lambda I: np.ascontiguousarray(I.transpose(0, 3, 1, 2)),
    tags=("tc",),
)

_add(
    "copy",
    """
def copy(float(N, M) I) -> (O) {
    O(n, m) = I(n, m)
}
""",
    "copy",
    ({"N": 1, "M": 7}, {"N": 11, "M": 1}, {"N": 5, "M": 13}),
    lambda s, r: (_u(r, (s["N"], s["M"])),),
    lambda I: I.copy(),
    tags=("tc",),
)


def _moments_ref(I):
    I = _d(I)
    mean = I.mean(axis=1)
    return _f32(mean), _f32((I * I).mean(axis=1) - mean * mean)


_add(
    "moments",
    """
# TC's moments2_2D_1D: mean and variance of each row
def moments2_2D_1D(float(N, K) I) -> (mean, var) {
    mean(n) +=! I(n, r_k)
    mean(n) = mean(n) / (K)
    var(n) +=! I(n, r_k) * I(n, r_k)
    var(n) = var(n) / (K) - mean(n) * mean(n)
}
""",
    "moments2_2D_1D",
    ({"N": 1, "K": 7}, {"N": 3, "K": 1}, {"N": 11, "K": 4}),
    lambda s, r: (_u(r, (s["N"], s["K"])),),
    _moments_ref,
    tags=("tc", "reduction", "multi_output", "size_value"),
)


def _group_norm_ref(I, gamma, beta):
    I = _d(I)
    mean = I.mean(axis=(2, 3, 4))
    var = (I * I).mean(axis=(2, 3, 4)) - mean * mean
    O = _d(gamma)[None, :, :, None, None] * (I - mean[:, :, None, None, None]) \
        / np.sqrt(var[:, :, None, None, None] + 1e-5) + _d(beta)[None, :, :, None, None]
    return _f32(O), _f32(mean), _f32(var)


_add(
    "group_norm",
    """
# TC's group_normalization: statistics over (D, H, W) of each group
def group_normalization(float(N, G, D, H, W) I, float(G, D) gamma, float(G, D) beta)
    -> (O, mean, var)
{
    mean(n, g) +=! I(n, g, r_d, r_h, r_w)
    var(n, g)  +=! I(n, g, r_d, r_h, r_w) * I(n, g, r_d, r_h, r_w)
    mean(n, g) = mean(n, g) / (D * H * W)
    var(n, g) = var(n, g) / (D * H * W) - mean(n, g) * mean(n, g)
    O(n, g, d, h, w) = gamma(g, d) * (I(n, g, d, h, w) - mean(n, g))
                       * rsqrt(var(n, g) + 1e-5) + beta(g, d)
}
""",
    "group_normalization",
    ({"N": 1, "G": 2, "D": 2, "H": 1, "W": 7}, {"N": 2, "G": 1, "D": 1, "H": 3, "W": 2},
     {"N": 1, "G": 1, "D": 3, "H": 2, "W": 1}),
    lambda s, r: (_u(r, (s["N"], s["G"], s["D"], s["H"], s["W"]), -2.0, 2.0),
                  _u(r, (s["G"], s["D"])), _u(r, (s["G"], s["D"]))),
    _group_norm_ref,
    atol=1e-4,
    tags=("tc", "norm", "reduction3", "multi_output", "size_value"),
)


def _wavenet_ref(Data, FW, FB, GW, GB, RW, RB, SW, SB, Dil):
    Data, FW, FB, GW, GB, RW, RB, SW, SB = map(_d, (Data, FW, FB, GW, GB, RW, RB, SW, SB))
    dil = Dil.shape[0]
    shifted = np.zeros_like(Data)
    shifted[:, :, dil:] = Data[:, :, :Data.shape[2] - dil]

    def dconv(W, b):
        return (b[None, :, None] + np.einsum("brt,dr->bdt", Data, W[:, :, 1])
                + np.einsum("brt,dr->bdt", shifted, W[:, :, 0]))

    F, G = dconv(FW, FB), dconv(GW, GB)
    NL = np.tanh(F) * _sigmoid(G)
    Res = Data + np.einsum("bdt,rd->brt", NL, RW) + RB[None, :, None]
    Skip = np.einsum("bdt,sd->bst", NL, SW) + SB[None, :, None]
    return _f32(F), _f32(G), _f32(NL), _f32(Res), _f32(Skip)


_add(
    "wavenet",
    """
# TC's wavenet1: a dilated causal convolution (the dilation is a size used as a value),
# gated activation, residual and skip outputs
def wavenet1(float(B, RESIDUAL_C, RECEPTIVE_FIELD) Data,
             float(DILATION_C, RESIDUAL_C, 2) FilterWeight, float(DILATION_C) FilterBias,
             float(DILATION_C, RESIDUAL_C, 2) GateWeight, float(DILATION_C) GateBias,
             float(RESIDUAL_C, DILATION_C) ResWeight, float(RESIDUAL_C) ResBias,
             float(SKIP_C, DILATION_C) SkipWeight, float(SKIP_C) SkipBias,
             float(DILATION_FACTOR) Dilation)
    -> (FilterOut, GateOut, NonLin, Res, Skip)
{
    FilterOut(b, dilation_c, rf) = FilterBias(dilation_c)
        where b in 0:B, dilation_c in 0:DILATION_C, rf in 0:RECEPTIVE_FIELD
    FilterOut(b, dilation_c, rf) += Data(b, r_residual_c, rf) * FilterWeight(dilation_c, r_residual_c, 1) +
        ((rf - DILATION_FACTOR >= 0) ?
            Data(b, r_residual_c, rf - DILATION_FACTOR) * FilterWeight(dilation_c, r_residual_c, 0) :
            float(0))
        where rf in 0:RECEPTIVE_FIELD

    GateOut(b, dilation_c, rf) = GateBias(dilation_c)
        where b in 0:B, dilation_c in 0:DILATION_C, rf in 0:RECEPTIVE_FIELD
    GateOut(b, dilation_c, rf) += Data(b, r_residual_c, rf) * GateWeight(dilation_c, r_residual_c, 1) +
        ((rf - DILATION_FACTOR >= 0) ?
            Data(b, r_residual_c, rf - DILATION_FACTOR) * GateWeight(dilation_c, r_residual_c, 0) :
            float(0))
        where rf in 0:RECEPTIVE_FIELD

    NonLin(b, dilation_c, rf) = tanh(FilterOut(b, dilation_c, rf))
        * (1 / (1 + exp(-GateOut(b, dilation_c, rf))))
        where rf in 0:RECEPTIVE_FIELD

    Res(b, residual_c, rf) = Data(b, residual_c, rf)
        where rf in 0:RECEPTIVE_FIELD, residual_c in 0:RESIDUAL_C
    Res(b, residual_c, rf) += NonLin(b, r_dilation_c, rf) * ResWeight(residual_c, r_dilation_c)
        where rf in 0:RECEPTIVE_FIELD
    Res(b, residual_c, rf) = Res(b, residual_c, rf) + ResBias(residual_c)
        where rf in 0:RECEPTIVE_FIELD, residual_c in 0:RESIDUAL_C

    Skip(b, skip, rf) +=! NonLin(b, r_dilation_c, rf) * SkipWeight(skip, r_dilation_c)
        where rf in 0:RECEPTIVE_FIELD
    Skip(b, skip, rf) = Skip(b, skip, rf) + SkipBias(skip)
        where rf in 0:RECEPTIVE_FIELD, skip in 0:SKIP_C
}
""",
    "wavenet1",
    ({"B": 1, "RESIDUAL_C": 2, "RECEPTIVE_FIELD": 7, "DILATION_C": 3, "SKIP_C": 2,
      "DILATION_FACTOR": 2},
     {"B": 2, "RESIDUAL_C": 1, "RECEPTIVE_FIELD": 3, "DILATION_C": 1, "SKIP_C": 1,
      "DILATION_FACTOR": 1},
     {"B": 1, "RESIDUAL_C": 3, "RECEPTIVE_FIELD": 11, "DILATION_C": 2, "SKIP_C": 3,
      "DILATION_FACTOR": 4}),
    lambda s, r: (_u(r, (s["B"], s["RESIDUAL_C"], s["RECEPTIVE_FIELD"])),
                  _u(r, (s["DILATION_C"], s["RESIDUAL_C"], 2)), _u(r, (s["DILATION_C"],)),
                  _u(r, (s["DILATION_C"], s["RESIDUAL_C"], 2)), _u(r, (s["DILATION_C"],)),
                  _u(r, (s["RESIDUAL_C"], s["DILATION_C"])), _u(r, (s["RESIDUAL_C"],)),
                  _u(r, (s["SKIP_C"], s["DILATION_C"])), _u(r, (s["SKIP_C"],)),
                  _u(r, (s["DILATION_FACTOR"],))),
    _wavenet_ref,
    tags=("tc", "conv", "guarded", "multi_output", "size_value", "accumulate"),
)

# ---- language features ------------------------------------------------------------------

_add(
    "pad_guarded",
    """
# zero padding on both sides: the guarded read does not constrain i's range
def pad(float(N) I) -> (O) {
    O(i) = (i >= 1 && i <= N) ? I(i - 1) : 0 where i in 0:N+2
}
""",
    "pad",
    ({"N": 1}, {"N": 7}, {"N": 4}),
    lambda s, r: (_u(r, (s["N"],)),),
    lambda I: np.pad(I, 1).astype(F32),
    tags=("guarded", "padding"),
)

_add(
    "reverse",
    """
# reversal: affine subscripts with negative coefficients
def reverse(float(N) A, float(P, M) B) -> (O, R) {
    O(i) = A(N - 1 - i)
    R(p, j) = B(p, M - 1 - j)
}
""",
    "reverse",
    ({"N": 1, "P": 2, "M": 7}, {"N": 11, "P": 1, "M": 1}, {"N": 4, "P": 3, "M": 2}),
    lambda s, r: (_u(r, (s["N"],)), _u(r, (s["P"], s["M"]))),
    lambda A, B: (A[::-1].copy(), np.ascontiguousarray(B[:, ::-1])),
    tags=("affine",),
)

_add(
    "mod_div_subscripts",
    """
# i % 3 and i / 2 in subscripts: i's range comes from A(i / 2), exactly 0:2*N
def moddiv(float(N) A, float(3) T) -> (O) {
    O(i) = T(i % 3) + A(i / 2)
}
""",
    "moddiv",
    ({"N": 1}, {"N": 7}, {"N": 4}),
    lambda s, r: (_u(r, (s["N"],)), _u(r, (3,))),
    lambda A, T: _f32(_d(T)[np.arange(2 * len(A)) % 3] + _d(A)[np.arange(2 * len(A)) // 2]),
    tags=("divmod", "literal_dims"),
)

_add(
    "strided_subsample",
    """
# every third row, every second column starting at 1
def subsample(float(H, W) I) -> (O) {
    O(i, j) = I(3 * i, 2 * j + 1)
}
""",
    "subsample",
    ({"H": 1, "W": 2}, {"H": 7, "W": 11}, {"H": 4, "W": 3}, {"H": 13, "W": 6}),
    lambda s, r: (_u(r, (s["H"], s["W"])),),
    lambda I: np.ascontiguousarray(I[::3, 1::2]),
    tags=("strided",),
)

_add(
    "exists",
    """
# Y fixes j's range but is never read
def broadcast(float(N) X, float(M) Y) -> (O) {
    O(i, j) = X(i) * 2.0 + float(j) where exists Y(j)
}
""",
    "broadcast",
    ({"N": 1, "M": 7}, {"N": 11, "M": 1}, {"N": 3, "M": 4}),
    lambda s, r: (_u(r, (s["N"],)), np.full((s["M"],), np.nan, dtype=F32)),
    lambda X, Y: _f32(_d(X)[:, None] * 2.0 + np.arange(len(Y))[None, :]),
    tags=("exists", "index_value"),
)

_add(
    "where_locals",
    """
# locals may use earlier (or later) locals; each is inlined where used
def locals_(float(N) A, float(N) B) -> (O) {
    O(i) = x * x + y where x = A(i) + 1.0, y = x * B(i)
}
""",
    "locals_",
    ({"N": 1}, {"N": 7}, {"N": 12}),
    lambda s, r: (_u(r, (s["N"],)), _u(r, (s["N"],))),
    lambda A, B: _f32((_d(A) + 1) ** 2 + (_d(A) + 1) * _d(B)),
    tags=("where",),
)

_add(
    "scalar_inputs",
    """
# 0-d inputs, written bare and with ()
def axpby(float a, float(N) X, float b, float(N) Y) -> (Z) {
    Z(i) = a * X(i) + b() * Y(i)
}
""",
    "axpby",
    ({"N": 1}, {"N": 7}, {"N": 12}),
    lambda s, r: (_u(r, ()), _u(r, (s["N"],)), _u(r, ()), _u(r, (s["N"],))),
    lambda a, X, b, Y: _f32(_d(a) * _d(X) + _d(b) * _d(Y)),
    tags=("scalar_input",),
)

_add(
    "scalar_output",
    """
# 0-d outputs: a dot product, a total, a max and a 0-d statement that rescales
def dot(float(N) X, float(N) Y, float(P, Q) A) -> (s, total, mx) {
    s +=! X(i) * Y(i)
    total +=! A(p, q)
    total = total * 0.5
    mx max=! A(p, q)
}
""",
    "dot",
    ({"N": 1, "P": 2, "Q": 7}, {"N": 11, "P": 1, "Q": 1}, {"N": 4, "P": 13, "Q": 3}),
    lambda s, r: (_u(r, (s["N"],)), _u(r, (s["N"],)), _u(r, (s["P"], s["Q"]))),
    lambda X, Y, A: (_f32(_d(X) @ _d(Y)), _f32(_d(A).sum() * 0.5), _f32(A.max())),
    tags=("scalar_output", "reduction"),
)

_add(
    "reduction_ops",
    """
# the four resetting reductions; min/max also on integers (identities +-max of int32)
def reductions(float(N, M) A, int32(N, M) K) -> (S, P, Mn, Mx, Kmin, Kmax) {
    S(i) +=! A(i, j)
    P(i) *=! A(i, j)
    Mn(i) min=! A(i, j)
    Mx(i) max=! A(i, j)
    Kmin(i) min=! K(i, j)
    Kmax(i) max=! K(i, j)
}
""",
    "reductions",
    ({"N": 1, "M": 7}, {"N": 11, "M": 1}, {"N": 3, "M": 12}),
    lambda s, r: (_u(r, (s["N"], s["M"]), 0.5, 1.5), _i(r, (s["N"], s["M"]), -1000, 1000)),
    lambda A, K: (_f32(_d(A).sum(1)), _f32(_d(A).prod(1)), A.min(1), A.max(1),
                  K.min(1), K.max(1)),
    tags=("reduction",),
)

_add(
    "reduction_3_indices",
    """
def reduce3(float(N, A, B, C) X) -> (S, Mx) {
    S(i) +=! X(i, a, b, c) * X(i, a, b, c)
    Mx(i) max=! X(i, a, b, c)
}
""",
    "reduce3",
    ({"N": 1, "A": 2, "B": 7, "C": 3}, {"N": 3, "A": 1, "B": 1, "C": 11},
     {"N": 2, "A": 3, "B": 2, "C": 1}),
    lambda s, r: (_u(r, (s["N"], s["A"], s["B"], s["C"])),),
    lambda X: (_f32((_d(X) ** 2).sum(axis=(1, 2, 3))), X.max(axis=(1, 2, 3))),
    tags=("reduction", "reduction3"),
)

_add(
    "prefix_sum",
    """
# an inclusive scan as a guarded reduction: reads with j > i are skipped
def prefix(float(N) A) -> (O) {
    O(i) +=! (j <= i) ? A(j) : 0.0 where i in 0:N, j in 0:N
}
""",
    "prefix",
    ({"N": 1}, {"N": 7}, {"N": 12}),
    lambda s, r: (_u(r, (s["N"],)),),
    lambda A: _f32(np.cumsum(_d(A))),
    tags=("guarded", "reduction"),
)

_add(
    "outer_product",
    """
def outer(float(N) X, float(M) Y) -> (O) {
    O(i, j) = X(i) * Y(j)
}
""",
    "outer",
    ({"N": 1, "M": 7}, {"N": 11, "M": 1}, {"N": 4, "M": 5}),
    lambda s, r: (_u(r, (s["N"],)), _u(r, (s["M"],))),
    lambda X, Y: _f32(np.outer(_d(X), _d(Y))),
)

_add(
    "int32_ops",
    """
# exact integer arithmetic; literals are int32
def int_ops(int32(N, M) A, int32(M) B) -> (S, D) {
    S(i) +=! A(i, j) * B(j)
    D(i, j) = A(i, j) * 3 - B(j) + i
}
""",
    "int_ops",
    ({"N": 1, "M": 7}, {"N": 11, "M": 1}, {"N": 4, "M": 13}),
    lambda s, r: (_i(r, (s["N"], s["M"]), -100, 100), _i(r, (s["M"],), -100, 100)),
    lambda A, B: ((A.astype(I64) @ B.astype(I64)).astype(I32),
                  (A * 3 - B[None, :] + np.arange(A.shape[0], dtype=I32)[:, None]).astype(I32)),
    tags=("int",),
)

_add(
    "int64_ops",
    """
# values beyond 32 bits: int64 with int32 gives int64
def int64_ops(int64(N) A, int32(N) B) -> (O, S) {
    O(i) = A(i) * B(i) + 1
    S +=! A(i)
}
""",
    "int64_ops",
    ({"N": 1}, {"N": 7}, {"N": 12}),
    lambda s, r: (_i(r, (s["N"],), -(2 ** 40), 2 ** 40, I64), _i(r, (s["N"],), -1000, 1000)),
    lambda A, B: (A * B.astype(I64) + 1, np.asarray(A.sum(), dtype=I64)),
    tags=("int",),
)

_add(
    "small_ints",
    """
# int8 and uint8: int8 + int8 stays int8; uint8 + uint8 wraps modulo 256
def small_ints(int8(N) A, int8(N) B, uint8(N) C) -> (S, U, W, Mx) {
    S(i) = A(i) + B(i)
    U(i) = C(i) + C(i)
    W(i) = int32(A(i)) * int32(C(i))
    Mx max=! A(i)
}
""",
    "small_ints",
    ({"N": 1}, {"N": 7}, {"N": 13}),
    lambda s, r: (_i(r, (s["N"],), -60, 60, I8), _i(r, (s["N"],), -60, 60, I8),
                  _i(r, (s["N"],), 0, 256, U8)),
    lambda A, B, C: ((A + B).astype(I8), (C.astype(np.int64) * 2 % 256).astype(U8),
                     A.astype(I32) * C.astype(I32), np.asarray(A.max(), dtype=I8)),
    tags=("int", "wraparound", "scalar_output"),
)

_add(
    "float64",
    """
# double throughout: a float literal with a double tensor is a double
def f64(double(N, M) A, double(M) x) -> (y, z) {
    y(i) +=! A(i, j) * x(j)
    z(i) = y(i) * 0.1 + exp(y(i) / 10.0)
}
""",
    "f64",
    ({"N": 1, "M": 7}, {"N": 11, "M": 1}, {"N": 4, "M": 12}),
    lambda s, r: (_u(r, (s["N"], s["M"]), dtype=F64), _u(r, (s["M"],), dtype=F64)),
    lambda A, x: (A @ x, (A @ x) * 0.1 + np.exp((A @ x) / 10.0)),
    rtol=1e-12, atol=1e-14,
    tags=("float64",),
)


def _f16_ref(A, x):
    A32, x32 = A.astype(F32), x.astype(F32)
    y = (A32 * x32[None, :] + A32).astype(F16)
    z = (A32 * x32[None, :]).astype(F64).sum(axis=1).astype(F32)
    s = A32.astype(F64).sum(axis=1).astype(F16)
    return y, z, s


_add(
    "float16",
    """
# half is stored as half and computed in float32
def f16(half(N, M) A, half(M) x) -> (y, z, s) {
    y(i, j) = A(i, j) * x(j) + A(i, j)
    z(i) +=! float(A(i, j)) * float(x(j))
    s(i) +=! A(i, j)
}
""",
    "f16",
    ({"N": 1, "M": 7}, {"N": 11, "M": 1}, {"N": 3, "M": 5}),
    lambda s, r: (_u(r, (s["N"], s["M"]), dtype=F16), _u(r, (s["M"],), dtype=F16)),
    _f16_ref,
    rtol=3e-3, atol=3e-3,
    tags=("float16",),
)

def _bf16_ref(A, x):
    A32, x32 = as_numpy(A), as_numpy(x)
    y = _to_bf16(A32 * x32[None, :] + A32)
    z = torch_of((A32 * x32[None, :]).astype(F64).sum(axis=1).astype(F32))
    s = _to_bf16(A32.astype(F64).sum(axis=1))
    return y, z, s


def torch_of(x):
    """A NumPy reference result as the torch tensor a call with torch inputs returns."""
    import torch
    return torch.from_numpy(np.array(x, order="C"))


_add(
    "bfloat16",
    """
# bfloat16 (bf16) is stored in 16 bits and computed in float32, as half
def bf(bfloat16(N, M) A, bf16(M) x) -> (y, z, s) {
    y(i, j) = A(i, j) * x(j) + A(i, j)
    z(i) +=! float(A(i, j)) * float(x(j))
    s(i) +=! A(i, j)
}
""",
    "bf",
    ({"N": 1, "M": 7}, {"N": 11, "M": 1}, {"N": 3, "M": 5}, {"N": 13, "M": 16}),
    lambda s, r: (_bf16(r, (s["N"], s["M"])), _bf16(r, (s["M"],))),
    _bf16_ref,
    rtol=1.6e-2, atol=1.6e-2,
    tags=("bfloat16", "reduction"),
)

_add(
    "bfloat16_matmul",
    """
# a bfloat16 matmul: float32 accumulators, one rounding to bfloat16 per element
def bmm(bf16(M, K) A, bf16(K, N) B) -> (C) {
    C(m, n) +=! A(m, k) * B(k, n)
}
""",
    "bmm",
    ({"M": 3, "K": 7, "N": 1}, {"M": 1, "K": 4, "N": 11}, {"M": 13, "K": 1, "N": 5},
     {"M": 6, "K": 9, "N": 7}, {"M": 16, "K": 13, "N": 15}),
    lambda s, r: (_bf16(r, (s["M"], s["K"])), _bf16(r, (s["K"], s["N"]))),
    lambda A, B: _to_bf16(_d(A) @ _d(B)),
    rtol=1.6e-2, atol=1.6e-2,
    tags=("bfloat16", "reduction"),
)


def _bf16_mixed_ref(X, B, H, I):
    B32, H32 = as_numpy(B), H.astype(F32)
    tenth = float(as_numpy(_to_bf16(np.float32(0.1))))
    return (_to_bf16(X * F32(3.0)), _to_bf16(B32 * I.astype(F32)), torch_of(B32 + H32),
            torch_of(np.trunc(B32 * F32(100.0)).astype(I32)), _to_bf16(B32.max()),
            torch_of(B32.astype(F16)), _to_bf16(B32 + F32(tenth)),
            torch_of(_f32(np.exp(_d(B32)))))


_add(
    "bfloat16_mixed",
    """
# casts to and from bfloat16; bfloat16 with an integer stays bfloat16, with half (or a
# float literal) it is float; a max reduction in bfloat16; a bfloat16 literal
def bmix(float(N) X, bf16(N) B, half(N) H, int32(N) I) -> (R, C, D, F, M, G, L, E) {
    R(i) = bfloat16(X(i) * 3.0)
    C(i) = B(i) * I(i)
    D(i) = B(i) + H(i)
    F(i) = int32(B(i) * 100.0)
    M max=! B(i)
    G(i) = half(B(i))
    L(i) = B(i) + bfloat16(0.1)
    E(i) = exp(B(i))
}
""",
    "bmix",
    ({"N": 1}, {"N": 7}, {"N": 13}, {"N": 16}),
    lambda s, r: (_u(r, (s["N"],), -2.0, 2.0), _bf16(r, (s["N"],), -2.0, 2.0),
                  _u(r, (s["N"],), dtype=F16), _i(r, (s["N"],), -5, 6)),
    _bf16_mixed_ref,
    rtol=1.6e-2, atol=1.6e-2,
    tags=("bfloat16", "casts"),
)

_add(
    "int_div_mod",
    """
# integer / rounds toward -inf, % takes the divisor's sign (Python's // and %)
def divmod_(int32(N) A, int32(N) B) -> (Q, R, Q3, R3, Qi) {
    Q(i) = A(i) / B(i)
    R(i) = A(i) % B(i)
    Q3(i) = A(i) / -3
    R3(i) = A(i) % 3
    Qi(i) = (i - 3) / 2 + (i - 5) % 4 where i in 0:N
}
""",
    "divmod_",
    ({"N": 1}, {"N": 7}, {"N": 13}),
    lambda s, r: (_i(r, (s["N"],), -20, 21),
                  np.where(_i(r, (s["N"],), 0, 2) == 0, -1, 1).astype(I32)
                  * _i(r, (s["N"],), 1, 8)),
    lambda A, B: (A // B, A % B, A // -3, A % 3,
                  ((np.arange(len(A)) - 3) // 2 + (np.arange(len(A)) - 5) % 4).astype(I32)),
    tags=("int", "divmod", "index_value"),
)


def _casts_ref(X, I):
    return (np.trunc(X).astype(I32), (I.astype(F64) / 2).astype(F32),
            X.astype(F64) * 1.5, np.trunc(_d(X) * 100.0).astype(I64),
            (X > 0).astype(F32), I.astype(I8))


_add(
    "casts",
    """
# float -> int truncates toward zero; bool -> float is 0/1; int32 -> int8 in range
def casts(float(N) X, int32(N) I) -> (T, F, D, L, Bf, S) {
    T(i) = int32(X(i))
    F(i) = float(I(i)) / 2
    D(i) = double(X(i)) * 1.5
    L(i) = int64(X(i) * 100.0)
    Bf(i) = float(X(i) > 0)
    S(i) = int8(I(i))
}
""",
    "casts",
    ({"N": 1}, {"N": 7}, {"N": 13}),
    lambda s, r: (_u(r, (s["N"],), -5.0, 5.0), _i(r, (s["N"],), -100, 100)),
    _casts_ref,
    tags=("cast",),
)


def _unary_ref(X, P):
    X, P = _d(X), _d(P)
    return tuple(_f32(v) for v in (
        np.exp(X), np.log(P), np.tanh(X), _sigmoid(X), _erf(X), 1 / np.sqrt(P), np.sqrt(P),
        np.abs(X), np.floor(X * 3), np.ceil(X * 3), _c_round(X * 3), np.trunc(X * 3),
        np.expm1(X), np.log1p(P), np.cbrt(X), np.sin(X), np.cos(X), np.atan(X), np.log2(P),
        np.exp2(X)))


_add(
    "builtins_unary",
    """
def unary(float(N) X, float(N) P) -> (E, L, T, S, Er, R, Q, A, Fl, Ce, Ro, Tr, Em, Lp, Cb,
                                      Si, Co, At, L2, E2) {
    E(i) = exp(X(i))
    L(i) = log(P(i))
    T(i) = tanh(X(i))
    S(i) = sigmoid(X(i))
    Er(i) = erf(X(i))
    R(i) = rsqrt(P(i))
    Q(i) = sqrt(P(i))
    A(i) = abs(X(i))
    Fl(i) = floor(X(i) * 3)
    Ce(i) = ceil(X(i) * 3)
    Ro(i) = round(X(i) * 3)
    Tr(i) = trunc(X(i) * 3)
    Em(i) = expm1(X(i))
    Lp(i) = log1p(P(i))
    Cb(i) = cbrt(X(i))
    Si(i) = sin(X(i))
    Co(i) = cos(X(i))
    At(i) = atan(X(i))
    L2(i) = log2(P(i))
    E2(i) = exp2(X(i))
}
""",
    "unary",
    ({"N": 1}, {"N": 7}, {"N": 12}),
    lambda s, r: (_u(r, (s["N"],), -2.0, 2.0), _u(r, (s["N"],), 0.25, 4.0)),
    _unary_ref,
    tags=("builtins",),
)


def _binary_ref(X, Y, P, K):
    X, Y, P = _d(X), _d(Y), _d(P)
    f = tuple(_f32(v) for v in (
        P ** X, X * Y + P, np.minimum(X, Y), np.maximum(X, Y), np.maximum(X, 0.0),
        np.minimum(X, Y), np.arctan2(X, Y), np.hypot(X, Y), np.fmod(X, P),
        np.copysign(P, X), np.maximum(X - Y, 0.0)))
    ints = (np.minimum(K, 3).astype(I32), np.maximum(K, -3).astype(I32), np.abs(K).astype(I32))
    return f + ints


_add(
    "builtins_binary",
    """
def binary(float(N) X, float(N) Y, float(N) P, int32(N) K) -> (Pw, Fm, Mn, Mx, Fx, Fn, A2, Hy,
                                                               Fmod, Cs, Fd, Ki, Ka, Kabs) {
    Pw(i) = pow(P(i), X(i))
    Fm(i) = fma(X(i), Y(i), P(i))
    Mn(i) = min(X(i), Y(i))
    Mx(i) = max(X(i), Y(i))
    Fx(i) = fmax(X(i), 0)
    Fn(i) = fmin(X(i), Y(i))
    A2(i) = atan2(X(i), Y(i))
    Hy(i) = hypot(X(i), Y(i))
    Fmod(i) = fmod(X(i), P(i))
    Cs(i) = copysign(P(i), X(i))
    Fd(i) = fdim(X(i), Y(i))
    Ki(i) = min(K(i), 3)
    Ka(i) = max(K(i), -3)
    Kabs(i) = abs(K(i))
}
""",
    "binary",
    ({"N": 1}, {"N": 7}, {"N": 12}),
    lambda s, r: (_u(r, (s["N"],), -2.0, 2.0), _u(r, (s["N"],), -2.0, 2.0),
                  _u(r, (s["N"],), 0.25, 4.0), _i(r, (s["N"],), -10, 10)),
    _binary_ref,
    tags=("builtins",),
)

_add(
    "data_dependent_ternary",
    """
# conditions on data: not affine, so every read counts for inference
def select(float(N) X, float(N) Y) -> (O, C) {
    O(i) = X(i) > Y(i) ? X(i) - Y(i) : Y(i) * 2.0
    C(i) = X(i) < -0.5 ? -0.5 : X(i) > 0.5 ? 0.5 : X(i)
}
""",
    "select",
    ({"N": 1}, {"N": 7}, {"N": 12}),
    lambda s, r: (_u(r, (s["N"],)), _u(r, (s["N"],))),
    lambda X, Y: (_f32(np.where(X > Y, _d(X) - _d(Y), _d(Y) * 2.0)),
                  _f32(np.clip(_d(X), -0.5, 0.5))),
    tags=("ternary",),
)

_add(
    "gather_guarded",
    """
# a data-dependent ternary guards a gather: negative ids mean "no entry" and are never read
def gather_or_zero(float(E) T, int32(N) Ids) -> (O, P) {
    O(i) = Ids(i) >= 0 ? T(Ids(i)) : 0.0
    P(i) = T(Ids(i) / 2 + E / 2)
}
""",
    "gather_or_zero",
    ({"E": 1, "N": 3}, {"E": 7, "N": 1}, {"E": 4, "N": 11}),
    lambda s, r: (_u(r, (s["E"],)),
                  np.where(_i(r, (s["N"],), 0, 3) == 0, -1,
                           _i(r, (s["N"],), 0, s["E"])).astype(I32)),
    lambda T, Ids: (np.where(Ids >= 0, T[np.maximum(Ids, 0)], 0).astype(F32),
                    T[Ids // 2 + len(T) // 2].astype(F32)),
    tags=("gather", "ternary"),
)

_add(
    "comparisons_logic",
    """
def logic(float(N) X, float(N) Y) -> (Gt, Both, Any, Not, Eq, Sel) {
    Gt(i) = X(i) > Y(i)
    Both(i) = X(i) > 0 && Y(i) > 0
    Any(i) = X(i) > 0.5 || Y(i) < -0.5
    Not(i) = !(X(i) <= Y(i))
    Eq(i) = X(i) == X(i) && X(i) != Y(i) && i >= 1
    Sel(i) = (X(i) >= 0 || !(Y(i) >= 0)) ? 1 : -1
}
""",
    "logic",
    ({"N": 1}, {"N": 7}, {"N": 13}),
    lambda s, r: (_u(r, (s["N"],)), _u(r, (s["N"],))),
    lambda X, Y: (X > Y, (X > 0) & (Y > 0), (X > 0.5) | (Y < -0.5), ~(X <= Y),
                  (X == X) & (X != Y) & (np.arange(len(X)) >= 1),
                  np.where((X >= 0) | ~(Y >= 0), 1, -1).astype(I32)),
    tags=("bool", "ternary"),
)

_add(
    "concat_two_statements",
    """
# one output written by two statements over disjoint ranges: its extent is the larger bound
def concat(float(N) A, float(M) B) -> (O) {
    O(i) = A(i) where i in 0:N
    O(i) = B(i - N)
}
""",
    "concat",
    ({"N": 1, "M": 7}, {"N": 11, "M": 1}, {"N": 4, "M": 3}),
    lambda s, r: (_u(r, (s["N"],)), _u(r, (s["M"],))),
    lambda A, B: np.concatenate([A, B]).astype(F32),
    tags=("multi_statement",),
)

_add(
    "border_overwrite",
    """
# a zero border: the second statement overwrites the interior the first one set
def border(float(N, M) A) -> (O) {
    O(i, j) = 0.0 where i in 0:N+2, j in 0:M+2
    O(i, j) = A(i - 1, j - 1) where i in 1:N+1, j in 1:M+1
}
""",
    "border",
    ({"N": 1, "M": 7}, {"N": 11, "M": 1}, {"N": 3, "M": 4}),
    lambda s, r: (_u(r, (s["N"], s["M"]), 1.0, 2.0),),
    lambda A: np.pad(A, 1).astype(F32),
    tags=("multi_statement", "padding"),
)

_add(
    "fused_temporary",
    """
# T and U are temporaries: under fusion they need not be stored at all
def fused(float(N, M) A, float(N, M) B) -> (O) {
    T(i, j) = A(i, j) * 2.0
    U(i, j) = T(i, j) + B(i, j)
    O(i, j) = U(i, j) * U(i, j)
}
""",
    "fused",
    ({"N": 1, "M": 7}, {"N": 11, "M": 1}, {"N": 4, "M": 5}),
    lambda s, r: (_u(r, (s["N"], s["M"])), _u(r, (s["N"], s["M"]))),
    lambda A, B: _f32((_d(A) * 2 + _d(B)) ** 2),
    tags=("temporary", "fusion"),
)

_add(
    "sizes_indices_as_values",
    """
def iota(float(N, M) A) -> (O, L) {
    O(i, j) = float(i) * 10.0 + float(j) + A(i, j) / N + M
    L(i, j) = i * M + j where exists A(i, j)
}
""",
    "iota",
    ({"N": 1, "M": 7}, {"N": 11, "M": 1}, {"N": 3, "M": 4}),
    lambda s, r: (_u(r, (s["N"], s["M"])),),
    lambda A: (_f32(np.arange(A.shape[0])[:, None] * 10.0 + np.arange(A.shape[1])[None, :]
                    + _d(A) / A.shape[0] + A.shape[1]),
               np.arange(A.size, dtype=I32).reshape(A.shape)),
    tags=("size_value", "index_value", "exists"),
)

_add(
    "accumulate_warning",
    """
# += with no earlier write warns and accumulates into the zeroed output
def acc(float(N, M) A) -> (O) {
    O(i) += A(i, j)
}
""",
    "acc",
    ({"N": 1, "M": 7}, {"N": 11, "M": 1}, {"N": 4, "M": 3}),
    lambda s, r: (_u(r, (s["N"], s["M"])),),
    lambda A: _f32(_d(A).sum(axis=1)),
    tags=("warns", "accumulate", "reduction"),
)

_add(
    "reduce_into_existing",
    """
# ! resets even after an earlier write; without ! the reduction continues from it
def reduce_into(float(N) A, float(N, M) B) -> (O, P, Q, R) {
    O(i) = A(i)
    O(i) +=! B(i, j)
    P(i) = A(i)
    P(i) += B(i, j)
    Q(i) = 2.0 where i in 0:N
    Q(i) *= B(i, j)
    R(i) = 0.0 where i in 0:N
    R(i) max= B(i, j)
}
""",
    "reduce_into",
    ({"N": 1, "M": 7}, {"N": 11, "M": 1}, {"N": 4, "M": 3}),
    lambda s, r: (_u(r, (s["N"],)), _u(r, (s["N"], s["M"]), -1.0, 1.5)),
    lambda A, B: (_f32(_d(B).sum(1)), _f32(_d(A) + _d(B).sum(1)), _f32(2 * _d(B).prod(1)),
                  _f32(np.maximum(B.max(1), 0.0))),
    tags=("accumulate", "reduction", "multi_statement"),
)

_add(
    "other_int_types",
    """
# int16, uint16, uint32, uint64 and bool inputs; int16 with an int32 literal gives int32,
# uint32 with uint64 gives uint64, -int16 stays int16
def ints(int16(N) A, uint16(N) B, uint32(N) C, uint64(N) D, bool(N) E) -> (T, B2, U, Sel, Neg, F) {
    T(i) = A(i) * 2
    B2(i) = B(i) + B(i)
    U(i) = C(i) + D(i)
    Sel(i) = E(i) ? A(i) : 0
    Neg(i) = -A(i)
    F(i) = E(i) && A(i) > 0 || !E(i) && B(i) > 100
}
""",
    "ints",
    ({"N": 1}, {"N": 7}, {"N": 13}),
    lambda s, r: (_i(r, (s["N"],), -1000, 1000, np.int16), _i(r, (s["N"],), 0, 10000, np.uint16),
                  _i(r, (s["N"],), 0, 2 ** 31, np.uint32), _i(r, (s["N"],), 0, 2 ** 40, np.uint64),
                  _i(r, (s["N"],), 0, 2, np.bool_)),
    lambda A, B, C, D, E: (A.astype(I32) * 2, (B * 2).astype(np.uint16),
                           C.astype(np.uint64) + D, np.where(E, A, 0).astype(I32),
                           (-A).astype(np.int16), (E & (A > 0)) | (~E & (B > 100))),
    tags=("int", "bool"),
)

_add(
    "stencil",
    """
# a 3-point stencil: i's range shrinks to 0:N-2 so that A(b, i + 2) stays in bounds
def stencil(float(B, N) A) -> (O) {
    O(b, i) = A(b, i) + 2.0 * A(b, i + 1) + A(b, i + 2)
}
""",
    "stencil",
    ({"B": 1, "N": 3}, {"B": 2, "N": 7}, {"B": 3, "N": 11}),
    lambda s, r: (_u(r, (s["B"], s["N"])),),
    lambda A: _f32(_d(A)[:, :-2] + 2 * _d(A)[:, 1:-1] + _d(A)[:, 2:]),
    tags=("affine",),
)

_add(
    "where_subrange",
    """
# `where` narrower than what inference allows: only the interior columns are summed
def interior(float(N, M) A) -> (O) {
    O(i) +=! A(i, j) where j in 1:M-1
}
""",
    "interior",
    ({"N": 1, "M": 3}, {"N": 7, "M": 4}, {"N": 2, "M": 11}),
    lambda s, r: (_u(r, (s["N"], s["M"])),),
    lambda A: _f32(_d(A)[:, 1:-1].sum(axis=1)),
    tags=("where", "reduction"),
)

_MULTI_DEF = """
def scale(float(N) X, float s) -> (Y) { Y(i) = X(i) * s }   # three defs in one source
def affine(float(N, M) X, float(M) w, float b) -> (Y) {
    Y(i) +=! X(i, j) * w(j)
    Y(i) = Y(i) + b
}
def relu(float(N) X) -> (Y) { Y(i) = fmax(X(i), 0) }
"""

_add(
    "multi_def_middle",
    _MULTI_DEF,
    "affine",
    ({"N": 1, "M": 7}, {"N": 11, "M": 1}, {"N": 4, "M": 3}),
    lambda s, r: (_u(r, (s["N"], s["M"])), _u(r, (s["M"],)), _u(r, ())),
    lambda X, w, b: _f32(_d(X) @ _d(w) + _d(b)),
    tags=("multi_def",),
)

_add(
    "multi_def_last",
    _MULTI_DEF,
    "relu",
    ({"N": 1}, {"N": 7}, {"N": 12}),
    lambda s, r: (_u(r, (s["N"],)),),
    lambda X: _f32(_relu(_d(X))),
    tags=("multi_def",),
)


# ---- running ----------------------------------------------------------------------------

def _seed(case: Case, shape: dict[str, int]) -> int:
    key = case.name + ":" + ",".join(f"{k}={v}" for k, v in sorted(shape.items()))
    return zlib.crc32(key.encode())


def make_inputs(case: Case, shape: dict[str, int], layout: str = "C") -> tuple:
    """The case's inputs for `shape`, from a fixed seed; layout "F" gives Fortran order."""
    inputs = tuple(case.make_inputs(shape, np.random.default_rng(_seed(case, shape))))
    if layout == "F":  # np.asfortranarray would turn a 0-d array into a 1-d one
        inputs = tuple(_fortran(a) if a.ndim else a for a in inputs)
    elif layout != "C":
        raise ValueError(f"layout must be 'C' or 'F', not {layout!r}")
    return inputs


def _fortran(a):
    """A Fortran-ordered copy of a NumPy array or torch tensor."""
    if is_tensor(a):
        order = tuple(reversed(range(a.ndim)))
        return a.permute(order).contiguous().permute(order)
    return np.asfortranarray(a)


def _copy(a):
    return a.clone() if is_tensor(a) else np.array(a, copy=True)


def _as_tuple(x) -> tuple:
    return tuple(x) if isinstance(x, tuple) else (x,)


def define(case: Case, backend: str = "reference", options=None):
    """tclang.define for the case's source, with TCWarning recorded rather than raised.

    A case tagged "warns" must warn; the others may not.
    """
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", tclang.TCWarning)
        module = tclang.define(case.source, backend=backend, options=options)
    tc_warnings = [w for w in caught if issubclass(w.category, tclang.TCWarning)]
    if "warns" in case.tags:
        assert tc_warnings, f"{case.name}: expected a TCWarning"
    else:
        assert not tc_warnings, f"{case.name}: unexpected {tc_warnings[0].message}"
    return module


def check_call(case: Case, fn, inputs: tuple) -> tuple[tuple, tuple]:
    """Call fn(*inputs), check the inputs were left alone; (outputs, expected) as tuples."""
    copies = tuple(_copy(a) for a in inputs)
    outputs = _as_tuple(fn(*inputs))
    for k, (a, c) in enumerate(zip(inputs, copies)):
        np.testing.assert_array_equal(as_numpy(a), as_numpy(c),
                                      err_msg=f"{case.name}: input {k} was modified")
    expected = _as_tuple(case.reference(*copies))
    return outputs, expected


def run_case(case: Case, shape: dict[str, int], backend: str = "reference", options=None,
             layout: str = "C") -> tuple[tuple, tuple]:
    """Run `case` on `shape`; returns (outputs, expected), both tuples."""
    inputs = make_inputs(case, shape, layout)
    kernel = define(case, backend, options)[case.entry]
    return check_call(case, kernel, inputs)


def assert_close(outputs, expected, case: Case) -> None:
    """Each output has the expected dtype and shape and matches (exactly if not float)."""
    outputs, expected = _as_tuple(outputs), _as_tuple(expected)
    assert len(outputs) == len(expected), \
        f"{case.name}: {len(outputs)} outputs, expected {len(expected)}"
    for k, (out, exp) in enumerate(zip(outputs, expected)):
        what = f"{case.name}: output {k}"
        if is_tensor(exp):  # torch in, torch out: the dtypes are torch's (bfloat16)
            assert is_tensor(out), f"{what}: a {type(out).__name__}, expected a torch tensor"
            assert out.dtype == exp.dtype, f"{what}: dtype {out.dtype}, expected {exp.dtype}"
        out, exp = as_numpy(out), as_numpy(exp)
        assert out.dtype == exp.dtype, f"{what}: dtype {out.dtype}, expected {exp.dtype}"
        assert out.shape == exp.shape, f"{what}: shape {out.shape}, expected {exp.shape}"
        if np.issubdtype(exp.dtype, np.floating):
            np.testing.assert_allclose(out, exp, rtol=case.rtol, atol=case.atol, err_msg=what)
        else:
            np.testing.assert_array_equal(out, exp, err_msg=what)


CASES_BY_NAME = {c.name: c for c in CASES}
