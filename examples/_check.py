"""Shared by the examples: compare with NumPy and time both, briefly."""

import time

import numpy as np


def check(name: str, ours, expected, rtol: float = 1e-4) -> None:
    np.testing.assert_allclose(ours, expected, rtol=rtol, atol=1e-4)
    print(f"{name}: matches NumPy")


def timed(fn, *args, repeat: int = 5) -> float:
    fn(*args)
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn(*args)
        best = min(best, time.perf_counter() - start)
    return best
