"""Automatic vs the best manual schedule we could write vs tuned, for every benchmark
operator, in one run (tc.compare on each; docs/tuning.md).

    python benchmarks/auto_vs_manual.py [--budget 40] [--full] [--only matmul,softmax]

The manual schedules follow what Halide's and TVM's published CPU schedules do for these
operators: BLIS-style register tiles with packing and cache tiles for the contractions,
one fused pass with wide vectors for the row-wise operators. Each operator's tuned row
comes from `--budget` trials of tc.autotune (stored in a scratch database, not the
user's). Ratios are against the automatic schedule in the same comparison (>1: faster than
automatic). Problem sizes are run.py's --quick ones unless --full.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import tclang as tc  # noqa: E402
from benchmarks.run import benchmarks  # noqa: E402
from tclang.driver.roofline import machine_limits  # noqa: E402

BLIS = "register_tile=6x16,pack=on,tile=96x256x256"
MANUAL = {  # the part of the operator's name -> its manual schedule
    "matmul 256": BLIS, "matmul 512": BLIS, "matmul 1024": BLIS, "matmul 2048": BLIS,
    "odd": BLIS, "A^T": BLIS, "skinny": "register_tile=6x16,pack=on",
    "MLP": "register_tile=4x16,tile=64x256x256",
    "batched": "register_tile=4x16,pack=on",
    "3x3": "register_tile=4x16,unroll=4", "1x1": "register_tile=4x16,pack=on",
    "attention": "fusion=max,unroll=4",
    "exp(X)": "vector_width=16,unroll=4",
    "softmax": "fusion=max,vector_width=16", "layernorm": "fusion=max,vector_width=16",
    "RMS": "fusion=max,vector_width=16", "GELU": "vector_width=16,unroll=2",
}


def manual_for(name: str) -> str | None:
    return next((spec for part, spec in MANUAL.items() if part in name), None)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", type=int, default=40, help="tuning trials per operator")
    ap.add_argument("--full", action="store_true", help="run.py's full sizes")
    ap.add_argument("--only", help="comma-separated parts of operator names")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))), "docs"))
    args = ap.parse_args()
    cases = benchmarks(quick=not args.full)
    if args.only:
        wanted = [w.strip().lower() for w in args.only.split(",")]
        cases = [b for b in cases if any(w in b.name.lower() for w in wanted)]
    db = os.path.join(tempfile.mkdtemp(), "auto-vs-manual.sqlite")
    limits = machine_limits(gap=0.5)
    rng = np.random.default_rng(0)
    rows, start = [], time.time()
    for b in cases:
        kernel = tc.define(b.source)[b.entry]
        inputs = b.inputs(rng)
        spec = manual_for(b.name)
        result = tc.compare(kernel, *inputs, manual=[spec] if spec else [], tune=args.budget,
                            rounds=args.rounds, limits=False, database=db, progress=False)
        auto = result.row("automatic")
        manual = next((r for r in result.rows if r.kind == "manual"), None)
        tuned = next(r for r in result.rows if r.kind == "tuned")
        numpy = next((r for r in result.rows if r.label == "numpy"), None)

        def ratio(r):
            return f"{auto.seconds / r.seconds:.2f}x" if r and r.seconds else \
                ("-" if r is None else r.status)

        rows.append({"name": b.name, "auto_ms": auto.seconds * 1e3, "manual": spec or "-",
                     "manual_ratio": ratio(manual), "tuned_ratio": ratio(tuned),
                     "tuned": tuned.label.split(": ", 1)[-1], "numpy": ratio(numpy),
                     "auto_vs_tuned": tuned.seconds / auto.seconds if tuned.seconds else None})
        r = rows[-1]
        print(f"| {r['name']} | {r['auto_ms']:.3f} | {r['manual']}: {r['manual_ratio']} | "
              f"{r['tuned_ratio']} ({r['tuned']}) | {r['numpy']} |", flush=True)
    write(rows, limits, args, time.time() - start)


def write(rows, limits, args, seconds) -> None:
    lines = [f"# Automatic vs manual vs tuned schedules",
             "",
             f"One run of `python benchmarks/auto_vs_manual.py --budget {args.budget}"
             f"{' --full' if args.full else ''}` ({seconds / 60:.0f} min) on the 2-core test "
             f"machine (sgemm {limits['sgemm_gflops']:.1f} GFLOP/s, triad "
             f"{limits['triad_gbs']:.1f} GB/s, measured in the same run). Ratios are speed "
             f"relative to the automatic schedule in the same comparison (>1: faster than "
             f"automatic); each row is a `tc.compare` of {args.rounds} interleaved rounds; "
             f"tuned: {args.budget} trials of `tc.autotune`; numpy: `np.einsum` where it can "
             f"write the operator.", "",
             "| operator | automatic (ms) | manual schedule: speed | tuned: speed (options) "
             "| numpy |", "|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['name']} | {r['auto_ms']:.3f} | `{r['manual']}`: "
                     f"{r['manual_ratio']} | {r['tuned_ratio']} ({r['tuned']}) | "
                     f"{r['numpy']} |")
    worst = [r["auto_vs_tuned"] for r in rows if r["auto_vs_tuned"]]
    if worst:
        lines += ["", f"Automatic vs tuned: the automatic schedule runs at "
                      f"{min(worst):.2f}x to {max(worst):.2f}x the tuned one's speed."]
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "auto-vs-manual.md")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    chart = plot(rows, os.path.join(args.out, "auto-vs-manual.png"))
    if chart:
        with open(path, "a") as f:
            f.write("\n![automatic vs manual vs tuned](auto-vs-manual.png)\n")
    print("\n".join(lines))


def plot(rows, path) -> str | None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None

    def value(text):
        return float(text[:-1]) if text.endswith("x") else np.nan

    y = np.arange(len(rows))
    fig, ax = plt.subplots(figsize=(8, 0.5 * len(rows) + 1.5))
    for shift, key, label, color in ((-0.2, "manual_ratio", "manual", "tab:orange"),
                                     (0.2, "tuned_ratio", "tuned", "tab:green")):
        ratios = np.array([value(r[key]) for r in rows])  # bars from parity (1x) outwards
        ax.barh(y + shift, ratios - 1.0, 0.4, left=1.0, label=label, color=color)
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_xscale("log")  # 0.5x and 2x lie the same distance from the automatic schedule
    ax.set_yticks(y, [r["name"] for r in rows])
    ax.invert_yaxis()
    ax.set_xlabel("speed relative to the automatic schedule (log scale; >1 is faster)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return path


if __name__ == "__main__":
    main()
