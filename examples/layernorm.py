"""Layer normalization with learned scale and shift; sizes used as values (D)."""

import numpy as np

import tclang as tc
from _check import check

SOURCE = """
def layernorm(float(N, D) X, float(D) gamma, float(D) beta) -> (Y) {
    mean(n) +=! X(n, d) / D
    var(n)  +=! (X(n, d) - mean(n)) * (X(n, d) - mean(n)) / D
    Y(n, d)  = (X(n, d) - mean(n)) * rsqrt(var(n) + 1e-5) * gamma(d) + beta(d)
}
"""


def main() -> None:
    rng = np.random.default_rng(0)
    X = rng.standard_normal((31, 64), np.float32)
    gamma, beta = rng.standard_normal(64, np.float32), rng.standard_normal(64, np.float32)
    mean = X.mean(1, keepdims=True)
    expected = (X - mean) / np.sqrt(X.var(1, keepdims=True) + 1e-5) * gamma + beta
    check("layernorm", tc.define(SOURCE).layernorm(X, gamma, beta), expected, rtol=1e-3)


if __name__ == "__main__":
    main()
