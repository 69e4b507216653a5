"""backend="cuda" tuned against its automatic schedule on a real GPU, within a time budget.

    python benchmarks/gpu_tune.py [--minutes 4] [--only matmul,conv2d] [--quick]
                                  [--database PATH] [--no-compare]

Tunes matmul 4096^3 fp32 and conv2d 3x3 (N=32, C=M=64, a 56x56 output: 58x58 inputs) with
`tc.autotune(..., backend="cuda")`: trials in a spawned worker per GPU, CUDA events around
batches of calls on device arrays (docs/tuning.md). The search of each kernel gets an equal
share of `--minutes`; the workers' start, the final re-timing and the check below come on
top (a minute or two). A trial that fails (a schedule nvcc or the driver refuses, a crash,
a hang past `--trial-limit`) costs that trial and is counted; a kernel whose tuning fails
as a whole is reported and the next one runs. Per kernel it prints the automatic and the
tuned time (the tuner's final re-timing, one after the other on the same GPU), TFLOP/s, the
ratio (>1: tuning helped), the best options, the trials by status, and then, unless
`--no-compare`, both schedules timed again by `tc.compare` in interleaved rounds beside
PyTorch on the GPU where it is installed. `--quick`: 4x smaller problems (a smoke test).
A measurement, never a pass/fail test. Needs PyCUDA and an NVIDIA GPU.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import traceback

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import tclang as tc  # noqa: E402
from benchmarks import kernels as K  # noqa: E402


def problems(quick: bool) -> list[tuple[str, str, str, tuple, float]]:
    """(name, source, entry, inputs, flops) of each kernel."""
    s = 4 if quick else 1
    rng = np.random.default_rng(0)
    n = 4096 // s
    batch = 32 // s

    def normal(*shape):
        return rng.standard_normal(shape, dtype=np.float32)

    return [
        (f"matmul {n}^3 fp32", K.MATMUL, "matmul", (normal(n, n), normal(n, n)),
         2.0 * n ** 3),
        (f"conv2d 3x3 N={batch} C=M=64 56x56", K.CONV2D, "conv2d",
         (normal(batch, 64, 58, 58), normal(64, 64, 3, 3)),
         2.0 * batch * 64 * 56 * 56 * 64 * 9),
    ]


def tune_one(name: str, source: str, entry: str, inputs: tuple, flops: float,
             seconds: float, args) -> dict | None:
    print(f"\n== {name}: tuning for {seconds / 60:.1f} min", flush=True)
    kernel = tc.define(source, backend="cuda")[entry]
    started = time.monotonic()
    try:
        result = tc.autotune(kernel, *inputs, budget=10000, time_budget=seconds,
                             time_limit=args.trial_limit, database=args.database,
                             min_time=args.min_time, progress=True, seed=args.seed)
    except KeyboardInterrupt:
        raise
    except Exception as err:  # noqa: BLE001 - one kernel failing must not stop the run
        print(f"   tuning {name} failed: {type(err).__name__}: {err}", flush=True)
        traceback.print_exc(limit=3)
        return None
    spent = time.monotonic() - started
    counts = ", ".join(f"{v} {k}" for k, v in result.counts().items() if v)
    print(f"   {len(result.trials)} trials in {spent:.0f} s: {counts}", flush=True)
    failed = [t for t in result.trials if t.status not in ("ok", "refused")]
    for t in failed[:5]:
        print(f"   {t.status}: {t.message[:200]}")
    fastest = sorted((t for t in result.trials if t.ok), key=lambda t: t.seconds)[:5]
    for t in fastest:
        print(f"   {t.seconds * 1e3:9.3f} ms  {flops / t.seconds / 1e12:6.2f} TFLOP/s  "
              f"{tc.Options(**{k: v for k, v in t.candidate if v is not None}).describe()}")
    row = {"name": name, "automatic": result.automatic_seconds, "tuned": result.best_seconds,
           "ratio": result.speedup, "best": result.best.describe(), "flops": flops,
           "trials": len(result.trials), "counts": counts}
    print(f"   automatic {row['automatic'] * 1e3:.3f} ms "
          f"({flops / row['automatic'] / 1e12:.2f} TFLOP/s), tuned {row['tuned'] * 1e3:.3f} ms "
          f"({flops / row['tuned'] / 1e12:.2f} TFLOP/s): {row['ratio']:.2f}x; best options "
          f"{row['best']}", flush=True)
    if not args.no_compare and row["best"] != "automatic":
        try:
            report = tc.compare(kernel, *inputs, manual=[("tuned", result.best)], rounds=5,
                                peers=("torch",), limits=False, progress=False,
                                min_time=args.min_time, time_limit=args.trial_limit)
            print(report.table(), flush=True)
        except Exception as err:  # noqa: BLE001 - the tuning's own figures stand
            print(f"   tc.compare failed: {type(err).__name__}: {err}", flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=4.0,
                        help="minutes of searching in all, shared by the kernels (default 4)")
    parser.add_argument("--only", type=lambda s: [x.strip() for x in s.split(",")],
                        default=None, help="kernels whose name starts with one of these")
    parser.add_argument("--quick", action="store_true", help="problems 4x smaller")
    parser.add_argument("--trial-limit", type=float, default=60.0,
                        help="seconds per trial before it is killed (default 60)")
    parser.add_argument("--min-time", type=float, default=0.2,
                        help="seconds of timed calls per trial (default 0.2)")
    parser.add_argument("--database", default=None,
                        help="the tuning database (default: a fresh temporary file; "
                             "'default' for the user's, where options=\"tuned\" finds it)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-compare", action="store_true",
                        help="skip the interleaved re-timing with tc.compare")
    args = parser.parse_args()
    if args.minutes <= 0:
        sys.exit("--minutes must be above 0")
    if args.database is None:
        args.database = os.path.join(tempfile.mkdtemp(prefix="gpu-tune-"), "tuning.sqlite")
    elif args.database == "default":
        args.database = None
    try:
        from backends.cuda.backend import _device
        _, device, _ = _device()
    except Exception as err:  # noqa: BLE001 - no PyCUDA, no GPU: say so and stop
        sys.exit(f"benchmarks/gpu_tune.py needs PyCUDA and an NVIDIA GPU: {err}")
    print(f"GPU: {device.name()}; searching {args.minutes:g} min in all"
          f"{' (quick problems)' if args.quick else ''}", flush=True)
    chosen = [p for p in problems(args.quick)
              if not args.only or any(p[0].startswith(o) for o in args.only)]
    if not chosen:
        sys.exit(f"--only {args.only} names no kernel")
    rows = []
    share = args.minutes * 60 / len(chosen)
    for name, source, entry, inputs, flops in chosen:
        row = tune_one(name, source, entry, inputs, flops, share, args)
        if row is not None:
            rows.append(row)
    print("\n| kernel | automatic (ms) | tuned (ms) | TFLOP/s auto -> tuned | tuned/automatic "
          "speed-up | trials | best options |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['name']} | {r['automatic'] * 1e3:.3f} | {r['tuned'] * 1e3:.3f} | "
              f"{r['flops'] / r['automatic'] / 1e12:.2f} -> {r['flops'] / r['tuned'] / 1e12:.2f} "
              f"| {r['ratio']:.2f}x | {r['trials']} ({r['counts']}) | {r['best']} |")
    if len(rows) < len(chosen):
        print(f"\n{len(chosen) - len(rows)} kernel(s) could not be tuned (see above)")


if __name__ == "__main__":  # required: the trial workers are spawned and import this file
    main()
