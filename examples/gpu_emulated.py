"""The CUDA path without a GPU: backend="cuda-emulated" runs the generated CUDA C on the
host (each block's threads as fibers switching at __syncthreads). With an NVIDIA GPU and
`pip install 'tclang[cuda]'`, backend="cuda" runs the same code on the device."""

import numpy as np

import tclang as tc
from _check import check

SOURCE = "def matmul(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }"


def main() -> None:
    rng = np.random.default_rng(0)
    A, B = rng.standard_normal((70, 45), np.float32), rng.standard_normal((45, 33), np.float32)
    kernel = tc.define(SOURCE, backend="cuda-emulated").matmul
    check("matmul on the emulated GPU", kernel(A, B), A @ B)
    print(kernel.compile(A, B).loops)  # blocks, threads, shared-memory tiles, barriers


if __name__ == "__main__":
    main()
