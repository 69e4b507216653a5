"""Polyhedral compile time (scop + dependences + schedule + tiling + AST) per kernel.

    python benchmarks/compile_time.py [--repeat 5] [--generic]

Prints the best of several runs for each stage, in milliseconds, for the CPU target.
Targets: under 100 ms per kernel, under 300 ms for MLP3 (9 statements).
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import kernels as K  # noqa: E402
from polyhedral.pipeline import schedule_definition  # noqa: E402
from tclang.frontend import check_source  # noqa: E402
from tclang.options import Options  # noqa: E402
from tclang.target import Target  # noqa: E402

CASES = [
    ("matmul", K.MATMUL, dict(M=1024, K=1024, N=1024)),
    ("conv2d", K.CONV2D, dict(N=8, C=64, H=58, W=58, M=64, KH=3, KW=3)),
    ("mlp3", K.MLP3, dict(B=1024, I=1024, H=1024, O=1024)),
    ("softmax", K.SOFTMAX, dict(N=4096, D=1024)),
    ("layernorm", K.LAYERNORM, dict(N=4096, D=1024)),
]
STAGES = ("scop", "dependences", "schedule", "transform", "ast")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--generic", action="store_true", help="shape-generic (specialize=False)")
    args = ap.parse_args()
    target = Target("cpu", "threads", cores=os.cpu_count() or 1)
    options = Options(specialize=not args.generic)
    print(f"| kernel | statements | {' | '.join(STAGES)} | total (ms) |")
    print("|---|---|" + "---|" * (len(STAGES) + 1))
    for name, source, sizes in CASES:
        defn = check_source(source).definitions[0]
        best = None
        for _ in range(args.repeat):
            result = schedule_definition(defn, None if args.generic else sizes, options, target)
            if best is None or sum(result.timings.values()) < sum(best.values()):
                best = result.timings
        statements = len(result.kernel.statements)
        cells = " | ".join(f"{best.get(s, 0) * 1e3:.1f}" for s in STAGES)
        print(f"| {name} | {statements} | {cells} | {sum(best.values()) * 1e3:.1f} |")


if __name__ == "__main__":
    main()
