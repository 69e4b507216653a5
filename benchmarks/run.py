"""tclang against NumPy (and PyTorch when it is installed), measured in one run.

    python benchmarks/run.py [--quick] [--repeat 10] [--out benchmarks/results]

Each operator is compiled first (the compile time is reported separately), checked against
NumPy, then timed: the best of `--repeat` runs of each implementation, interleaved so that
machine noise hits all of them alike. Prints a markdown table of times and ratios
(tclang's speed relative to each peer: >1 means tclang is faster) and, when matplotlib is
installed, saves a bar chart. It is a measurement, never a pass/fail test.
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
    numpy: Callable
    torch: Callable | None = None
    tolerance: float = 1e-3


def _softmax(x):
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def _layernorm(x, g, b):
    mean = x.mean(axis=1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=1, keepdims=True)
    return (x - mean) / np.sqrt(var + 1e-5) * g + b


def _conv2d(x, w):
    """NumPy's best: sliding windows contracted with tensordot (BLAS)."""
    kh, kw = w.shape[2], w.shape[3]
    windows = np.lib.stride_tricks.sliding_window_view(x, (kh, kw), axis=(2, 3))
    return np.ascontiguousarray(np.tensordot(windows, w, axes=([1, 4, 5], [1, 2, 3]))
                                .transpose(0, 3, 1, 2))


def benchmarks(quick: bool) -> list[Benchmark]:
    s = 2 if quick else 1  # --quick shrinks every problem
    n = 1024 // s
    f32 = np.float32
    t = torch
    return [
        Benchmark("matmul 1024^3" if not quick else f"matmul {n}^3", K.MATMUL, "matmul",
                  lambda r: (r.standard_normal((n, n), f32), r.standard_normal((n, n), f32)),
                  lambda a, b: a @ b, (lambda a, b: a @ b) if t else None),
        Benchmark(f"MLP layer {n}x{n}", K.MLP_LAYER, "mlp_layer",
                  lambda r: (r.standard_normal((n, n), f32), r.standard_normal((n, n), f32),
                             r.standard_normal(n, f32)),
                  lambda x, w, b: np.maximum(x @ w.T + b, 0),
                  (lambda x, w, b: t.relu(x @ w.T + b)) if t else None),
        Benchmark(f"exp(X)*Y+X, {16 // s}M", K.CHAIN, "chain",
                  lambda r: (r.standard_normal(16_000_000 // s, f32),
                             r.standard_normal(16_000_000 // s, f32)),
                  lambda x, y: np.exp(x) * y + x, (lambda x, y: t.exp(x) * y + x) if t else None),
        Benchmark(f"softmax {4096 // s}x1024", K.SOFTMAX, "softmax",
                  lambda r: (r.standard_normal((4096 // s, 1024), f32),),
                  _softmax, (lambda x: t.softmax(x, dim=1)) if t else None),
        Benchmark(f"layernorm {4096 // s}x1024", K.LAYERNORM, "layernorm",
                  lambda r: (r.standard_normal((4096 // s, 1024), f32),
                             r.standard_normal(1024, f32), r.standard_normal(1024, f32)),
                  _layernorm,
                  (lambda x, g, b: t.nn.functional.layer_norm(x, (1024,), g, b)) if t else None),
        Benchmark(f"conv2d N={8 // s} C=64 56x56 M=64 3x3", K.CONV2D, "conv2d",
                  lambda r: (r.standard_normal((8 // s, 64, 58, 58), f32),
                             r.standard_normal((64, 64, 3, 3), f32)),
                  _conv2d, (lambda x, w: t.nn.functional.conv2d(x, w)) if t else None),
        Benchmark(f"batched matmul {64 // s}x128^3", K.BMM, "bmm",
                  lambda r: (r.standard_normal((64 // s, 128, 128), f32),
                             r.standard_normal((64 // s, 128, 128), f32)),
                  np.matmul, (lambda a, b: a @ b) if t else None),
    ]


def best_of(fn, args, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn(*args)
        times.append(time.perf_counter() - start)
    return min(times)


def progress(k: int, total: int, label: str) -> None:
    width = 30
    done = int(width * k / total)
    print(f"\r[{'#' * done}{'.' * (width - done)}] {k}/{total} {label:<40}", end="",
          file=sys.stderr, flush=True)
    if k == total:
        print(file=sys.stderr)


def run(args) -> list[dict]:
    rng = np.random.default_rng(0)
    rows = []
    cases = benchmarks(args.quick)
    for k, b in enumerate(cases):
        progress(k, len(cases), b.name)
        inputs = b.inputs(rng)
        kernel = tclang.define(b.source)[b.entry]
        start = time.perf_counter()
        compiled = kernel.compile(*inputs)
        compile_s = time.perf_counter() - start
        ours = compiled(*inputs)
        expected = b.numpy(*inputs)
        error = float(np.max(np.abs(ours - expected) / np.maximum(np.abs(expected), 1.0)))
        row = {"name": b.name, "compile_s": compile_s, "error": error,
               "tclang": float("inf"), "numpy": float("inf"), "torch": None}
        torch_inputs = tuple(torch.from_numpy(x) for x in inputs) if b.torch else None
        if torch_inputs is not None:
            row["torch"] = float("inf")
        for _ in range(args.repeat):  # interleaved: noise hits every implementation alike
            row["tclang"] = min(row["tclang"], best_of(compiled, inputs, 1))
            row["numpy"] = min(row["numpy"], best_of(b.numpy, inputs, 1))
            if torch_inputs is not None:
                with torch.no_grad():
                    row["torch"] = min(row["torch"], best_of(b.torch, torch_inputs, 1))
        rows.append(row)
    progress(len(cases), len(cases), "done")
    return rows


def table(rows: list[dict]) -> str:
    has_torch = any(r["torch"] is not None for r in rows)
    head = "| operator | tclang (ms) | NumPy (ms) | tclang vs NumPy |"
    line = "|---|---|---|---|"
    if has_torch:
        head += " PyTorch (ms) | tclang vs PyTorch |"
        line += "---|---|"
    head += " compile (s) | max rel. error |"
    line += "---|---|"
    out = [head, line]
    for r in rows:
        cells = f"| {r['name']} | {r['tclang'] * 1e3:.2f} | {r['numpy'] * 1e3:.2f} | " \
                f"{r['numpy'] / r['tclang']:.2f}x |"
        if has_torch:
            if r["torch"] is None:
                cells += " - | - |"
            else:
                cells += f" {r['torch'] * 1e3:.2f} | {r['torch'] / r['tclang']:.2f}x |"
        cells += f" {r['compile_s']:.2f} | {r['error']:.1e} |"
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
    ax.set_yticks(y, names)
    ax.invert_yaxis()
    ax.set_xlabel("tclang speed relative to the peer (>1: tclang is faster)")
    ax.set_title(f"tclang {tclang.__version__} on {platform.machine()}, "
                 f"{os.cpu_count()} cores")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smaller problems (a quick look)")
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
    args = ap.parse_args()
    rows = run(args)
    text = table(rows)
    print(text)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "latest.json"), "w") as f:
        json.dump(rows, f, indent=1)
    with open(os.path.join(args.out, "latest.md"), "w") as f:
        f.write(text + "\n")
    picture = plot(rows, os.path.join(args.out, "latest.png"))
    print(f"\nsaved {args.out}/latest.md, latest.json" + (f" and {picture}" if picture else
                                                         " (pip install matplotlib for a chart)"))


if __name__ == "__main__":
    main()
