"""A scatter: a histogram with a prior (pseudo-counts), in one definition. `H(Ids(i)) += 1.0`
updates the bin each id names; repeated ids add up (as NumPy's unbuffered `np.add.at`),
and an id outside the bins raises tclang.TCIndexError with nothing written outside H."""

import numpy as np

import tclang as tc
from _check import check, timed

SOURCE = """
def histogram(int32(N) Ids, float(B) Prior) -> (float(B) H) {
    H(b) = Prior(b)
    H(Ids(i)) += 1.0
}
"""


def numpy_histogram(ids, prior):
    return prior + np.bincount(ids, minlength=prior.shape[0]).astype(np.float32)


def main(n: int = 200_003, bins: int = 1009) -> None:
    rng = np.random.default_rng(0)
    ids = rng.integers(0, bins, n).astype(np.int32)
    prior = np.full(bins, 0.5, np.float32)
    histogram = tc.define(SOURCE).histogram
    check("histogram", histogram(ids, prior), numpy_histogram(ids, prior))
    added = prior.copy()
    np.add.at(added, ids, 1.0)
    check("histogram (np.add.at)", histogram(ids, prior), added)
    print(f"  {n} ids into {bins} bins: tclang {timed(histogram, ids, prior) * 1e3:.2f} ms, "
          f"np.bincount {timed(numpy_histogram, ids, prior) * 1e3:.2f} ms, np.add.at "
          f"{timed(np.add.at, added, ids, 1.0) * 1e3:.2f} ms")
    ids[17] = bins
    try:
        histogram(ids, prior)
    except tc.TCIndexError as err:
        print(f"an id out of range is caught: {err}")


if __name__ == "__main__":
    main()
