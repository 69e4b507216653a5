"""Does the guided search beat random search at equal budgets? One run on this machine.

For each kernel and seed, `tc.autotune` runs once with the cost-model-guided evolutionary
search and once with random search, `--budget` timed trials each; the table gives the best
time found after 25, 50 and 100 trials (median over the seeds), relative to the automatic
schedule's time in the same tuning (>1: faster than automatic). Every trial is timed
inside the tuning, so the two strategies' times come from the same conditions; the
kernels are small enough that a trial is mostly its compile.

    python benchmarks/tuning_search.py [--budget 100] [--seeds 3] [--out docs/tuning-search.md]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import tclang as tc  # noqa: E402
from benchmarks import kernels as K  # noqa: E402


def cases():
    rng = np.random.default_rng(0)
    f = lambda *s: rng.standard_normal(s, np.float32)  # noqa: E731
    return [("matmul 256^3", K.MATMUL, "matmul", (f(256, 256), f(256, 256))),
            ("MLP layer 256x512x512", K.MLP_LAYER, "mlp_layer",
             (f(256, 512), f(512, 512), f(512))),
            ("softmax 1024x512", K.SOFTMAX, "softmax", (f(1024, 512),))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", type=int, default=100)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--out", default=None, help="also write the table to this file")
    args = ap.parse_args()
    checkpoints = [n for n in (25, 50, 100) if n <= args.budget] or [args.budget]
    db = os.path.join(tempfile.mkdtemp(), "search.sqlite")  # leaves the user's DB alone
    lines = [f"| kernel | strategy | " + " | ".join(f"best after {n}" for n in checkpoints)
             + " | trials refused/failed |", "|---|---|" + "---|" * (len(checkpoints) + 1)]
    start = time.time()
    for label, source, entry, inputs in cases():
        kernel = tc.define(source)[entry]
        results = {}
        for strategy in ("evolution", "random"):
            for seed in range(args.seeds):
                results[strategy, seed] = tc.autotune(
                    kernel, *inputs, budget=args.budget, seed=seed, strategy=strategy,
                    database=db, store=False, jobs=args.jobs, min_time=0.05)
        # one automatic time for the kernel: the median of its trial in every tuning
        automatic = statistics.median(
            t.seconds for r in results.values() for t in r.trials
            if t.ok and all(v is None for _, v in t.candidate))
        for strategy in ("evolution", "random"):
            runs = [results[strategy, seed] for seed in range(args.seeds)]
            cells = " | ".join(
                f"{statistics.median(automatic / r.best_after(n) for r in runs):.2f}x"
                for n in checkpoints)
            failed = statistics.mean(sum(1 for t in r.trials if not t.ok) for r in runs)
            lines.append(f"| {label} | {strategy} | {cells} | {failed:.1f} |")
            print(lines[-1], flush=True)
    text = (f"Best time found vs the automatic schedule (>1: faster), median of {args.seeds} "
            f"seeds, {args.budget} timed trials per tuning; {time.time() - start:.0f} s.\n\n"
            + "\n".join(lines))
    print("\n" + text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
