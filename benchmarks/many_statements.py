"""Compile time of programs of many statements, with the time of each stage.

    python benchmarks/many_statements.py N [N...] [--kind KIND] [--generic] [--run]
    python benchmarks/many_statements.py --curve [--repeat R]

Kinds (N statements each):
- independent: `O{k}(i) = A(i) + k`, N outputs that share only their input;
- inplace: `O(i) = A(i)`, then `O(i) = O(i) * 0.5 + A(i)` N - 1 times;
- temporaries: `T{k}(i) = T{k-1}(i) * 0.5 + A(i)`, each statement a new temporary, the
  last one the output;
- network: a tensor network of N contraction steps (benchmarks/einsum_networks.py).

Each compile is cold (a fresh definition, no disk cache) and reports its wall-clock
seconds and its CPU seconds (this process and its helper processes: the scheduler's and
LLVM's), which other processes on a shared machine inflate much less. `--curve` measures
every kind (or the one `--kind` names) at 100, 200, 400 and 1,000 statements (networks at
25, 50, 100 and 177 steps), each in a fresh process, and prints the medians and the
exponent of the growth from each size to the next (CPU time ~ statements ** exponent);
docs/schedules.md, Compile scaling, has the numbers. `--run` also calls the kernel and
checks it against NumPy.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import tclang  # noqa: E402
from benchmarks.einsum_networks import network  # noqa: E402

KINDS = ("independent", "inplace", "temporaries", "network")
CURVE = {"independent": (100, 200, 400, 1000), "inplace": (100, 200, 400, 1000),
         "temporaries": (100, 200, 400, 1000), "network": (25, 50, 100, 177)}
SIZE = 16


def source(n: int, kind: str = "independent") -> str:
    if kind == "independent":
        outputs = ", ".join(f"O{k}" for k in range(n))
        body = [f"O{k}(i) = A(i) + {k}.0" for k in range(n)]
        return f"def many(float(N) A) -> ({outputs}) {{\n    " + "\n    ".join(body) + "\n}"
    if kind == "inplace":
        body = ["O(i) = A(i)"] + ["O(i) = O(i) * 0.5 + A(i)"] * (n - 1)
    elif kind == "temporaries":
        names = [f"T{k}" for k in range(n - 1)] + ["O"]
        body = [f"{names[0]}(i) = A(i)"] + [f"{names[k]}(i) = {names[k - 1]}(i) * 0.5 + A(i)"
                                             for k in range(1, n)]
    elif kind == "network":
        return network(n).source
    else:
        raise ValueError(kind)
    return "def many(float(N) A) -> (O) {\n    " + "\n    ".join(body) + "\n}"


def inputs(n: int, kind: str) -> list[np.ndarray]:
    if kind == "network":
        return network(n).arrays()
    return [np.linspace(0.0, 1.0, SIZE, dtype=np.float32)]


def expected(n: int, kind: str, arrays: list[np.ndarray]):
    if kind == "network":
        return network(n).reference(arrays)
    a = arrays[0].astype(np.float64)
    if kind == "independent":
        return tuple((a + k).astype(np.float32) for k in range(n))
    out = a
    for _ in range(n - 1):
        out = out * 0.5 + a
    return out.astype(np.float32)


def cpu_seconds() -> float:
    """CPU time of this process and of its live children (the scheduling and LLVM helper
    processes): on a shared machine a fairer measure than the wall clock, which counts
    the time other processes held the cores."""
    total = time.process_time()
    tick = os.sysconf("SC_CLK_TCK")
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else ():
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == os.getpid():  # ppid; utime and stime follow at 11, 12
            total += (int(fields[11]) + int(fields[12])) / tick
    return total


def compile_once(n: int, kind: str, generic: bool = False):
    """(seconds, CPU seconds, compiled kernel, kernel) of one cold compile: a fresh
    definition, no disk cache."""
    os.environ["TCLANG_DISK_CACHE"] = "0"
    kernel = tclang.define(source(n, kind), options=tclang.Options(specialize=not generic))
    entry = kernel.network if kind == "network" else kernel.many
    arrays = inputs(n, kind)
    start, cpu = time.perf_counter(), cpu_seconds()
    compiled = entry.compile(*arrays)
    return time.perf_counter() - start, cpu_seconds() - cpu, compiled, entry


def cold_seconds(n: int, kind: str, timeout: float | None = None) -> tuple[float, float]:
    """(seconds, CPU seconds) of one cold compile in a fresh process (no cache of any
    kind, the scheduler's answers included); (inf, inf) past `timeout` seconds."""
    try:
        out = subprocess.run([sys.executable, os.path.abspath(__file__), str(n), "--kind",
                              kind], check=True, capture_output=True, text=True,
                             timeout=timeout).stdout
    except subprocess.TimeoutExpired:
        return math.inf, math.inf
    words = out.split(" statements: ")[1].split()
    return float(words[0]), float(words[2])


def curve(repeat: int, kinds: tuple[str, ...] = KINDS, timeout: float | None = None) -> None:
    """The compile-time curve of `kinds`: the median of `repeat` cold compiles each, wall
    clock and CPU time; the growth exponent from the CPU times. A compile past `timeout`
    seconds shows as inf, and the larger sizes of its kind are not tried."""
    print("| kind | statements | seconds (median) | CPU seconds | x previous (CPU) | exponent |")
    print("|---|---|---|---|---|---|")
    for kind in kinds:
        last = None
        for n in CURVE[kind]:
            if last is not None and math.isinf(last[1]):
                break
            runs = [cold_seconds(n, kind, timeout) for _ in range(repeat)]
            seconds = statistics.median(r[0] for r in runs)
            cpu = statistics.median(r[1] for r in runs)
            growth = exponent = ""
            if last is not None and not math.isinf(cpu):
                growth = f"x{cpu / last[1]:.1f}"
                exponent = f"{math.log(cpu / last[1]) / math.log(n / last[0]):.2f}"
            print(f"| {kind} | {n} | {seconds:.2f} | {cpu:.2f} | {growth} | {exponent} |",
                  flush=True)
            last = (n, cpu)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("n", type=int, nargs="*")
    ap.add_argument("--kind", choices=KINDS)
    ap.add_argument("--generic", action="store_true", help="shape-generic (specialize=False)")
    ap.add_argument("--run", action="store_true", help="call it and compare with NumPy")
    ap.add_argument("--curve", action="store_true")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--timeout", type=float, help="--curve: seconds before a compile is "
                    "given up (inf in the table)")
    args = ap.parse_args()
    args.kind_given, args.kind = args.kind is not None, args.kind or "independent"
    if args.curve:
        curve(args.repeat, (args.kind,) if args.kind_given else KINDS, args.timeout)
        return
    for n in args.n:
        total, cpu, compiled, entry = compile_once(n, args.kind, args.generic)
        print(f"{args.kind}, {n} statements: {total:.2f} s, {cpu:.2f} s CPU, "
              f"LLVM IR {len(compiled.source)} chars", flush=True)
        for stage, seconds in sorted(compiled.timings.items(), key=lambda kv: -kv[1])[:8]:
            print(f"  {stage}: {seconds:.2f} s")
        if args.run:
            arrays = inputs(n, args.kind)
            got, want = entry(*arrays), expected(n, args.kind, arrays)
            for g, w in zip(got if isinstance(got, tuple) else (got,),
                            want if isinstance(want, tuple) else (want,)):
                np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)
            print("  matches NumPy")


if __name__ == "__main__":
    main()
