"""What run-time strides cost: each kernel compiled for the same shapes with constant and
with run-time strides, on contiguous and on row-padded inputs, the four variants timed
interleaved (one sample of each per round: one call, or as many as take 2 ms), medians
printed in microseconds.

- `constant`: every stride a constant of the code (what tclang did for every layout
  before the layout key; what it still does for C-contiguous arrays);
- `run-time`: only unit strides (and extent-1 dimensions) constant, every other stride
  read from the call's strides array: what the layout key gives a non-contiguous array;
- per kernel, both on C-contiguous inputs and on row-padded views (`big[:M, :K]`, a row
  stride wider than the row).

`python benchmarks/layouts.py [ROUNDS] [--small] [--cpu] [--only NAME,...]` (NAME: a
kernel's entry: matmul, softmax, channels, tiny, conv2d). `--cpu`: one thread, and the CPU
time of the calling thread instead of the wall clock, which a busy machine disturbs less.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import tclang as tc
from benchmarks import kernels as K
from tclang.runtime import arguments
from tclang.layouts import Layout

CHANNELS = "def channels(float(N, 3) X) -> (Y) { Y(i) = X(i, 0) + 2 * X(i, 1) + X(i, 2) }"
TINY = "def tiny(float(N, D) X, float(N, D) Y) -> (Z) { Z(i, j) = X(i, j) + Y(i, j) }"

ALL_CONSTANT = "constant"
RUN_TIME = "run-time"


def _all_constant(shape, strides) -> Layout:
    return Layout(tuple(int(s) for s in strides))


def _run_time(shape, strides) -> Layout:
    """The layout key's choice for a non-contiguous array, whatever this one's layout."""
    known = tuple(0 if n <= 1 else 1 if s == 1 else None for n, s in zip(shape, strides))
    return Layout(known, 1 << 30) if None in known else Layout(known)


POLICIES = {ALL_CONSTANT: _all_constant, RUN_TIME: _run_time}


@contextlib.contextmanager
def policy(name: str):
    """Binding.shape_key with another layout key (compile and first call only: the timed
    calls take the hot path, which compares exact strides and never the key)."""
    saved = arguments.layout_key
    arguments.layout_key = POLICIES[name]
    try:
        yield
    finally:
        arguments.layout_key = saved


def padded(a: np.ndarray, extra: int = 16) -> np.ndarray:
    """`a`'s values in a view whose rows (last dimension) are `extra` elements wider."""
    big = np.zeros(a.shape[:-1] + (a.shape[-1] + extra,), a.dtype)
    big[..., :a.shape[-1]] = a
    return big[..., :a.shape[-1]]


def cases(small: bool):
    rng = np.random.default_rng(0)

    def rand(*shape):
        return rng.standard_normal(shape).astype(np.float32)

    scale = 4 if small else 1
    for n in (512 // scale, 1024 // scale):
        yield f"matmul {n}^3", K.MATMUL, "matmul", (rand(n, n), rand(n, n))
    yield f"softmax {4096 // scale}x1024", K.SOFTMAX, "softmax", (rand(4096 // scale, 1024),)
    # three channels per pixel: a stride-3 loop, interleaved loads when 3 is a constant
    pixels = (1 << 20) // scale
    yield f"channel sum {pixels}x3", CHANNELS, "channels", (rand(pixels, 3),)
    yield "tiny add 8x8 (call overhead)", TINY, "tiny", (rand(8, 8), rand(8, 8))
    n = max(1, 4 // scale)
    yield f"conv2d 3x3 N={n} C=M=64 56x56", K.CONV2D, "conv2d", \
        (rand(n, 64, 58, 58), rand(64, 64, 3, 3))


def variants(entry, args):
    """(name, policy, arguments) of each variant of one kernel."""
    rows = [padded(a) for a in args]
    return [("contiguous, constant", ALL_CONSTANT, args),
            ("contiguous, run-time", RUN_TIME, args),
            ("padded rows, constant", ALL_CONSTANT, rows),
            ("padded rows, run-time", RUN_TIME, rows)]


def main(rounds: int = 15, small: bool = False, only: tuple[str, ...] = (),
         cpu: bool = False) -> None:
    clock = time.thread_time if cpu else time.perf_counter
    if cpu:  # every parallel loop on the calling thread, whose CPU time the clock reads
        os.environ["TCLANG_NUM_THREADS"] = "1"
    print(f"{'kernel':30} {'variant':24} {'median us':>10} {'iqr/median':>11} {'min us':>10} "
          "compiles")
    for title, source, entry, args in cases(small):
        if only and entry not in only:
            continue
        runs = []
        expected = None
        for name, which, arrays in variants(entry, args):
            kernel = tc.define(source)[entry]  # a module each: no in-memory sharing
            with policy(which):
                compiled = kernel.compile(*arrays)
                result = kernel(*arrays)
            expected = result if expected is None else expected
            np.testing.assert_allclose(result, expected, rtol=2e-3, atol=2e-3)
            static = compiled.compiled.artifact.blobs.get("static") == b"1"
            runs.append((name, kernel, arrays, [], static))
        start = time.perf_counter()
        kernel(*arrays)
        reps = max(1, int(2e-3 / (time.perf_counter() - start)))  # samples of >= 2 ms
        for r in range(rounds):  # each round starts one variant later: no favoured slot
            for name, kernel, arrays, samples, _ in runs[r % 4:] + runs[:r % 4]:
                start = clock()
                for _ in range(reps):
                    kernel(*arrays)
                samples.append((clock() - start) / reps)
        for name, _, _, samples, static in runs:
            q1, median, q3 = np.percentile(samples, [25, 50, 75])
            print(f"{title:30} {name:24} {median * 1e6:10.1f} {(q3 - q1) / median:11.3f} "
                  f"{min(samples) * 1e6:10.1f} {'static' if static else 'strides passed'}",
                  flush=True)


if __name__ == "__main__":
    argv = sys.argv[1:]
    only = ()
    if "--only" in argv:
        at = argv.index("--only")
        only = tuple(argv[at + 1].split(","))
        del argv[at:at + 2]
    numbers = [int(a) for a in argv if not a.startswith("--")]
    main(*numbers[:1], small="--small" in argv, only=only, cpu="--cpu" in argv)
