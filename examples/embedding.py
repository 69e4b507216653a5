"""A gather: embedding lookup summed over a bag of ids. Every id is checked at run time:
one out of range raises tclang.TCIndexError instead of reading outside the table."""

import numpy as np

import tclang as tc
from _check import check

SOURCE = "def bag(float(E, D) Table, int32(B, L) Ids) -> (O) { O(b, d) +=! Table(Ids(b, l), d) }"


def main() -> None:
    rng = np.random.default_rng(0)
    table = rng.standard_normal((50, 8), np.float32)
    ids = rng.integers(0, 50, (4, 6)).astype(np.int32)
    bag = tc.define(SOURCE).bag
    check("embedding bag", bag(table, ids), table[ids].sum(axis=1))
    ids[2, 3] = 50
    try:
        bag(table, ids)
    except tc.TCIndexError as err:
        print(f"an id out of range is caught: {err}")


if __name__ == "__main__":
    main()
