"""Guarded and windowed reductions for the generality benchmark, with random parameters:
padded and strided depthwise convolution, max and average pooling with padding, causal
masked attention scores with their softmax, transposed convolution, prefix sums (a guard
or a triangular range), a lower-triangular matmul and a batched trace.

What issue 33 found slow: the reduction's initialisation and the guard (a padding, a mask,
a triangle) kept as branches inside the innermost vector loop. Each kind draws its kernel
size, stride and padding from the seed; `big` picks sizes of a few to tens of ms, else a
few hundred points (the smoke test's).
"""

from __future__ import annotations

import random

import numpy as np

from benchmarks.generality_cases import Case

try:  # optional peer
    import torch
    F = torch.nn.functional
except ImportError:
    torch = F = None


def _windows(x: np.ndarray, k: int, stride: int, pad: int, fill: float) -> np.ndarray:
    """(N, C, HO, WO, k, k) windows of a padded NCHW array, in float64."""
    x = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pad, pad), (pad, pad)),
               constant_values=fill)
    w = np.lib.stride_tricks.sliding_window_view(x, (k, k), axis=(2, 3))
    return w[:, :, ::stride, ::stride]


def _guard(s: int, p: int) -> str:
    """The padding guard of a window read at s*h + kh - p (and the same along w)."""
    return (f"{s}*h + kh >= {p} && {s}*h + kh < H + {p} && "
            f"{s}*w + kw >= {p} && {s}*w + kw < W + {p}")


def _read(s: int, p: int) -> str:
    return f"I(n, c, {s}*h + kh - {p}, {s}*w + kw - {p})"


def _out(k: int, s: int, p: int) -> str:
    return f"h in 0:(H + {2 * p - k}) / {s} + 1, w in 0:(W + {2 * p - k}) / {s} + 1"


