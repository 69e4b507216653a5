"""2-D convolution (NCHW), stride 2, with bias: range inference gives (H - KH) / 2 + 1."""

import numpy as np

import tclang as tc
from _check import check

SOURCE = """
def conv2d(float(N, C, H, W) I, float(M, C, KH, KW) Wt, float(M) bias) -> (O) {
    O(n, m, h, w) +=! I(n, c, 2 * h + kh, 2 * w + kw) * Wt(m, c, kh, kw)
    O(n, m, h, w)  = O(n, m, h, w) + bias(m)
}
"""


def reference(I, Wt, bias):
    kh, kw = Wt.shape[2:]
    windows = np.lib.stride_tricks.sliding_window_view(I, (kh, kw), axis=(2, 3))[:, :, ::2, ::2]
    return np.einsum("nchwij,mcij->nmhw", windows, Wt) + bias[None, :, None, None]


def main() -> None:
    rng = np.random.default_rng(0)
    I = rng.standard_normal((2, 3, 17, 13), np.float32)
    Wt = rng.standard_normal((4, 3, 3, 3), np.float32)
    bias = rng.standard_normal(4, np.float32)
    module = tc.define(SOURCE)
    print(module.conv2d.signature)
    check("conv2d", module.conv2d(I, Wt, bias), reference(I, Wt, bias))


if __name__ == "__main__":
    main()
