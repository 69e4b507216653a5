"""Compile and call many distinct kernels in one process and record the resident memory.

Two workloads, each `count` kernels: distinct sources (a constant varied in the source, each
module dropped after its call) and one kernel called at `count` different sizes (a variant
per size). Each line is `workload kernels RSS-MB live-engines` ("-" where this version of
tclang cannot count its engines): the script measures any version of tclang.

    TCLANG_CACHE_DIR=$(mktemp -d) python tests/soak/rss_soak.py 2500 250 > curve.txt
    python tests/soak/rss_soak.py 300 50 pairs   # one workload: sources, pairs or sizes

Run twice with the same cache directory, the second run loads every kernel from the disk
cache: no scheduling and no LLVM optimization, so what it keeps is only what tclang keeps
(llvmlite leaks ~75 KB per optimization run, see tests/e2e/test_memory.py).
"""

from __future__ import annotations

import gc
import os
import sys

import numpy as np

import tclang as tc

_PAGE = os.sysconf("SC_PAGE_SIZE")


def rss_mb() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * _PAGE / 2**20


def distinct_sources(count: int, every: int):
    """(kernels done, RSS MB) every `every` kernels; each kernel is a new source."""
    x = np.ones(16, np.float32)
    for k in range(1, count + 1):
        mod = tc.define(f"def scale(float(N) A) -> (O) {{ O(i) = A(i) * {k}.0 + 1.0 }}")
        assert mod.scale(x)[0] == k + 1
        del mod
        if k % every == 0:
            yield k, rss_mb()


def distinct_pairs(count: int, every: int):
    """(kernels done, RSS MB) every `every` kernels; each a new two-statement source (more
    of isl's work per compile than `distinct_sources`: the middle end's helper process)."""
    x = np.ones(8, np.float32)
    for k in range(1, count + 1):
        mod = tc.define(f"def k{k}(float(N) X) -> (Y, Z) {{ Y(j) = X(j) * {k}.0\n"
                        f"    Z(j) = Y(j) + 1.0 }}")
        assert getattr(mod, f"k{k}")(x)[1][0] == k + 1
        del mod
        if k % every == 0:
            yield k, rss_mb()


def distinct_sizes(count: int, every: int):
    """(kernels done, RSS MB) every `every` kernels; one kernel, a new size each call."""
    mod = tc.define("def shift(float(N) A) -> (O) { O(i) = A(i) + 2.0 }")
    for k in range(1, count + 1):
        assert mod.shift(np.ones(k, np.float32))[-1] == 3
        if k % every == 0:
            yield k, rss_mb()


def live_engines() -> str:
    """Loaded kernels' code still mapped (MCJIT engines in versions before the ELF loader)."""
    try:
        from backends.llvm import loading
        return str(loading.live_objects())
    except ImportError:
        from backends.llvm import jit
        return str(jit.live_engines()) if hasattr(jit, "live_engines") else "-"


WORKLOADS = {"sources": distinct_sources, "pairs": distinct_pairs, "sizes": distinct_sizes}


def main(count: int, every: int, workloads: str = "sources,sizes") -> None:
    print(f"start 0 {rss_mb():.1f} -", flush=True)
    for name in workloads.split(","):
        for k, mb in WORKLOADS[name](count, every):
            gc.collect()
            print(f"{name} {k} {mb:.1f} {live_engines()}", flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), *sys.argv[3:4])
