"""Batched matrix multiplication: the batch loop is parallel, each product is tiled."""

import numpy as np

import tclang as tc
from _check import check

SOURCE = "def bmm(float(B,N,M) X, float(B,M,K) Y) -> (Z) { Z(b,n,k) +=! X(b,n,m) * Y(b,m,k) }"


def main() -> None:
    rng = np.random.default_rng(0)
    X = rng.standard_normal((5, 13, 7), np.float32)
    Y = rng.standard_normal((5, 7, 11), np.float32)
    check("batched matmul", tc.define(SOURCE).bmm(X, Y), X @ Y)


if __name__ == "__main__":
    main()
