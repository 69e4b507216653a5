"""Automatic dynamic shapes: the kernel Options(specialize="auto") runs after a size took a
second value (generic in that size, the others constants) against the kernel specialized
for each value, on the benchmark operators (docs/schedules.md, Dynamic shapes).

    python benchmarks/dynamic_shapes.py [--reps 15] [--threads 1] [--wall] [kernel ...]

For each operator one size is swept (the batch or row count; conv2d also its image
height): the automatic module is called with two warm-up values first, so that every
value of the sweep runs on its generic variant; then, per value, calls of the generic
variant and of a kernel specialized for that value (Options(specialize=True)) alternate,
each timed as the median of `--reps` interleaved rounds (a round: enough calls for about
2 ms). On one thread (TCLANG_NUM_THREADS, default 1 here) a round is timed in the calling
thread's CPU time (`--wall`: wall-clock time), which other processes' load disturbs
least. Printed per operator: each value's ratio generic / specialized, their geometric
mean and worst, and the variants the automatic module made over the whole sweep. `uptime`
is printed before and after: on a shared machine the figures are taken under that load.
"""

from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import tclang as tc  # noqa: E402
from benchmarks import kernels as K  # noqa: E402

F = np.float32


def _case(source, make, warm, sweep):
    return dict(source=source, make=make, warm=warm, sweep=sweep)


def cases(r: np.random.Generator) -> dict:
    w_mm = r.standard_normal((256, 256), F)
    w_mlp, b_mlp = r.standard_normal((512, 512), F), r.standard_normal(512).astype(F)
    w_conv = r.standard_normal((32, 16, 3, 3), F)
    g, b = r.standard_normal(1024).astype(F), r.standard_normal(1024).astype(F)
    sweep = (1, 7, 31, 64, 97, 128, 200, 256)
    return {
        "matmul": _case(K.MATMUL, lambda m: (r.standard_normal((m, 256), F), w_mm),
                        (48, 50), sweep),
        "mlp": _case(K.MLP_LAYER, lambda n: (r.standard_normal((n, 512), F), w_mlp, b_mlp),
                     (48, 50), sweep),
        "conv2d": _case(K.CONV2D,
                        lambda n: (r.standard_normal((n, 16, 30, 30), F), w_conv),
                        (2, 3), (1, 4, 5, 8)),
        "conv2d-H": _case(K.CONV2D,
                          lambda h: (r.standard_normal((2, 16, h, 30), F), w_conv),
                          (20, 21), (3, 8, 17, 30, 33, 56)),
        "softmax": _case(K.SOFTMAX, lambda n: (r.standard_normal((n, 1024), F),),
                         (48, 50), sweep),
        "layernorm": _case(K.LAYERNORM, lambda n: (r.standard_normal((n, 1024), F), g, b),
                           (48, 50), sweep),
    }


CLOCK = time.thread_time


def _timer(kernel, args):
    """A function that times one round of calls (about 2 ms of them), seconds per call."""
    kernel(*args)
    start = time.perf_counter()
    kernel(*args)
    once = max(time.perf_counter() - start, 1e-7)
    n = max(1, min(1000, int(2e-3 / once)))

    def round_():
        start = CLOCK()
        for _ in range(n):
            kernel(*args)
        return (CLOCK() - start) / n
    return round_


def uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    except OSError:
        return "uptime: unavailable"


def run(name: str, case: dict, reps: int) -> dict:
    auto_mod = tc.define(case["source"])  # Options(specialize="auto"), the default
    spec_mod = tc.define(case["source"], options=tc.Options(specialize=True))
    entry = auto_mod.names[0]
    auto, spec = auto_mod[entry], spec_mod[entry]
    for v in case["warm"]:  # the second value makes the generic variant
        auto(*case["make"](v))
    sweep = [case["make"](v) for v in case["sweep"]]
    for args in sweep:  # each value once: what a sweep compiles
        np.testing.assert_allclose(auto(*args), spec(*args), rtol=2e-3, atol=2e-3)
    stats = dict(auto.compile_stats)
    ratios = []
    for v, args in zip(case["sweep"], sweep):
        # the variants themselves (calling `auto` again and again would specialize the
        # shape of a contraction after REPEATS_SPECIALIZED calls)
        generic, special = auto.compile(*args), spec.compile(*args)
        assert generic.generic and not special.generic
        timers = (_timer(generic, args), _timer(special, args))
        times = ([], [])
        for _ in range(reps):  # interleaved
            for k, t in enumerate(timers):
                times[k].append(t())
        g, s = (float(np.median(t)) for t in times)
        ratios.append(g / s)
        print(f"  {name:10s} {v:5d}: generic {g * 1e6:10.1f} us  specialized "
              f"{s * 1e6:10.1f} us  ratio {g / s:5.2f}", flush=True)
    geo = math.exp(sum(map(math.log, ratios)) / len(ratios))
    print(f"{name}: geometric mean {geo:.2f}, worst {max(ratios):.2f}; the automatic module "
          f"made {stats['specialized']} specialized + {stats['generic']} generic variants "
          f"over {len(case['warm']) + len(case['sweep'])} values (generic in "
          f"{', '.join(auto.generic_sizes)})", flush=True)
    return dict(geo=geo, worst=max(ratios), stats=stats)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("kernels", nargs="*")
    p.add_argument("--reps", type=int, default=15)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--wall", action="store_true", help="wall-clock time, not CPU time")
    args = p.parse_args(argv)
    global CLOCK
    os.environ["TCLANG_NUM_THREADS"] = str(args.threads)  # read when the pool first loads
    if args.wall or args.threads != 1:
        CLOCK = time.perf_counter
    table = cases(np.random.default_rng(0))
    print(f"before: {uptime()}")
    print(f"cores: {os.cpu_count()}, threads: {args.threads}, clock: "
          f"{'thread CPU time' if CLOCK is time.thread_time else 'wall'}, reps: {args.reps}")
    results = {}
    for name, case in table.items():
        if args.kernels and name not in args.kernels:
            continue
        results[name] = run(name, case, args.reps)
    print(f"after: {uptime()}")
    print("summary (generic / specialized, median of interleaved rounds):")
    for name, r in results.items():
        print(f"  {name:10s} geomean {r['geo']:.2f}  worst {r['worst']:.2f}")


if __name__ == "__main__":
    main()
