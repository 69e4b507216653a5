"""A fully connected layer with bias and ReLU: the epilogue fuses into the reduction."""

import numpy as np

import tclang as tc
from _check import check

SOURCE = """
def mlp_layer(float(B,I) X, float(O,I) W, float(O) bias) -> (Y) {
    Y(b, o) +=! X(b, i) * W(o, i)
    Y(b, o)  = fmax(Y(b, o) + bias(o), 0)
}
"""


def main(batch: int = 64, features: int = 128, outputs: int = 96) -> None:
    rng = np.random.default_rng(0)
    X = rng.standard_normal((batch, features), np.float32)
    W = rng.standard_normal((outputs, features), np.float32)
    bias = rng.standard_normal(outputs, np.float32)
    layer = tc.define(SOURCE).mlp_layer
    check("mlp_layer", layer(X, W, bias), np.maximum(X @ W.T + bias, 0))
    print(layer.compile(X, W, bias).loops)


if __name__ == "__main__":
    main()
