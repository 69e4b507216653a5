"""Triangles and padding, each in one definition: a lower-triangular matmul and a causal
softmax over `where j in 0:i + 1` (the loops walk the triangle only), and a padded
convolution and TC's concat whose batch and channel ranges come from guarded reads."""

import numpy as np

import tclang as tc
from _check import check, timed

SOURCE = """
def trimm(float(N, N) L, float(N, K) B) -> (C) {
    C(i, k) +=! L(i, j) * B(j, k) where j in 0:i + 1
}
def causal_softmax(float(T, T) S) -> (P) {
    Mx(i) max=! S(i, j) where j in 0:i + 1
    E(i, j) = exp(S(i, j) - Mx(i)) where j in 0:i + 1
    Sm(i) +=! E(i, j) where j in 0:i + 1
    P(i, j) = E(i, j) / Sm(i) where j in 0:i + 1
}
def conv_pad1(float(B, C, H, W) I, float(F, C, 3, 3) Wt) -> (O) {
    O(n, f, h, w) +=! (h + kh - 1 >= 0 && h + kh - 1 < H && w + kw - 1 >= 0 && w + kw - 1 < W)
        ? I(n, c, h + kh - 1, w + kw - 1) * Wt(f, c, kh, kw) : 0
        where h in 0:H, w in 0:W, kh in 0:3, kw in 0:3
}
def concat(float(M, N) A, float(M, N) B) -> (O1) {
    O1(n, i, m) = i == 0 ? A(m, n) : B(m, n) where i in 0:2
}
"""


def _causal_softmax(S):
    masked = np.where(np.tri(len(S), dtype=bool), S, -np.inf)
    e = np.exp(masked - masked.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def _conv_pad1(I, Wt):
    H, W = I.shape[2:]
    P = np.pad(I, ((0, 0), (0, 0), (1, 1), (1, 1)))
    return sum(np.einsum("nchw,fc->nfhw", P[:, :, kh:kh + H, kw:kw + W], Wt[:, :, kh, kw])
               for kh in range(3) for kw in range(3))


def main(n: int = 257, t: int = 129) -> None:
    rng = np.random.default_rng(0)
    mod = tc.define(SOURCE)
    L, B = rng.standard_normal((n, n), np.float32), rng.standard_normal((n, 64), np.float32)
    check("lower-triangular matmul", mod.trimm(L, B), np.tril(L) @ B, rtol=1e-3)
    S = rng.standard_normal((t, t), np.float32)
    check("causal softmax", mod.causal_softmax(S), _causal_softmax(S))
    I, Wt = rng.standard_normal((2, 8, 17, 19), np.float32), \
        rng.standard_normal((4, 8, 3, 3), np.float32)
    check("padded convolution", mod.conv_pad1(I, Wt), _conv_pad1(I, Wt), rtol=1e-3)
    A, Bc = rng.standard_normal((5, 7), np.float32), rng.standard_normal((5, 7), np.float32)
    check("concat", mod.concat(A, Bc), np.stack([A.T, Bc.T], axis=1))
    ours = timed(mod.trimm, L, B)
    theirs = timed(lambda x, y: np.tril(x) @ y, L, B)
    print(f"lower-triangular matmul {n}x{n} by {n}x64: tclang {ours * 1e3:.2f} ms, "
          f"NumPy (tril then matmul) {theirs * 1e3:.2f} ms")
    ours = timed(mod.causal_softmax, S)
    theirs = timed(_causal_softmax, S)
    print(f"causal softmax {t}x{t}: tclang {ours * 1e3:.2f} ms, NumPy {theirs * 1e3:.2f} ms")
    ours = timed(mod.conv_pad1, I, Wt)
    theirs = timed(_conv_pad1, I, Wt)
    print(f"padded 3x3 convolution {I.shape} by {Wt.shape}: tclang {ours * 1e3:.2f} ms, "
          f"NumPy (pad, then nine einsums) {theirs * 1e3:.2f} ms")


if __name__ == "__main__":
    main()
