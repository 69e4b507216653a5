"""Every float32 input through tclang's CPU builtins, against NumPy in float64 rounded to
float32 (the correctly rounded result): the largest distance in float32 steps (ulp), and
where it happens.

    python benchmarks/ulp_check.py [exp tanh sigmoid exp2 log ...] [--step 1]

The documented bounds (backends/llvm/mathlib.py): exp exp2 log tanh within 1 ulp of the
correctly rounded result, sigmoid within 2. A change to the inline math must run this over
all 2^32 inputs (a few minutes a function; --step N checks every N-th bit pattern).
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

import tclang as tc

REFERENCES = {
    "exp": np.exp,
    "exp2": np.exp2,
    "log": np.log,
    "tanh": np.tanh,
    "sigmoid": lambda x: 1.0 / (1.0 + np.exp(-x)),
}
CHUNK = 1 << 24


def ulp_errors(result: np.ndarray, exact: np.ndarray) -> np.ndarray:
    """How many float32 values lie between `result` and the correctly rounded `exact` (the
    float64 value rounded to float32): 0 for a correctly rounded result, 1 for one a step
    off; both NaN count 0, +0 and -0 0 apart."""
    with np.errstate(all="ignore"):
        rounded = exact.astype(np.float32)

    def ordered(x):
        i = x.view(np.int32).astype(np.int64)
        return np.where(i < 0, np.int64(np.iinfo(np.int32).min) - i, i)

    distance = np.abs(ordered(result) - ordered(rounded)).astype(np.float64)
    both_nan = np.isnan(result) & np.isnan(rounded)
    one_nan = np.isnan(result) ^ np.isnan(rounded)
    return np.where(both_nan, 0.0, np.where(one_nan, np.inf, distance))


def check(name: str, step: int) -> tuple[float, float]:
    kernel = tc.define(f"def f(float(N) X) -> (Y) {{ Y(i) = {name}(X(i)) }}").f
    reference = REFERENCES[name]
    worst, worst_at = 0.0, 0.0
    out = np.empty(len(range(0, CHUNK, step)), np.float32)
    for start in range(0, 1 << 32, CHUNK):
        bits = np.arange(start, start + CHUNK, step, dtype=np.uint64).astype(np.uint32)
        x = bits.view(np.float32)
        y = kernel(x, out=out[:len(x)])
        with np.errstate(all="ignore"):
            exact = reference(x.astype(np.float64))
        errors = ulp_errors(y, exact)
        k = int(np.argmax(errors))
        if errors[k] > worst:
            worst, worst_at = float(errors[k]), float(x[k])
    return worst, worst_at


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", default=["exp", "tanh", "sigmoid"])
    parser.add_argument("--step", type=int, default=1, help="check every N-th bit pattern")
    args = parser.parse_args()
    for name in args.names:
        start = time.perf_counter()
        worst, at = check(name, args.step)
        print(f"{name:8s} max {worst:.0f} ulp (at x = {at!r}), "
              f"{len(range(0, 1 << 32, args.step))} inputs in {time.perf_counter() - start:.0f} s")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
