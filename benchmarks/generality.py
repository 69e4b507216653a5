"""The generality benchmark: tclang on operators nobody tuned it for (issue 33, item 4).

    python benchmarks/generality.py [--quick] [--seed 0] [--family contraction,window,model]
                                    [--rounds 5] [--gap 0.2] [--clock cpu|wall]
                                    [--json PATH] [--out DIR]

A fixed list of operators is what let tclang be fast on its own benchmarks and slow on
users' operators, so the cases here are drawn, not chosen: random contractions (any
layout, several free and reduction indices; benchmarks/generality_contractions.py),
guarded and windowed reductions with random strides, paddings, masks and triangles
(generality_windows.py), and operators taken from public model code
(generality_models.py, generality_convnets.py, generality_layers.py).

Every case is compiled, and tclang's result and every peer's checked against a float64
NumPy reference before anything is timed (a wrong result is reported, never timed). The
peers: `np.einsum(optimize=True)` and `torch.einsum` where the case is an einsum, NumPy's
own spelling where the case has one, PyTorch's operator where one exists. Everything runs
on one thread (TCLANG_NUM_THREADS, OMP/OpenBLAS/MKL_NUM_THREADS set before NumPy loads,
torch.set_num_threads(1)); outputs are preallocated wherever the API takes `out=`
(tclang, np.einsum, NumPy's ufuncs; torch's functional operators allocate). Timing is
tclang.tools.timing.interleaved: rounds taking turns, a warm-up before each sample, `--gap`
seconds of rest after every sample (BLAS), medians; by default of the calling thread's CPU
time (`--clock cpu`: every implementation runs on that one thread, and the CPU time is
what other processes on a shared machine disturb least; `--clock wall` for the wall).

The report gives each case's ratio to the best peer (>1: tclang faster) and its % of the
roofline (the lower of the one-thread sgemm rate and intensity x triad bandwidth, both
measured in the same run and printed beside the figures), then per family and overall
the geometric mean, the 10th percentile and the worst case; a chart with matplotlib.
A measurement, never a pass/fail test (tests/e2e/test_generality.py checks results only).
"""

from __future__ import annotations

import os

if __name__ == "__main__":  # run as the benchmark (not imported by a test: no side effects)
    for _var in ("TCLANG_NUM_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                 "MKL_NUM_THREADS"):  # read when the libraries load: before numpy is imported
        os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import json  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.generality_cases import FAMILIES, Case  # noqa: E402
from benchmarks.generality_report import plot, summary, table  # noqa: E402
from benchmarks.generality_timing import measure_case  # noqa: E402
from tclang.driver.roofline import machine_limits  # noqa: E402

QUICK_PER_FAMILY = 2


def all_cases(seed: int, quick: bool, families=FAMILIES,
              per_family: int | None = QUICK_PER_FAMILY) -> list[Case]:
    """The cases of `families`: drawn from `seed`; `quick`: small sizes, `per_family` of
    each family (None: all of them)."""
    from benchmarks.generality_contractions import contractions
    from benchmarks.generality_convnets import CONVNETS
    from benchmarks.generality_layers import LAYERS
    from benchmarks.generality_models import TRANSFORMERS
    from benchmarks.generality_windows import windows
    big = not quick
    found = {
        "contraction": lambda: contractions(seed, 16 if big else 8,
                                            (3e8, 1.5e9) if big else (2e3, 2e4)),
        "window": lambda: windows(seed, 2 if big else 1, big),
        "model": lambda: [make(big) for make in TRANSFORMERS + CONVNETS + LAYERS],
    }
    cases = []
    for family in families:
        drawn = found[family]()
        if quick and per_family is not None:  # a few, chosen by the seed
            rng = np.random.default_rng(seed)
            keep = sorted(rng.choice(len(drawn), min(per_family, len(drawn)), False))
            drawn = [drawn[k] for k in keep]
        cases.extend(drawn)
    return cases


def commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, cwd=os.path.dirname(__file__)).stdout.strip()
    except OSError:
        return "unknown"


CLOCKS = {"cpu": time.thread_time, "wall": time.perf_counter}


def run(seed: int = 0, quick: bool = False, families=FAMILIES, rounds: int = 5,
        gap: float = 0.2, time_it: bool = True, log=print, partial: str | None = None,
        clock: str = "cpu") -> dict:
    """Every case checked (and timed unless `time_it` is False): the report's data.
    `partial`: a JSON file rewritten after every case (a long run interrupted keeps its
    rows). `clock`: "cpu" times the calling thread's CPU time (everything runs on it:
    one thread), which other processes on a shared machine disturb far less than the
    wall clock; "wall" the wall clock."""
    import torch
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:  # the caller's torch state given back (a test imports this in its process)
        with torch.no_grad():
            return _run(seed, quick, families, rounds, gap, time_it, log, partial, clock)
    finally:
        torch.set_num_threads(threads)


def _run(seed, quick, families, rounds, gap, time_it, log, partial, clock) -> dict:
    result = {"seed": seed, "quick": quick, "commit": commit(), "load_before": os.getloadavg(),
              "threads": 1, "clock": clock, "rows": []}
    result["limits"] = machine_limits(gap=gap, n=512 if quick else 2048,
                                      triad_elements=1_000_000 if quick else 32_000_000,
                                      clock=CLOCKS[clock])
    cases = all_cases(seed, quick, families)
    for k, case in enumerate(cases, start=1):
        log(f"[{k}/{len(cases)}] {case.family}: {case.name}")
        result["rows"].append(measure_case(case, seed, result["limits"], rounds=rounds,
                                           gap=gap, time_it=time_it, clock=CLOCKS[clock]))
        result.update(load_after=os.getloadavg(), summary=summary(result["rows"]))
        if partial:
            with open(partial, "w") as f:
                json.dump(result, f, indent=1)
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a few small cases (a smoke test)")
    ap.add_argument("--seed", type=int, default=0, help="draws the generated cases")
    ap.add_argument("--family", default=",".join(FAMILIES),
                    help=f"comma-separated families among {', '.join(FAMILIES)}")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds")
    ap.add_argument("--gap", type=float, default=0.2, help="seconds of rest after a sample")
    ap.add_argument("--clock", choices=sorted(CLOCKS), default="cpu",
                    help="cpu: the thread's CPU time (steadier on a busy machine); wall")
    ap.add_argument("--json", help="also write the raw results to this file (after each case)")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
    args = ap.parse_args()
    families = [f.strip() for f in args.family.split(",") if f.strip()]
    unknown = [f for f in families if f not in FAMILIES]
    if unknown:
        ap.error(f"unknown family {', '.join(unknown)}; choose among {', '.join(FAMILIES)}")
    result = run(args.seed, args.quick, families, args.rounds, args.gap,
                 log=lambda s: print(s, file=sys.stderr, flush=True), partial=args.json,
                 clock=args.clock)
    text = table(result)
    print(text)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "generality.md"), "w") as f:
        f.write(text + "\n")
    picture = plot(result, os.path.join(args.out, "generality.png"))
    print(f"\nsaved {args.out}/generality.md" + (f" and {picture}" if picture else ""))


if __name__ == "__main__":
    start = time.perf_counter()
    main()
    print(f"({time.perf_counter() - start:.0f} s)", file=sys.stderr)
