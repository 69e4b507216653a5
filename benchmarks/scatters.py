"""Scatters on CPU threads against NumPy and PyTorch: a histogram of 10^6 ids into 1000
bins (`H(Ids(i)) +=! 1.0`, a privatized copy per chunk), a scatter-add of 10^6 values
into 100003 elements (compare-and-swap updates), a scatter-max into 1000, and an
embedding backward (`G(Ids(b, l), d) +=! dO(b, l, d)`, blocks of `d` in parallel).

    TCLANG_NUM_THREADS=2 python benchmarks/scatters.py [--rounds 9]

"sequential" is the same kernel with `Options(reorder_reductions=False)`: the nest in
index order on one thread (what every CPU scatter ran before). Interleaved rounds with
rests and medians with their spread (`tclang/tools/timing.py`); tclang writes into a
preallocated output (`out=`), the peers into a preallocated array they zero first where
they accumulate (np.add.at, index_add_); np.bincount allocates its result.
"""

from __future__ import annotations

import argparse
import os

import numpy as np

import tclang as tc
from tclang.tools.timing import interleaved

try:
    import torch
except ImportError:  # optional
    torch = None

SOURCE = """
def hist(int32(N) Ids, float(B) Like) -> (float(B) H) { H(Ids(i)) +=! 1.0 }
def add(int32(N) Idx, float(N) X, float(M) Like) -> (float(M) O) { O(Idx(i)) +=! X(i) }
def smax(int32(N) Idx, float(N) X, float(M) Like) -> (float(M) O) { O(Idx(i)) max=! X(i) }
def embed_grad(int32(B, L) Ids, float(B, L, D) dO, float(E, D) Table) -> (float(E, D) G) {
  G(Ids(b, l), d) +=! dO(b, l, d)
}
"""


def cases(rng):
    n = 10**6
    ids = rng.integers(0, 1000, n).astype(np.int32)
    x = rng.standard_normal(n).astype(np.float32)
    like = np.zeros(1000, np.float32)
    ones = np.ones(n, np.float32)

    def zeroed_add_at(out, index, values):
        def call():
            out.fill(0)
            np.add.at(out, index, values)
        return call

    def torch_index_add(shape, index, values):
        flat = index.ravel().astype(np.int64)
        rows = values.reshape(flat.size, -1)
        target, index = torch.zeros(shape), torch.from_numpy(flat)
        values = torch.from_numpy(rows[:, 0].copy() if values.ndim == 1 else rows)
        return lambda: target.zero_().index_add_(0, index, values)

    peers = {"np.bincount": lambda: np.bincount(ids, minlength=1000),
             "np.add.at": zeroed_add_at(np.zeros(1000, np.float32), ids, ones)}
    if torch is not None:
        peers["torch index_add_"] = torch_index_add(1000, ids, ones)
    yield "histogram 10^6 ids -> 1000 bins", "hist", (ids, like), \
        np.bincount(ids, minlength=1000), peers
    big = rng.integers(0, 100003, n).astype(np.int32)
    expected = np.zeros(100003, np.float32)
    np.add.at(expected, big, x)
    peers = {"np.add.at": zeroed_add_at(np.zeros(100003, np.float32), big, x)}
    if torch is not None:
        peers["torch index_add_"] = torch_index_add(100003, big, x)
    yield "scatter-add 10^6 -> 100003", "add", (big, x, np.zeros(100003, np.float32)), \
        expected, peers
    expected = np.full(1000, -np.inf, np.float32)
    np.maximum.at(expected, ids, x)
    peer = np.empty(1000, np.float32)

    def max_at():
        peer.fill(-np.inf)
        np.maximum.at(peer, ids, x)
    yield "scatter-max 10^6 -> 1000", "smax", (ids, x, like), expected, {"np.maximum.at": max_at}
    rows = rng.integers(0, 30000, (64, 128)).astype(np.int32)
    grad = rng.standard_normal((64, 128, 256)).astype(np.float32)
    expected = np.zeros((30000, 256), np.float32)
    np.add.at(expected, rows, grad)
    peers = {"np.add.at": zeroed_add_at(np.zeros((30000, 256), np.float32), rows, grad)}
    if torch is not None:
        peers["torch index_add_"] = torch_index_add((30000, 256), rows, grad)
    yield "embedding backward 64x128 ids, d=256 -> 30000x256", "embed_grad", \
        (rows, grad, np.zeros((30000, 256), np.float32)), expected, peers


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=9)
    args = ap.parse_args()
    threaded = tc.define(SOURCE)
    sequential = tc.define(SOURCE, options=tc.Options(reorder_reductions=False))
    print(f"threads: {os.environ.get('TCLANG_NUM_THREADS', 'all cores')}; "
          f"load: {os.getloadavg()[0]:.2f}")
    for label, entry, inputs, expected, peers in cases(np.random.default_rng(0)):
        out, out_seq = np.empty_like(expected, np.float32), np.empty_like(expected, np.float32)
        ours, seq = threaded[entry].compile(*inputs), sequential[entry].compile(*inputs)
        np.testing.assert_allclose(ours(*inputs, out=out), expected, rtol=1e-4, atol=1e-3)
        np.testing.assert_allclose(seq(*inputs, out=out_seq), expected, rtol=1e-4, atol=1e-3)
        calls = {"tclang": lambda: ours(*inputs, out=out),
                 "sequential": lambda: seq(*inputs, out=out_seq), **peers}
        timings = interleaved(calls, rounds=args.rounds, gap=0.1)
        line = ", ".join(f"{name} {t.text(1e3)} ms" for name, t in timings.items())
        print(f"{label}: {line}")


if __name__ == "__main__":
    main()
