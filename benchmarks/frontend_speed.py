"""Time the front end (parse + check + range inference) on a 200-statement program.

    python benchmarks/frontend_speed.py [--statements 200] [--repeat 20]

Prints the median and best times; the target for 200 statements is under 100 ms.
"""

from __future__ import annotations

import argparse
import statistics
import time

from tclang.lang.frontend import check_source
from tclang.lang.parser import parse


def make_program(statements: int) -> str:
    """A long chain mixing elementwise statements, row reductions and a final contraction."""
    lines = ["def big(float(N, M) X, float(M, K) W, float(N) v) -> (OUT) {",
             "  T0(n, m) = X(n, m) * 2.0"]
    s = 1
    while len(lines) - 1 < statements - 1:
        prev = f"T{s - 1}"
        kind = s % 4
        if kind == 0:
            lines.append(f"  T{s}(n, m) = fmax({prev}(n, m) + v(n), 0.0) * 0.5")
        elif kind == 1:
            lines.append(f"  T{s}(n, m) = {prev}(n, m) - exp(X(n, m) / (1.0 + abs({prev}(n, m))))")
        elif kind == 2:
            lines.append(f"  R{s}(n) +=! {prev}(n, m) * {prev}(n, m)")
            lines.append(f"  T{s}(n, m) = {prev}(n, m) / sqrt(R{s}(n) + 1e-5)")
        else:
            lines.append(f"  T{s}(n, m) = X(n, m) > 0.0 && m < M - 1 ? {prev}(n, m) : X(n, m)")
        s += 1
    lines = lines[:statements]
    last = lines[-1].split("(")[0].strip()
    lines.append(f"  OUT(n, k) +=! {last}(n, m) * W(m, k)")
    lines.append("}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--statements", type=int, default=200)
    ap.add_argument("--repeat", type=int, default=30)
    args = ap.parse_args()
    source = make_program(args.statements)
    n_statements = sum(len(d.statements) for d in parse(source).definitions)
    check_source(source)  # builds the LALR tables once, as the first define() does
    times = []
    for _ in range(args.repeat):
        start = time.perf_counter()
        check_source(source)
        times.append(time.perf_counter() - start)
    print(f"front end on {n_statements} statements ({len(source)} characters): "
          f"median {statistics.median(times) * 1e3:.1f} ms, best {min(times) * 1e3:.1f} ms "
          f"over {args.repeat} runs (target: under 100 ms)")


if __name__ == "__main__":
    main()
