"""backend="cuda" against PyTorch CUDA (cuBLAS, cuDNN) and CuPy, measured in one run.

    python benchmarks/gpu_peers.py [--quick] [--rounds 7] [--only matmul,softmax] [--out DIR]

Needs an NVIDIA GPU, PyCUDA and PyTorch (CuPy is an optional extra peer). Every operator
is compiled first (its compile time is reported apart) and checked against PyTorch. All
arguments are PyTorch CUDA tensors, so tclang runs on them in place and writes into a
preallocated `out=` tensor; the peers write into preallocated outputs where their API
allows. Implementations are timed in interleaved rounds with CUDA events around a batch of
calls (as many as take ~20 ms), after a synchronize; the table gives the median of the
rounds, TFLOP/s or GB/s, the device's limits measured in the same run (a device-to-device
copy's bandwidth, PyTorch's fp32 and fp16 matmul at 8192^3) and the ratio to the best peer
(>1: tclang is faster). A last table gives the per-call cost of a tiny kernel: tclang's
whole Python call (argument checks, launch, error record read back) against a PyTorch
elementwise op. A measurement, never a pass/fail test.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Callable

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import tclang  # noqa: E402
from benchmarks import kernels as K  # noqa: E402

try:
    import torch
except ImportError:  # the script says so in main()
    torch = None
try:
    import cupy
    CUPY_MISSING = None
except Exception as err:  # ImportError, or a CuPy built for another CUDA failing to load
    cupy = None
    CUPY_MISSING = f"{type(err).__name__}: {err}"

HALF_MATMUL = K.MATMUL.replace("float", "half")
BF16_MATMUL = K.MATMUL.replace("float", "bfloat16")


@dataclass
class GpuBenchmark:
    name: str
    source: str
    entry: str
    inputs: Callable[[], tuple]          # torch CUDA tensors
    torch: Callable                      # torch(*inputs) -> tensor
    cupy: Callable | None = None         # cupy(*cupy_inputs) -> array
    flops: float = 0.0                   # 0: report GB/s
    tolerance: float = 2e-3


def _bytes(inputs, output) -> int:
    return sum(x.numel() * x.element_size() for x in inputs) + \
        output.numel() * output.element_size()


def benchmarks(quick: bool) -> list[GpuBenchmark]:
    s = 4 if quick else 1
    F = torch.nn.functional

    def normal(*shape, dtype=torch.float32):
        return torch.randn(*shape, device="cuda", dtype=dtype)

    n, rows = 4096 // s, 16384 // s
    chain = (1 << 26) // s
    return [
        GpuBenchmark(f"matmul {n}^3 fp32", K.MATMUL, "matmul",
                     lambda: (normal(n, n), normal(n, n)), lambda a, b: a @ b,
                     lambda a, b: a @ b, 2.0 * n ** 3),
        GpuBenchmark(f"matmul {n}^3 fp16", HALF_MATMUL, "matmul",
                     lambda: (normal(n, n, dtype=torch.half), normal(n, n, dtype=torch.half)),
                     lambda a, b: a @ b, lambda a, b: a @ b, 2.0 * n ** 3, tolerance=5e-2),
        GpuBenchmark(f"matmul {n}^3 bf16", BF16_MATMUL, "matmul",
                     lambda: (normal(n, n, dtype=torch.bfloat16),
                              normal(n, n, dtype=torch.bfloat16)),
                     lambda a, b: a @ b, None, 2.0 * n ** 3, tolerance=5e-2),
        GpuBenchmark(f"MLP layer {n}x{n}", K.MLP_LAYER, "mlp_layer",
                     lambda: (normal(n, n), normal(n, n), normal(n)),
                     lambda x, w, b: torch.relu(F.linear(x, w, b)), None, 2.0 * n ** 3),
        GpuBenchmark(f"batched matmul {64 // s}x512^3", K.BMM, "bmm",
                     lambda: (normal(64 // s, 512, 512), normal(64 // s, 512, 512)),
                     lambda a, b: a @ b, lambda a, b: a @ b, 2.0 * (64 // s) * 512 ** 3),
        GpuBenchmark(f"conv2d 3x3 N={32 // s} C=M=64 56x56", K.CONV2D, "conv2d",
                     lambda: (normal(32 // s, 64, 58, 58), normal(64, 64, 3, 3)),
                     lambda x, w: F.conv2d(x, w), None, 2.0 * (32 // s) * 64 * 56 * 56 * 64 * 9),
        GpuBenchmark(f"softmax {rows}x1024", K.SOFTMAX, "softmax",
                     lambda: (normal(rows, 1024),), lambda x: torch.softmax(x, dim=1), None),
        GpuBenchmark(f"layernorm {rows}x1024", K.LAYERNORM, "layernorm",
                     lambda: (normal(rows, 1024), normal(1024), normal(1024)),
                     lambda x, g, b: F.layer_norm(x, (1024,), g, b), None),
        GpuBenchmark(f"exp(X)*Y+X, 2^{(chain).bit_length() - 1} floats", K.CHAIN, "chain",
                     lambda: (normal(chain), normal(chain)),
                     lambda x, y: torch.exp(x) * y + x,
                     lambda x, y: cupy.exp(x) * y + x),
    ]


def time_batch(call, repeats: int) -> float:
    """Seconds per call: CUDA events around `repeats` back-to-back calls."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(repeats):
        call()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3 / repeats


def repeats_for(call, least: float = 0.02) -> int:
    once = time_batch(call, 1)
    return max(1, min(1000, int(least / max(once, 1e-7))))


