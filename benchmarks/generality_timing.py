"""One case of the generality benchmark measured: compiled, checked against the float64
reference (tclang and every peer), then timed with its peers in interleaved rounds.

A peer whose result differs from the reference is left out (and named in the row), so a
ratio is never against something that computes another thing; a tclang result that
differs is reported as `wrong` and not timed.
"""

from __future__ import annotations

import time
import traceback

import numpy as np

import tclang
from benchmarks.generality_cases import Case, error_of
from tclang.tools.timing import interleaved
from tclang.driver.roofline import kernel_work, roofline_fraction

TOLERANCE = 1e-3  # of the reference's largest magnitude: float32 sums reordered


def peers(case: Case, arrays: tuple, shape: tuple) -> dict:
    """name -> a call of each peer, returning its result (`shape`: the output's)."""
    import torch
    found = {}
    tensors = tuple(torch.from_numpy(a) for a in arrays)
    if case.einsum:
        out = np.empty(shape, np.float32)
        found["np.einsum"] = lambda: np.einsum(case.einsum, *arrays, out=out, optimize=True)
        found["torch.einsum"] = lambda: torch.einsum(case.einsum, *tensors)
    if case.numpy is not None:
        out_np = np.empty(shape, np.float32)
        found["numpy"] = lambda: case.numpy(*arrays, out_np)
    if case.torch is not None:
        found[f"torch {case.torch_text}".strip()] = lambda: case.torch(*tensors)
    return found


def _result(value) -> np.ndarray:
    return value.numpy() if hasattr(value, "numpy") else np.asarray(value)


def measure_case(case: Case, seed: int, limits: dict, rounds: int, gap: float,
                 time_it: bool = True, backend: str = "cpu", clock=time.perf_counter) -> dict:
    """The row of one case: errors, and with `time_it` medians, ratio and roofline
    (`clock`: tclang.tools.timing.interleaved's)."""
    row = {"family": case.family, "name": case.name, "origin": case.origin,
           "einsum": case.einsum, "status": "ok"}
    arrays = case.arrays(seed)
    want = case.reference(*arrays)
    try:
        start = time.perf_counter()
        compiled = tclang.define(case.source, backend=backend)[case.entry].compile(*arrays)
        row["compile_s"] = time.perf_counter() - start
        got = compiled(*arrays)
    except Exception as e:  # a refusal or a crash is a finding, not the end of the run
        row.update(status="failed", message=f"{type(e).__name__}: {e}"[:2000],
                   trace=traceback.format_exc(limit=3))
        return row
    row["error"] = error_of(got, want)
    if row["error"] > TOLERANCE:
        row["status"] = "wrong"
        return row
    calls = {}
    for name, call in peers(case, arrays, want.shape).items():
        error = error_of(_result(call()), want)
        if error > TOLERANCE:
            row.setdefault("peers_left_out", {})[name] = error
        else:
            calls[name] = call
    if not time_it:
        return row
    out = np.empty_like(got)
    timings = interleaved({"tclang": lambda: compiled(*arrays, out=out), **calls},
                          rounds=rounds, gap=gap, clock=clock)
    return {**row, **_figures(compiled, timings, limits)}


def _figures(compiled, timings: dict, limits: dict) -> dict:
    ours = timings.pop("tclang")
    row = {"tclang_s": ours.median, "tclang_spread": ours.spread,
           "peers": {n: t.median for n, t in timings.items()}}
    flops, moved = kernel_work(compiled.definition, compiled.sizes)
    row.update(flops=flops, bytes=moved, gflops=flops / ours.median / 1e9,
               roofline=roofline_fraction(ours.median, flops, moved, limits))
    if timings:
        best = min(timings, key=lambda n: timings[n].median)
        row.update(best_peer=best, vs_best=timings[best].median / ours.median)
    return row
