"""What this machine can do, and how much work a kernel does: the two sides of a roofline.

machine_limits measures sgemm GFLOP/s through NumPy's BLAS (all cores) and a STREAM-style
triad in GB/s, now, on this machine (these machines are shared: limits measured in the
same run as the kernels are the only fair denominator). kernel_work counts a definition's
floating-point operations and the bytes its inputs and outputs occupy, for GFLOP/s, GB/s
and the percentage of the roofline min(peak, intensity x bandwidth).
"""

from __future__ import annotations

import math
import time

import numpy as np

from tclang.lang.program import (Binary, Call, Cast, Compare, Definition, Select, Unary,
                            evaluate_shape)

ARITHMETIC = ("add", "sub", "mul", "div")


def machine_limits(gap: float = 0.5, n: int = 2048, triad_elements: int = 32_000_000,
                   clock=time.perf_counter) -> dict:
    """{"sgemm_gflops", "triad_gbs"}: best of a few runs each; `gap` seconds of rest after
    each BLAS call (its threads spin for a while after returning). `clock`: see
    tclang.tools.timing.interleaved (time.thread_time with BLAS on one thread)."""
    rng = np.random.default_rng(1)
    a, b, c = (rng.standard_normal((n, n), np.float32) for _ in range(3))
    times = []
    for _ in range(3):
        start = clock()
        np.matmul(a, b, out=c)
        times.append(clock() - start)
        time.sleep(gap)
    x, y, z = (rng.standard_normal(triad_elements, np.float32) for _ in range(3))
    triads = []
    for _ in range(5):
        start = clock()
        np.multiply(z, 3.0, out=x)
        np.add(x, y, out=x)
        triads.append(clock() - start)
    # the two passes move 5 arrays' bytes: read z, write x, read x, read y, write x
    return {"sgemm_gflops": 2.0 * n ** 3 / min(times) / 1e9,
            "triad_gbs": 5 * x.nbytes / min(triads) / 1e9}


def kernel_work(definition: Definition, sizes: dict[str, int]) -> tuple[float, float]:
    """(floating-point operations, bytes of inputs and outputs) of one call: each
    statement's instances (the product of its index extents) times its arithmetic and
    builtin calls, plus one per instance for a reduction's combine."""
    flops = 0.0
    for s in definition.statements:
        instances = math.prod(max(0, r.extent.evaluate(sizes)) for r in s.domain)
        ops = _operations(s.rhs) + (1 if s.is_reduction else 0)
        flops += instances * ops
    moved = 0.0
    for t in definition.inputs + definition.outputs:
        moved += math.prod(evaluate_shape(t.shape, sizes)) * np.dtype(t.dtype.numpy).itemsize
    return flops, moved


def _operations(e) -> int:
    if isinstance(e, Binary):
        return (e.op in ARITHMETIC) + _operations(e.lhs) + _operations(e.rhs)
    if isinstance(e, Unary):
        return (e.op == "neg") + _operations(e.operand)
    if isinstance(e, Call):
        return 1 + sum(_operations(a) for a in e.args)
    if isinstance(e, Compare):
        return _operations(e.lhs) + _operations(e.rhs)
    if isinstance(e, Select):
        return _operations(e.cond) + _operations(e.then) + _operations(e.other)
    if isinstance(e, Cast):
        return _operations(e.operand)
    return 0  # a constant, an index, a size, a read


def roofline_fraction(seconds: float, flops: float, moved: float, limits: dict) -> float:
    """The kernel's rate over what the roofline allows at its arithmetic intensity."""
    if seconds <= 0:
        return math.nan
    if flops == 0:
        return moved / seconds / 1e9 / limits["triad_gbs"]
    attainable = min(limits["sgemm_gflops"], flops / moved * limits["triad_gbs"])
    return flops / seconds / 1e9 / attainable
