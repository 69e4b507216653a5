"""Row-wise softmax with two temporaries (the row maximum and the row sum)."""

import numpy as np

import tclang as tc
from _check import check

SOURCE = """
def softmax(float(N, D) X) -> (Y) {
    rowmax(n) max=! X(n, d)
    rowsum(n) +=! exp(X(n, d) - rowmax(n))
    Y(n, d) = exp(X(n, d) - rowmax(n)) / rowsum(n)
}
"""


def main(rows: int = 100, width: int = 257) -> None:
    X = np.random.default_rng(0).standard_normal((rows, width), np.float32) * 10
    e = np.exp(X - X.max(axis=1, keepdims=True))
    check("softmax", tc.define(SOURCE).softmax(X), e / e.sum(axis=1, keepdims=True))


if __name__ == "__main__":
    main()
