"""Matrix multiplication in one line; compiled on the first call for these shapes."""

import numpy as np

import tclang as tc
from _check import check, timed

SOURCE = "def matmul(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }"


def main(n: int = 256) -> None:
    rng = np.random.default_rng(0)
    A, B = rng.standard_normal((n, n), np.float32), rng.standard_normal((n, n), np.float32)
    mm = tc.define(SOURCE)
    check("matmul", mm.matmul(A, B), A @ B)
    print(f"  tclang {timed(mm.matmul, A, B) * 1e3:.2f} ms, NumPy {timed(np.matmul, A, B) * 1e3:.2f} ms")


if __name__ == "__main__":
    main()
