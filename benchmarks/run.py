"""tclang against NumPy (and PyTorch when it is installed), measured in one run.

    python benchmarks/run.py [--quick] [--rounds 9] [--only matmul,softmax] [--out DIR]

Each operator is compiled first (the compile time is reported separately) and checked
against NumPy. Then the implementations are timed by tclang.tools.timing (the machinery `tclang
demo` uses too; its docstring says why each rule is there): interleaved rounds, so that
machine noise hits all of them alike; tclang writes into a preallocated `out=` array,
NumPy does too where its API allows; a sample is as many calls back to back as take about
20 ms (the same count for every implementation; one call for slow kernels), timed after
~50 ms of untimed calls; after every sample the runner waits `--gap` seconds, so every
implementation starts from the same rest (OpenBLAS's threads spin on after a call). The
table gives the median of the rounds with its spread (the interquartile range over the
median), GFLOP/s or GB/s beside the machine's limits measured in the same run (sgemm at
2048^3 through NumPy's BLAS, a STREAM-style triad), and the ratio against the best peer
(>1: tclang is faster). With matplotlib installed it saves a chart with a log axis.
A measurement, never a pass/fail test.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import tclang  # noqa: E402
from benchmarks import kernels as K  # noqa: E402
from tclang.tools.timing import interleaved  # noqa: E402
from tclang.driver.roofline import machine_limits  # noqa: E402

try:  # optional peer
    import torch
except ImportError:
    torch = None


@dataclass
class Benchmark:
    name: str
    source: str
    entry: str
    inputs: Callable[[np.random.Generator], tuple]
    numpy: Callable  # numpy(*inputs, out) -> result; may ignore `out`
    torch: Callable | None = None
    flops: float = 0.0  # floating-point operations, for GFLOP/s (0: report GB/s)
    tolerance: float = 1e-3

    def bytes_moved(self, inputs, output) -> int:
        return sum(x.nbytes for x in inputs) + output.nbytes


def _softmax(x, out=None):
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return np.divide(e, e.sum(axis=1, keepdims=True), out=out)


def _layernorm(x, g, b, out=None):
    mean = x.mean(axis=1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=1, keepdims=True)
    return np.add((x - mean) / np.sqrt(var + 1e-5) * g, b, out=out)


def _rmsnorm(x, g, out=None):
    ms = (x * x).mean(axis=1, keepdims=True)
    return np.multiply(x / np.sqrt(ms + 1e-5), g, out=out)


def _bias_gelu(x, b, out=None):
    y = x + b
    return np.multiply(0.5 * y, 1 + np.tanh(0.7978845608 * (y + 0.044715 * y * y * y)),
                       out=out)


def _attention(q, k, v, out=None):
    s = (q @ k.T) * 0.125
    e = np.exp(s - s.max(axis=1, keepdims=True))
    return np.matmul(e / e.sum(axis=1, keepdims=True), v, out=out)


def _conv2d(x, w, out=None):
    """NumPy's best: sliding windows contracted with tensordot (BLAS)."""
    kh, kw = w.shape[2], w.shape[3]
    windows = np.lib.stride_tricks.sliding_window_view(x, (kh, kw), axis=(2, 3))
    return np.ascontiguousarray(np.tensordot(windows, w, axes=([1, 4, 5], [1, 2, 3]))
                                .transpose(0, 3, 1, 2))


def _conv1x1(x, w, out=None):
    return np.ascontiguousarray(np.einsum("nchw,mc->nmhw", x, w, optimize=True))


def _matmul(a, b, out=None):
    return np.matmul(a, b, out=out)


