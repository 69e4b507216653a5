"""Tile shapes of the GPU contraction kernels, timed against each other on one GPU.

    python benchmarks/gpu/tile_variants.py [--n 4096]

Each variant patches the planner's tile table (polyhedral/tile_contraction.py) in this
process, restarts the middle end's helper so it schedules with the patch, and compiles
the kernel under its own name (so no cache answers for another variant). Times are the
median of 5 rounds of CUDA-event batches (benchmarks/gpu_peers.py), outputs preallocated;
cuBLAS through PyTorch in the same run. A measurement for choosing the defaults, not a
test.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import torch  # noqa: E402

import tclang as tc  # noqa: E402
from benchmarks.gpu_peers import repeats_for, time_batch  # noqa: E402
from polyhedral import tile_contraction as T  # noqa: E402
from tclang.driver import middle_end  # noqa: E402

VARIANTS = {  # name: (tiles, warp tile of the largest tile, stages, depth of a slice)
    "128x128x32 w64x32 3 stages": (((128, 128),), (64, 32), 3, 32),
    "128x128x64 w64x32 2 stages": (((128, 128),), (64, 32), 2, 64),
    "128x128x64 w64x32 3 stages": (((128, 128),), (64, 32), 3, 64),
    "128x128x64 w32x64 3 stages": (((128, 128),), (32, 64), 3, 64),
    "128x128x32 w32x64 4 stages": (((128, 128),), (32, 64), 4, 32),
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=4096)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    n = args.n
    flops = 2.0 * n ** 3
    rows = []
    original, tiles_default, stages_default, depth_default = \
        T._warp_tile, T.TILES, T.STAGES, T.MMA_DEPTH
    for dtype, name in ((torch.half, "half"), (torch.float32, "float")):
        a = torch.randn(n, n, device="cuda", dtype=dtype)
        b = torch.randn(n, n, device="cuda", dtype=dtype)
        out = torch.empty(n, n, device="cuda", dtype=dtype)
        calls = {"cuBLAS": lambda: torch.matmul(a, b, out=out)}
        for k, (label, (tiles, warp, stages, depth)) in enumerate(VARIANTS.items()):
            if name == "float" and (tiles, warp) != (((128, 128),), (64, 32)):
                continue  # the CUDA cores' kernel has no warp tile, nor stages
            T.TILES, T.STAGES, T.MMA_DEPTH = tiles, stages, depth
            T._warp_tile = (lambda w, big: (lambda bm, bn: w if (bm, bn) == big
                                            else original(bm, bn)))(warp, tiles[0])
            middle_end.stop()
            source = (f"def mm{k}({name}(M,K) A, {name}(K,N) B) -> (C) "
                      f"{{ C(m,n) +=! A(m,k) * B(k,n) }}")
            fn = getattr(tc.define(source, backend="cuda"), f"mm{k}")
            got = fn(a, b)
            want = (a.float() @ b.float())
            err = ((got.float() - want).norm() / want.norm()).item()
            calls[f"{label} (err {err:.1e})"] = (lambda f: lambda: f(a, b, out=out))(fn)
        times = {key: [] for key in calls}
        repeats = {key: repeats_for(c) for key, c in calls.items()}
        for _ in range(args.rounds):
            for key, c in calls.items():
                times[key].append(time_batch(c, repeats[key]))
        for key in calls:
            t = statistics.median(times[key])
            rows.append((name, key, flops / t / 1e12))
    T._warp_tile, T.TILES, T.STAGES, T.MMA_DEPTH = \
        original, tiles_default, stages_default, depth_default
    print("| dtype | kernel | TFLOP/s |\n|---|---|---|")
    for name, key, rate in rows:
        print(f"| {name} | {key} | {rate:.1f} |")


if __name__ == "__main__":
    main()