def device_limits() -> dict:
    """What this GPU can do, measured now: copy bandwidth and PyTorch's matmul rates."""
    big = torch.empty(1 << 28, device="cuda")  # 1 GiB
    dst = torch.empty_like(big)
    copy = min(time_batch(lambda: dst.copy_(big), 5) for _ in range(3))
    limits = {"device": torch.cuda.get_device_name(),
              "copy GB/s (read+write)": 2 * big.numel() * 4 / copy / 1e9}
    del big, dst
    for dtype, label in ((torch.float32, "fp32"), (torch.half, "fp16")):
        a = torch.randn(8192, 8192, device="cuda", dtype=dtype)
        allow = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = False
        seconds = min(time_batch(lambda: a @ a, 3) for _ in range(3))
        torch.backends.cuda.matmul.allow_tf32 = allow
        limits[f"torch matmul 8192^3 {label} TFLOP/s"] = 2 * 8192 ** 3 / seconds / 1e12
    return limits


def run(args) -> tuple[list[dict], dict]:
    torch.backends.cuda.matmul.allow_tf32 = False  # cuBLAS in true fp32, as tclang computes
    torch.backends.cudnn.allow_tf32 = False
    limits = device_limits()
    chosen = [b for b in benchmarks(args.quick)
              if not args.only or any(o in b.name or o == b.entry for o in args.only)]
    rows = []
    for k, bench in enumerate(chosen, 1):
        print(f"[{k}/{len(chosen)}] {bench.name}", flush=True)
        inputs = bench.inputs()
        kernel = getattr(tclang.define(bench.source, backend="cuda"), bench.entry)
        began = time.perf_counter()
        compiled = kernel.compile(*inputs)
        compile_s = time.perf_counter() - began
        expected = bench.torch(*inputs)
        out = torch.empty_like(expected)
        compiled(*inputs, out=out)
        torch.cuda.synchronize()
        error = float((out.float() - expected.float()).abs().max() /
                      expected.float().abs().max().clamp_min(1e-30))
        calls = {"tclang": lambda: compiled(*inputs, out=out),
                 "torch": lambda: bench.torch(*inputs)}
        if bench.cupy is not None and cupy is not None:
            cupy_inputs = [cupy.asarray(x) for x in inputs]
            calls["cupy"] = lambda: bench.cupy(*cupy_inputs)
        repeats = {name: repeats_for(call) for name, call in calls.items()}
        samples = {name: [] for name in calls}
        for _ in range(args.rounds):
            for name, call in calls.items():
                samples[name].append(time_batch(call, repeats[name]))
        medians = {name: statistics.median(v) for name, v in samples.items()}
        best_peer = min(v for name, v in medians.items() if name != "tclang")
        work = bench.flops / 1e12 if bench.flops else _bytes(inputs, out) / 1e9
        rows.append({"name": bench.name, "compile_s": compile_s, "max_rel_error": error,
                     "ok": error <= bench.tolerance,
                     "seconds": medians, "unit": "TFLOP/s" if bench.flops else "GB/s",
                     "rate": {n: work / v for n, v in medians.items()},
                     "ratio": best_peer / medians["tclang"]})
        del inputs, out, expected
        torch.cuda.empty_cache()
    rows.append(launch_overhead())
    return rows, limits


def launch_overhead(calls: int = 2000) -> dict:
    """Per-call wall time of a one-element kernel, host work included, against torch."""
    kernel = tclang.define("def inc(float(N) X) -> (Y) { Y(i) = X(i) + 1 }",
                           backend="cuda").inc
    x = torch.zeros(1, device="cuda")
    out = torch.empty_like(x)
    compiled = kernel.compile(x)
    timings = {}
    for name, call in (("tclang", lambda: compiled(x, out=out)),
                       ("tclang via Kernel", lambda: kernel(x, out=out)),
                       ("torch", lambda: torch.add(x, 1, out=out))):
        for _ in range(50):
            call()
        torch.cuda.synchronize()
        began = time.perf_counter()
        for _ in range(calls):
            call()
        torch.cuda.synchronize()
        timings[name] = (time.perf_counter() - began) / calls
    return {"name": "launch overhead (1 element)", "us_per_call":
            {n: v * 1e6 for n, v in timings.items()}}


def table(rows: list[dict], limits: dict) -> str:
    lines = ["| operator | tclang | torch | cupy | unit | tclang speed / best peer's | "
             "compile s | max rel. error |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "us_per_call" in r:
            continue
        rate = r["rate"]
        cells = [f"{rate[n]:.2f}" if n in rate else "-" for n in ("tclang", "torch", "cupy")]
        lines.append(f"| {r['name']} | {' | '.join(cells)} | {r['unit']} | "
                     f"{r['ratio']:.2f}x | {r['compile_s']:.2f} | {r['max_rel_error']:.1e}"
                     f"{'' if r['ok'] else ' WRONG'} |")
    for r in rows:
        if "us_per_call" in r:
            lines.append("")
            lines.append("per call, one element: " + ", ".join(
                f"{n} {v:.1f} us" for n, v in r["us_per_call"].items()))
    lines.append("")
    lines.append("limits measured in this run: " + ", ".join(
        f"{k} {v:.1f}" if isinstance(v, float) else f"{k} {v}" for k, v in limits.items()))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="problems 4x smaller")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--only", type=lambda s: s.split(","), default=None)
    parser.add_argument("--out", default=None, help="write cuda.json and cuda.md here")
    args = parser.parse_args()
    if torch is None or not torch.cuda.is_available():
        sys.exit("benchmarks/gpu_peers.py needs PyTorch with CUDA and an NVIDIA GPU")
    rows, limits = run(args)
    text = table(rows, limits)
    if CUPY_MISSING:
        text += f"\nCuPy not measured ({CUPY_MISSING})\n"
    print(text)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "cuda.json"), "w") as f:
            json.dump({"rows": rows, "limits": limits}, f, indent=1)
        with open(os.path.join(args.out, "cuda.md"), "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