def benchmarks(quick: bool) -> list[Benchmark]:
    s = 2 if quick else 1  # --quick shrinks every problem
    f32 = np.float32
    t = torch

    def normal(*shape):
        return lambda r: r.standard_normal(shape, f32)

    def matmul(m, k, n, label=None):
        return Benchmark(label or f"matmul {m}x{k}x{n}", K.MATMUL, "matmul",
                         lambda r: (normal(m, k)(r), normal(k, n)(r)), _matmul,
                         (lambda a, b: a @ b) if t else None, 2.0 * m * k * n)

    n, rows = 1024 // s, 4096 // s
    return [
        matmul(256, 256, 256, "matmul 256^3"),
        matmul(n, n, n, f"matmul {n}^3"),
        matmul(2 * n, 2 * n, 2 * n, f"matmul {2 * n}^3"),
        matmul(1000 // s, 999 // s, 1001 // s, "matmul odd sizes"),
        Benchmark(f"matmul A^T {n}^3", K.MATMUL_TRANSPOSED_A, "matmul_ta",
                  lambda r: (normal(n, n)(r), normal(n, n)(r)),
                  lambda at, b, out=None: np.matmul(at.T, b, out=out),
                  (lambda at, b: at.T @ b) if t else None, 2.0 * n ** 3),
        matmul(rows, 64, rows, f"matmul skinny {rows}x64x{rows}"),
        Benchmark(f"MLP layer {n}x{n}", K.MLP_LAYER, "mlp_layer",
                  lambda r: (normal(n, n)(r), normal(n, n)(r), normal(n)(r)),
                  lambda x, w, b, out=None: np.maximum(x @ w.T + b, 0, out=out),
                  (lambda x, w, b: t.relu(x @ w.T + b)) if t else None, 2.0 * n ** 3),
        Benchmark(f"batched matmul {64 // s}x128^3", K.BMM, "bmm",
                  lambda r: (normal(64 // s, 128, 128)(r), normal(64 // s, 128, 128)(r)),
                  _matmul, (lambda a, b: a @ b) if t else None, 2.0 * (64 // s) * 128 ** 3),
        Benchmark(f"conv2d 3x3 N={8 // s} C=M=64 56x56", K.CONV2D, "conv2d",
                  lambda r: (normal(8 // s, 64, 58, 58)(r), normal(64, 64, 3, 3)(r)),
                  _conv2d, (lambda x, w: t.nn.functional.conv2d(x, w)) if t else None,
                  2.0 * (8 // s) * 64 * 56 * 56 * 64 * 9),
        Benchmark(f"conv2d 1x1 N={8 // s} C=M=64 56x56", K.CONV2D_1X1, "conv1x1",
                  lambda r: (normal(8 // s, 64, 56, 56)(r), normal(64, 64)(r)),
                  _conv1x1, (lambda x, w: t.nn.functional.conv2d(x, w[:, :, None, None]))
                  if t else None, 2.0 * (8 // s) * 64 * 56 * 56 * 64),
        Benchmark(f"attention {rows // 4}x{rows // 4}, d=64", K.ATTENTION, "attention",
                  lambda r: (normal(rows // 4, 64)(r), normal(rows // 4, 64)(r),
                             normal(rows // 4, 64)(r)), _attention,
                  (lambda q, k, v: t.softmax(q @ k.T * 0.125, dim=1) @ v) if t else None,
                  4.0 * (rows // 4) ** 2 * 64),
        Benchmark(f"exp(X)*Y+X, {16 // s}M", K.CHAIN, "chain",
                  lambda r: (normal(16_000_000 // s)(r), normal(16_000_000 // s)(r)),
                  lambda x, y, out=None: np.add(np.exp(x) * y, x, out=out),
                  (lambda x, y: t.exp(x) * y + x) if t else None),
        Benchmark(f"softmax {rows}x1024", K.SOFTMAX, "softmax",
                  lambda r: (normal(rows, 1024)(r),), _softmax,
                  (lambda x: t.softmax(x, dim=1)) if t else None),
        Benchmark(f"layernorm {rows}x1024", K.LAYERNORM, "layernorm",
                  lambda r: (normal(rows, 1024)(r), normal(1024)(r), normal(1024)(r)),
                  _layernorm,
                  (lambda x, g, b: t.nn.functional.layer_norm(x, (1024,), g, b)) if t else None),
        Benchmark(f"RMS norm {rows}x1024", K.RMSNORM, "rmsnorm",
                  lambda r: (normal(rows, 1024)(r), normal(1024)(r)), _rmsnorm,
                  (lambda x, g: x * t.rsqrt((x * x).mean(dim=1, keepdim=True) + 1e-5) * g)
                  if t else None),
        Benchmark(f"bias+GELU {rows}x1024", K.BIAS_GELU, "bias_gelu",
                  lambda r: (normal(rows, 1024)(r), normal(1024)(r)), _bias_gelu,
                  (lambda x, b: t.nn.functional.gelu(x + b, approximate="tanh"))
                  if t else None),
    ]


def progress(k: int, total: int, label: str) -> None:
    width = 30
    done = int(width * k / total)
    print(f"\r[{'#' * done}{'.' * (width - done)}] {k}/{total} {label:<40}", end="",
          file=sys.stderr, flush=True)
    if k == total:
        print(file=sys.stderr)


def run(args) -> tuple[list[dict], dict]:
    rng = np.random.default_rng(0)
    rows = []
    cases = benchmarks(args.quick)
    if args.only:
        wanted = [w.strip().lower() for w in args.only.split(",")]
        cases = [b for b in cases if any(w in b.name.lower() for w in wanted)]
    progress(0, len(cases) + 1, "machine limits")
    limits = machine_limits(gap=args.gap)
    for k, b in enumerate(cases, start=1):
        progress(k, len(cases) + 1, b.name)
        inputs = b.inputs(rng)
        kernel = tclang.define(b.source)[b.entry]
        start = time.perf_counter()
        compiled = kernel.compile(*inputs)
        compile_s = time.perf_counter() - start
        ours = compiled(*inputs)
        expected = b.numpy(*inputs)
        error = float(np.max(np.abs(ours - expected) / np.maximum(np.abs(expected), 1.0)))
        out_ours, out_numpy = np.empty_like(ours), np.empty_like(expected)
        peers = {"numpy": lambda: b.numpy(*inputs, out=out_numpy)}
        if b.torch is not None:
            torch_inputs = tuple(torch.from_numpy(x) for x in inputs)

            def run_torch():
                with torch.no_grad():
                    b.torch(*torch_inputs)
            peers["torch"] = run_torch
        calls = {"tclang": lambda: compiled(*inputs, out=out_ours), **peers}
        timings = interleaved(calls, rounds=args.rounds, gap=args.gap)
        row = {"name": b.name, "compile_s": compile_s, "error": error, "torch": None}
        for name, timing in timings.items():
            row[name] = float(timing.median)
            row[name + "_spread"] = timing.spread
        row["best_peer"] = min(peers, key=lambda p: row[p])
        row["vs_best"] = row[row["best_peer"]] / row["tclang"]
        if b.flops:
            row["rate"], row["unit"] = b.flops / row["tclang"] / 1e9, "GFLOP/s"
        else:
            row["rate"], row["unit"] = b.bytes_moved(inputs, ours) / row["tclang"] / 1e9, "GB/s"
        rows.append(row)
    progress(len(cases) + 1, len(cases) + 1, "done")
    return rows, limits


def table(rows: list[dict], limits: dict) -> str:
    has_torch = any(r["torch"] is not None for r in rows)
    head = "| operator | tclang (ms) | tclang rate | NumPy (ms) |"
    line = "|---|---|---|---|"
    if has_torch:
        head += " PyTorch (ms) |"
        line += "---|"
    head += " tclang vs best peer | compile (s) | max rel. error |"
    line += "---|---|---|"
    out = [f"Machine: sgemm (NumPy, 2048^3) {limits['sgemm_gflops']:.1f} GFLOP/s, "
           f"triad {limits['triad_gbs']:.1f} GB/s. Medians of the rounds, "
           f"± the interquartile range over the median.", "", head, line]
    for r in rows:
        cells = (f"| {r['name']} | {r['tclang'] * 1e3:.2f} ±{r['tclang_spread']:.0%} | "
                 f"{r['rate']:.1f} {r['unit']} | {r['numpy'] * 1e3:.2f} "
                 f"±{r['numpy_spread']:.0%} |")
        if has_torch:
            cells += " - |" if r["torch"] is None else \
                f" {r['torch'] * 1e3:.2f} ±{r['torch_spread']:.0%} |"
        cells += f" {r['vs_best']:.2f}x ({r['best_peer']}) | {r['compile_s']:.2f} | " \
                 f"{r['error']:.1e} |"
        out.append(cells)
    return "\n".join(out)


def plot(rows: list[dict], path: str) -> str | None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    names = [r["name"] for r in rows]
    y = np.arange(len(rows))
    fig, ax = plt.subplots(figsize=(8, 0.6 * len(rows) + 1.5))
    ax.barh(y - 0.2, [r["numpy"] / r["tclang"] for r in rows], 0.4, label="vs NumPy")
    if any(r["torch"] for r in rows):
        ax.barh(y + 0.2, [(r["torch"] or 0) / r["tclang"] for r in rows], 0.4,
                label="vs PyTorch")
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_xscale("log")  # 0.5x and 2x lie the same distance from parity
    ax.set_yticks(y, names)
    ax.invert_yaxis()
    ax.set_xlabel("tclang speed relative to the peer (>1: tclang is faster; log scale)")
    ax.set_title(f"tclang {tclang.__version__} on {platform.machine()}, "
                 f"{os.cpu_count()} cores")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smaller problems (a quick look)")
    ap.add_argument("--rounds", type=int, default=9, help="interleaved timing rounds")
    ap.add_argument("--gap", type=float, default=0.5,
                    help="seconds of rest after every sample (BLAS threads spin after a call)")
    ap.add_argument("--only", help="comma-separated parts of operator names to run")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
    args = ap.parse_args()
    rows, limits = run(args)
    text = table(rows, limits)
    print(text)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "latest.json"), "w") as f:
        json.dump({"limits": limits, "rows": rows}, f, indent=1)
    with open(os.path.join(args.out, "latest.md"), "w") as f:
        f.write(text + "\n")
    picture = plot(rows, os.path.join(args.out, "latest.png"))
    print(f"\nsaved {args.out}/latest.md, latest.json" + (f" and {picture}" if picture else
                                                         " (pip install matplotlib for a chart)"))


if __name__ == "__main__":
    main()
