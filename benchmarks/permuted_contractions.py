"""Contractions of any layout, one thread each: tclang against `np.einsum(optimize=True)` and
`torch.einsum`, and each kernel's share of its roofline (issue 33 item 1).

A seeded family of sums of products `O(...) +=! A(...) * B(...)`: free indices of A only,
of B only and reduction indices (1-3 of each kind, 2-6 indices per operand), each tensor's
indices in a random order, extents drawn so that a call does `--mflop` MFLOP or so (every
extent at least 2, some odd). Every implementation runs the same inputs; the rounds are
interleaved (one median sample of each kernel per round, rest after BLAS), and the median of
the rounds is kept. The roofline is min(one core's sgemm rate, intensity x one core's
triad bandwidth), both measured here in the same run (tclang/driver/roofline.py).

    python benchmarks/permuted_contractions.py [--count 24] [--rounds 5] [--seed 0]
                                               [--mflop 60] [--show]

Prints one line per contraction, then the geometric mean, 10th percentile and worst case
of the speedup over the best peer and of the roofline share, with the load average.
Set the thread counts before NumPy and PyTorch start: done below, one thread each.
"""

from __future__ import annotations

import os

for _name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_name] = "1"

import argparse  # noqa: E402
import math  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from dataclasses import dataclass  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import tclang as tc  # noqa: E402
from tclang.lang.frontend import check_source  # noqa: E402
from tclang.driver.roofline import kernel_work, machine_limits, roofline_fraction  # noqa: E402
from tclang.tuning.trials import time_calls  # noqa: E402

LETTERS = "abcdefghijklmnopqrstuvwxyz"


@dataclass(frozen=True)
class Contraction:
    """One generated contraction: its TC source, einsum spec and operand shapes."""

    source: str
    spec: str
    shapes: tuple[tuple[int, ...], tuple[int, ...]]
    sizes: dict


def generate(rng: np.random.Generator, mflop: float) -> Contraction:
    """A random contraction of two operands (module docstring) near `mflop` MFLOP."""
    while True:
        free_a, free_b, red = (int(rng.integers(1, 4)) for _ in range(3))
        if free_a + red <= 6 and free_b + red <= 6:
            break
    names = list(LETTERS[:free_a + free_b + red])
    fa, fb, rd = names[:free_a], names[free_a:free_a + free_b], names[free_a + free_b:]
    extents = _extents(rng, len(names), mflop)
    size = dict(zip(names, extents))
    a = list(rng.permutation(fa + rd))
    b = list(rng.permutation(fb + rd))
    o = list(rng.permutation(fa + fb))
    upper = {n: n.upper() for n in names}
    decl = lambda idx: ",".join(upper[i] for i in idx)  # noqa: E731
    source = (f"def contraction(float({decl(a)}) P, float({decl(b)}) Q) -> (O) {{\n"
              f"    O({','.join(o)}) +=! P({','.join(a)}) * Q({','.join(b)})\n}}")
    spec = f"{''.join(a)},{''.join(b)}->{''.join(o)}"
    shapes = (tuple(size[i] for i in a), tuple(size[i] for i in b))
    return Contraction(source, spec, shapes, {upper[n]: size[n] for n in names})


def _extents(rng: np.random.Generator, count: int, mflop: float) -> list[int]:
    """`count` extents between 4 and 128 (TCCG's benchmark keeps each index at 8-72)
    whose product is about mflop / 2 million (a multiply-add each), some odd or prime."""
    target = math.log(mflop * 1e6 / 2) / count
    extents = [int(round(math.exp(target + rng.normal(0, 0.35)))) for _ in range(count)]
    extents = [min(128, max(4, e)) for e in extents]
    return [e + 1 if e % 2 == 0 and rng.random() < 0.33 else e for e in extents]


def implementations(c: Contraction):
    """{name: call} for tclang, np.einsum and torch.einsum on the same inputs; the output of
    each must agree with np.einsum's (checked once, before timing)."""
    import torch
    torch.set_num_threads(1)
    rng = np.random.default_rng(1)
    a, b = (rng.standard_normal(s).astype(np.float32) for s in c.shapes)
    kernel = tc.define(c.source, options=tc.Options(parallel=False)).contraction
    out = kernel(a, b)
    expected = np.einsum(c.spec, a, b, optimize=True)
    scale = float(np.abs(expected).max()) or 1.0
    if not np.allclose(out, expected, atol=1e-4 * scale, rtol=1e-4):
        raise AssertionError(f"tclang differs from np.einsum on {c.spec}")
    ta, tb = torch.from_numpy(a), torch.from_numpy(b)
    return {"tclang": lambda: kernel(a, b, out=out),
            "np.einsum": lambda: np.einsum(c.spec, a, b, optimize=True),
            "torch.einsum": lambda: torch.einsum(c.spec, ta, tb)}


def measure(calls: dict, rounds: int, min_time: float = 0.05) -> dict[str, float]:
    """Median over `rounds` of each implementation's median call, interleaved by round."""
    samples: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(rounds):
        for name, call in calls.items():
            samples[name].append(statistics.median(time_calls(call, min_time)))
            time.sleep(0.02)
    return {name: statistics.median(s) for name, s in samples.items()}


def summary(values: list[float]) -> str:
    ordered = sorted(values)
    geomean = math.exp(sum(math.log(v) for v in ordered) / len(ordered))
    tenth = ordered[max(0, math.ceil(0.1 * len(ordered)) - 1)]
    return f"geomean {geomean:.2f}, p10 {tenth:.2f}, worst {ordered[0]:.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=24)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--mflop", type=float, default=60.0)
    parser.add_argument("--show", action="store_true", help="print each kernel's source")
    args = parser.parse_args()
    limits = machine_limits(gap=0.2, n=1024, triad_elements=8_000_000)
    print(f"one core: sgemm {limits['sgemm_gflops']:.0f} GFLOP/s, "
          f"triad {limits['triad_gbs']:.1f} GB/s; load {os.getloadavg()[0]:.1f}")
    rng = np.random.default_rng(args.seed)
    speedups, shares = [], []
    for k in range(args.count):
        c = generate(rng, args.mflop)
        times = measure(implementations(c), args.rounds)
        flops, moved = kernel_work(check_source(c.source).definitions[0], c.sizes)
        share = roofline_fraction(times["tclang"], flops, moved, limits)
        best = min(times["np.einsum"], times["torch.einsum"])
        speedups.append(best / times["tclang"])
        shares.append(share)
        print(f"{k:3d} {c.spec:24s} {str(c.shapes):40s} tclang {times['tclang'] * 1e3:7.2f} ms"
              f"  einsum {times['np.einsum'] * 1e3:7.2f}  torch {times['torch.einsum'] * 1e3:7.2f}"
              f"  {speedups[-1]:5.2f}x  {100 * share:5.1f}% roofline", flush=True)
        if args.show:
            print(c.source)
    print(f"speedup over the best peer: {summary(speedups)}")
    print(f"roofline share:             {summary(shares)}")
    print(f"load {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    main()
