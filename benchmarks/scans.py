"""Recurrences against NumPy: a prefix sum (`O(i) = (i == 0) ? X(0) : O(i - 1) + X(i)`)
against `np.cumsum` on one core, and per-row scans against `np.cumsum(axis=1)`.

    TCLANG_NUM_THREADS=1 python benchmarks/scans.py [--rounds 9]

Interleaved rounds with rests and medians with their spread (`tclang/tools/timing.py`); both
write into a preallocated output (`out=`), so neither pays for an allocation. The target
(issue 35): the prefix sum within 1.5x of `np.cumsum` at 1001 and 10^6 elements. Set
TCLANG_NUM_THREADS to the cores to use: 1 for the one-core comparison (NumPy's cumsum is
single-threaded); the per-row scans are parallel across rows with more.
"""

from __future__ import annotations

import argparse
import os

import numpy as np

import tclang as tc
from tclang.tools.timing import interleaved

SOURCE = """
def cumsum(float(N) X) -> (O) { O(i) = (i == 0) ? X(0) : O(i - 1) + X(i) }
def row_cumsum(float(R, N) X) -> (O) { O(r, i) = (i == 0) ? X(r, 0) : O(r, i - 1) + X(r, i) }
"""


def cases():
    rng = np.random.default_rng(0)
    for n in (1001, 10**6):
        yield f"cumsum {n}", "cumsum", rng.random(n, np.float32), None
    for shape in ((64, 1001), (1024, 1024)):
        yield f"row cumsum {shape[0]}x{shape[1]}", "row_cumsum", \
            rng.random(shape, np.float32), 1


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=9)
    args = ap.parse_args()
    mod = tc.define(SOURCE)
    print(f"threads: {os.environ.get('TCLANG_NUM_THREADS', 'all cores')}; "
          f"load: {os.getloadavg()[0]:.2f}")
    for label, entry, x, axis in cases():
        kernel, out, peer = mod[entry], np.empty_like(x), np.empty_like(x)
        kernel(x, out=out)
        np.testing.assert_allclose(out, np.cumsum(x, axis=axis), rtol=1e-3)
        timings = interleaved({"tclang": lambda: kernel(x, out=out),
                               "numpy": lambda: np.cumsum(x, axis=axis, out=peer)},
                              rounds=args.rounds, gap=0.1)
        ours, theirs = timings["tclang"], timings["numpy"]
        print(f"{label}: tclang {ours.text(1e6)} us, NumPy {theirs.text(1e6)} us, "
              f"ratio {ours.median / theirs.median:.2f}")


if __name__ == "__main__":
    main()
