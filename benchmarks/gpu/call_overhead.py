"""Where a tclang call on PyTorch CUDA tensors spends its time, on one GPU.

    python benchmarks/gpu/call_overhead.py

For softmax and layernorm at 16384 x 1024: the time per call of back-to-back calls (CUDA
events around a batch), the kernels' own time per call (PyTorch's profiler, which sees
every kernel on the device), and the host's time per call; then a profile (cProfile) of
1,000 calls of a one-element kernel, the functions with the most time of their own. A
diagnosis, not a test.
"""

from __future__ import annotations

import cProfile
import os
import pstats
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import torch  # noqa: E402

import tclang as tc  # noqa: E402
from benchmarks import kernels as K  # noqa: E402
from benchmarks.gpu_peers import time_batch  # noqa: E402


def kernel_time(call, calls: int = 20) -> float:
    """Seconds of GPU kernels per call (all kernels the profiler saw)."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            call()
        torch.cuda.synchronize()
    total = sum(e.self_device_time_total for e in prof.key_averages())
    return total / 1e6 / calls


def main() -> None:
    n, d = 16384, 1024
    x = torch.randn(n, d, device="cuda")
    g, b = torch.randn(d, device="cuda"), torch.randn(d, device="cuda")
    out = torch.empty(n, d, device="cuda")
    sm = tc.define(K.SOFTMAX, backend="cuda").softmax
    ln = tc.define(K.LAYERNORM, backend="cuda").layernorm
    cases = {"softmax": lambda: sm(x, out=out), "layernorm": lambda: ln(x, g, b, out=out),
             "torch softmax": lambda: torch.softmax(x, dim=1, out=out)}
    moved = 2 * n * d * 4
    for name, call in cases.items():
        for _ in range(5):
            call()
        torch.cuda.synchronize()
        per_call = time_batch(call, 100)
        device = kernel_time(call)
        start = time.perf_counter()
        for _ in range(100):
            call()
        host = (time.perf_counter() - start) / 100
        torch.cuda.synchronize()
        print(f"{name:14s} per call {per_call * 1e6:7.1f} us ({moved / per_call / 1e9:6.0f} GB/s), "
              f"kernels {device * 1e6:7.1f} us ({moved / device / 1e9:6.0f} GB/s), "
              f"host {host * 1e6:6.1f} us")
    one = torch.ones(1, device="cuda")
    tiny = tc.define("def f(float(N) X) -> (Y) { Y(i) = X(i) + 1 }", backend="cuda").f
    res = torch.empty(1, device="cuda")
    for _ in range(10):
        tiny(one, out=res)
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(1000):
        tiny(one, out=res)
    profiler.disable()
    torch.cuda.synchronize()
    pstats.Stats(profiler).sort_stats("tottime").print_stats(14)


if __name__ == "__main__":
    main()