def depthwise(rng: random.Random, big: bool) -> Case:
    k, s = rng.choice((3, 5)), rng.choice((1, 2))
    p = rng.randint(0, k // 2)
    n, c, h = (rng.randint(2, 4), rng.choice((32, 48, 64)), rng.randint(28, 57)) if big \
        else (rng.randint(1, 2), rng.randint(2, 5), rng.randint(k, 9))
    source = (f"def dwconv(float(N, C, H, W) I, float(C, {k}, {k}) Wt) -> (O) {{\n"
              f"    O(n, c, h, w) +=! ({_guard(s, p)}) ? {_read(s, p)} * Wt(c, kh, kw) : 0\n"
              f"        where {_out(k, s, p)}, kh in 0:{k}, kw in 0:{k}, n in 0:N, c in 0:C\n}}")
    return Case("window", f"depthwise conv {k}x{k} stride {s} pad {p} N={n} C={c} {h}x{h}",
                source, "dwconv", ((n, c, h, h), (c, k, k)),
                lambda x, w: np.einsum("nchwij,cij->nchw", _windows(x, k, s, p, 0), w),
                torch=lambda x, w: F.conv2d(x, w[:, None], stride=s, padding=p, groups=c),
                torch_text="conv2d(groups=C)", origin="padded/strided depthwise conv")


def pooling(rng: random.Random, big: bool, kind: str) -> Case:
    k, s = rng.choice((2, 3)), rng.choice((1, 2))
    p = rng.randint(0, k // 2)
    n, c, h = (rng.randint(2, 4), rng.choice((32, 64)), rng.randint(28, 57)) if big \
        else (rng.randint(1, 2), rng.randint(1, 4), rng.randint(k, 9))
    if kind == "max":
        op, value, empty = "max=!", _read(s, p), "-1e30"
        ref = lambda x: _windows(x, k, s, p, -np.inf).max(axis=(4, 5))  # noqa: E731
        peer = lambda x: F.max_pool2d(x, k, s, p)  # noqa: E731
    else:
        op, value, empty = "+=!", f"{_read(s, p)} / {float(k * k)}", "0"
        ref = lambda x: _windows(x, k, s, p, 0).mean(axis=(4, 5))  # noqa: E731
        peer = lambda x: F.avg_pool2d(x, k, s, p)  # noqa: E731
    source = (f"def pool(float(N, C, H, W) I) -> (O) {{\n"
              f"    O(n, c, h, w) {op} ({_guard(s, p)}) ? {value} : {empty}\n"
              f"        where {_out(k, s, p)}, kh in 0:{k}, kw in 0:{k}, n in 0:N, c in 0:C\n}}")
    return Case("window", f"{kind} pool {k}x{k} stride {s} pad {p} N={n} C={c} {h}x{h}",
                source, "pool", ((n, c, h, h),), ref, torch=peer,
                torch_text=f"{kind}_pool2d", origin=f"{kind} pooling with padding")


def causal_softmax(rng: random.Random, big: bool) -> Case:
    b, t, d = (rng.randint(2, 8), rng.choice((128, 200, 256, 333)), rng.choice((32, 64))) \
        if big else (rng.randint(1, 2), rng.randint(1, 9), rng.randint(1, 5))
    scale = 1 / d ** 0.5
    source = (f"def causal(float(B, T, D) Q, float(B, T, D) K) -> (P) {{\n"
              f"    S(b, i, j) +=! Q(b, i, d) * K(b, j, d)\n"
              f"    Z(b, i, j) = (j <= i) ? S(b, i, j) * {scale!r} : -1e30\n"
              f"        where b in 0:B, i in 0:T, j in 0:T\n"
              f"    M(b, i) max=! Z(b, i, j)\n"
              f"    E(b, i, j) = exp(Z(b, i, j) - M(b, i))\n"
              f"    L(b, i) +=! E(b, i, j)\n"
              f"    P(b, i, j) = E(b, i, j) / L(b, i)\n}}")

    def ref(q, k):
        s = np.einsum("bid,bjd->bij", q.astype(np.float64), k) * scale
        s = np.where(np.tri(t, dtype=bool), s, -np.inf)
        e = np.exp(s - s.max(axis=2, keepdims=True))
        return e / e.sum(axis=2, keepdims=True)

    def peer(q, k):
        s = (q @ k.transpose(1, 2)) * scale
        mask = torch.ones(t, t, dtype=torch.bool).triu(1)
        return torch.softmax(s.masked_fill(mask, float("-inf")), dim=2)
    return Case("window", f"causal scores+softmax B={b} T={t} D={d}", source, "causal",
                ((b, t, d), (b, t, d)), ref, torch=peer, torch_text="masked_fill+softmax",
                origin="causal-masked attention scores")


def transposed_conv(rng: random.Random, big: bool) -> Case:
    """Stride 2, kernel 3, padding 1, output padding 1 (the output is twice the input):
    output y reads input h where y = 2h - 1 + kh."""
    n, c, m, h = (rng.randint(1, 2), rng.choice((16, 32)), rng.choice((16, 32)),
                  rng.randint(14, 29)) if big else \
        (rng.randint(1, 2), rng.randint(1, 3), rng.randint(1, 3), rng.randint(1, 6))
    ty, tx = "(y + 1 - kh)", "(x + 1 - kw)"
    guard = " && ".join(f"{t} % 2 == 0 && {t} >= 0 && {t} < 2*{e}"
                        for t, e in ((ty, "H"), (tx, "W")))
    source = (f"def tconv(float(N, C, H, W) I, float(C, M, 3, 3) Wt) -> (O) {{\n"
              f"    O(n, m, y, x) +=! ({guard}) ? I(n, c, {ty} / 2, {tx} / 2) * Wt(c, m, kh, kw)"
              f" : 0\n        where y in 0:2*H, x in 0:2*W, kh in 0:3, kw in 0:3, n in 0:N,"
              f" m in 0:M, c in 0:C\n}}")

    def ref(x, w):
        full = np.zeros((n, m, 2 * h + 2, 2 * h + 2))
        for kh in range(3):
            for kw in range(3):
                part = np.einsum("nchw,cm->nmhw", x.astype(np.float64), w[:, :, kh, kw])
                full[:, :, kh:kh + 2 * h:2, kw:kw + 2 * h:2] += part
        return full[:, :, 1:2 * h + 1, 1:2 * h + 1]
    return Case("window", f"transposed conv 3x3 stride 2 N={n} C={c} M={m} {h}x{h}", source,
                "tconv", ((n, c, h, h), (c, m, 3, 3)), ref,
                torch=lambda x, w: F.conv_transpose2d(x, w, stride=2, padding=1,
                                                      output_padding=1),
                torch_text="conv_transpose2d", origin="transposed conv (decoder upsampling)")


def prefix_sum(rng: random.Random, big: bool) -> Case:
    b, n = (rng.randint(64, 256), rng.randint(300, 1100)) if big else \
        (rng.randint(1, 3), rng.randint(1, 11))
    if rng.random() < 0.5:
        body, how = "O(b, i) +=! (j <= i) ? X(b, j) : 0 where j in 0:N, i in 0:N, b in 0:B", \
            "guard"
    else:
        body, how = "O(b, i) +=! X(b, j) where i in 0:N, j in 0:i + 1", "triangle"
    source = f"def prefix(float(B, N) X) -> (O) {{\n    {body}\n}}"
    return Case("window", f"prefix sum ({how}) {b}x{n}", source, "prefix", ((b, n),),
                lambda x: np.cumsum(x.astype(np.float64), axis=1),
                numpy=lambda x, out: np.cumsum(x, axis=1, out=out),
                torch=lambda x: torch.cumsum(x, dim=1), torch_text="cumsum",
                origin="triangular/prefix sum")


def tri_matmul(rng: random.Random, big: bool) -> Case:
    n, k = (rng.randint(300, 700), rng.randint(100, 400)) if big else \
        (rng.randint(1, 9), rng.randint(1, 5))
    source = ("def trimm(float(N, N) L, float(N, K) B) -> (C) {\n"
              "    C(i, k) +=! L(i, j) * B(j, k) where j in 0:i + 1\n}")
    return Case("window", f"lower-triangular matmul {n}x{n}x{k}", source, "trimm",
                ((n, n), (n, k)), lambda a, b: np.tril(a.astype(np.float64)) @ b,
                numpy=lambda a, b, out: np.matmul(np.tril(a), b, out=out),
                torch=lambda a, b: torch.tril(a) @ b, torch_text="tril + matmul",
                origin="triangular matmul")


def batched_trace(rng: random.Random, big: bool) -> Case:
    b, n = (rng.randint(1000, 3000), rng.randint(20, 60)) if big else \
        (rng.randint(1, 5), rng.randint(1, 7))
    return Case("window", f"batched trace {b}x{n}x{n}",
                "def trace(float(B, N, N) A) -> (O) {\n    O(b) +=! A(b, i, i)\n}", "trace",
                ((b, n, n),), lambda a: np.einsum("bii->b", a.astype(np.float64)),
                einsum="bii->b", torch=lambda a: a.diagonal(dim1=1, dim2=2).sum(1),
                torch_text="diagonal().sum", origin="batched trace")


KINDS = (depthwise, lambda r, big: pooling(r, big, "max"), lambda r, big: pooling(r, big, "avg"),
         causal_softmax, transposed_conv, prefix_sum, tri_matmul, batched_trace)


def windows(seed: int, per_kind: int, big: bool) -> list[Case]:
    """`per_kind` cases of every kind, parameters drawn from `seed`."""
    rng = random.Random(seed)
    return [kind(rng, big) for _ in range(per_kind) for kind in KINDS]
