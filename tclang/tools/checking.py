"""Checking a kernel's results, with a bound on the wait and nothing silent about it.

`tclang run` used to run the whole definition on the reference interpreter (a Python
loop, ~150,000 statement instances a second on a quiet machine): 33 s for a 4.8 M-instance
contraction, and nothing printed for 11 minutes at 1.1 G multiply-adds that the compiled
kernel ran in 30-70 ms. `check(...)` instead picks what costs little and still catches a
wrong result:

- *NumPy*, where tclang.peers recognises the definition as an einsum or a library operator
  (computed in float64). If NumPy disagrees, the recognition may be the one at fault (a
  formula that only looks like a layer norm), so the interpreter decides, and the report
  says both.
- *The interpreter on a sample of output points*, with their full reductions: the
  definition is rewritten to compute only sampled points (tclang.tools.sampling), points chosen at
  random (plus the first and last, where tiling bugs live), as many as fit in `budget`
  seconds. A wrong row of a matmul is found with high probability; a single wrong point
  only with `full`.
- *The interpreter on everything* (`full`), with a progress bar.

Modes (`--check`): "auto" (NumPy where it can; else the whole interpreter if that takes
under `budget` seconds; else a sample), "full" (NumPy, or every point on the interpreter,
however long), "sample" (the interpreter on a sample, even where NumPy could check
everything), "none". Every wait past ~2 s shows a progress bar, and a check that would
take longer than `limit` seconds is not started in "auto" and "sample": the result says
so and how to force it.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass

import numpy as np

from tclang.bfloat16 import is_bfloat16, to_numpy_float32
from tclang.lang import program as P
from tclang.runtime.arguments import call_numpy
from tclang.tools.sampling import BAR_DELAY, INTERPRETER_RATE

MODES = ("auto", "full", "sample", "none")


@dataclass
class CheckResult:
    ok: bool | None  # None: not checked
    against: str  # what the outputs were checked against, in words
    error: float = 0.0  # the largest relative error found
    where: str = ""  # the worst point, when one differs
    seconds: float = 0.0
    note: str = ""  # what else the reader should know (NumPy disagreed, ...)

    def text(self) -> str:
        if self.ok is None:
            return f"not checked: {self.against}"
        verdict = "matches" if self.ok else "DIFFERS FROM"
        line = f"{verdict} {self.against} (max relative error {self.error:.2e}" + \
            (f"; worst at {self.where}" if self.where and not self.ok else "") + ")"
        return line + (f"; {self.note}" if self.note else "")


def tolerance(dtype) -> float:
    """The largest relative error (relative to max(|expected|, 1)) that is rounding: a
    schedule may reorder a reduction, and the CPU backend fuses multiply-adds."""
    dtype = np.dtype(dtype)
    if is_bfloat16(dtype):
        return 2e-2  # 8 significant bits
    if not np.issubdtype(dtype, np.floating):
        return 0.0
    return {2: 1e-2, 4: 1e-3}.get(dtype.itemsize, 1e-9)


def float64(a) -> np.ndarray:
    """An array's values in float64 (bfloat16 ones through float32)."""
    a = np.asarray(a)
    return to_numpy_float32(a).astype(np.float64) if is_bfloat16(a.dtype) else \
        np.asarray(a, dtype=np.float64)


def max_error(actual, expected) -> tuple[float, tuple | None]:
    """(largest relative error, its index): |a - e| / max(|e|, 1), NaN where only one
    side is NaN counting as infinite."""
    actual, expected = float64(actual), float64(expected)
    if actual.shape != expected.shape:
        return math.inf, None
    if actual.size == 0:
        return 0.0, None
    both = (np.isnan(actual) & np.isnan(expected)) | (actual == expected)
    with np.errstate(invalid="ignore", over="ignore"):
        diff = np.abs(actual - expected) / np.maximum(np.abs(expected), 1.0)
    diff = np.where(both, 0.0, np.where(np.isnan(diff), np.inf, diff))
    k = int(np.argmax(diff))
    return float(diff.flat[k]), np.unravel_index(k, diff.shape)


def _compare(names, outputs, expected, dtypes, positions=None):
    """(ok, worst error, where) over every output; `positions(k, index)` names a point."""
    worst, where, ok = 0.0, "", True
    for k, (name, got, want, dtype) in enumerate(zip(names, outputs, expected, dtypes)):
        error, index = max_error(got, want)
        if error > tolerance(dtype):
            ok = False
        if error >= worst:
            worst = error
            if index is not None:
                point = positions(k, index) if positions else tuple(int(i) for i in index)
                got_v = float64(got)[index]
                want_v = float64(want)[index]
                where = f"{name}{tuple(point) if len(point) != 1 else f'({point[0]})'}: " \
                        f"{got_v:.6g} where {want_v:.6g} was expected"
            elif np.shape(got) != np.shape(want):
                where = f"{name}: shape {np.shape(got)}, expected {np.shape(want)}"
    return ok, worst, where


def check(kernel, inputs: tuple, outputs: tuple, mode: str = "auto", budget: float = 2.0,
          limit: float = 30.0, progress: bool = True, seed: int = 0,
          full_options=None) -> CheckResult:
    """Check `outputs` (what `kernel` returned for `inputs`) as `mode` says (module
    docstring). `full_options`: the options the whole-program interpreter runs with
    (default the kernel's: it then runs the same schedule)."""
    from tclang.runtime.arguments import bind_arguments
    from tclang.errors import TCArgumentError
    if mode not in MODES:
        raise TCArgumentError(f"--check is one of {', '.join(MODES)}, not {mode!r}")
    start = time.perf_counter()
    if mode == "none":
        return CheckResult(None, "--check=none")
    definition = kernel.definition
    sizes = dict(bind_arguments(definition, inputs).sizes)
    names = [t.name for t in definition.outputs]
    dtypes = [t.dtype.numpy for t in definition.outputs]
    note = ""
    if mode in ("auto", "full"):
        from tclang.peers import recognise
        op = recognise(definition, sizes)
        try:
            expected = op.numpy([float64(a) for a in inputs]) \
                if op is not None else None
        except (MemoryError, ValueError) as err:  # too big for NumPy's way: the interpreter
            expected, note = None, f"NumPy's {op.name} failed ({err}), so the reference " \
                                   f"interpreter decided"
        if expected is not None:
            ok, error, where = _compare(names, outputs, (expected,), dtypes)
            what = f"NumPy ({op.name}: {op.numpy_text}, in float64)"
            if ok:
                return CheckResult(True, what, error, where, time.perf_counter() - start)
            note = f"NumPy's {op.name} disagrees by {error:.2e} at {where}, so the " \
                   f"reference interpreter decided"
    instances = instance_count(definition, sizes)
    estimate = instances / INTERPRETER_RATE
    if mode == "full" or (mode == "auto" and estimate <= budget):
        result = _full(kernel, inputs, outputs, names, dtypes, estimate, progress,
                       full_options)
    else:
        result = _sampled(kernel, definition, sizes, inputs, outputs, names, dtypes, budget,
                          limit, progress, seed, estimate, mode)
    result.seconds = time.perf_counter() - start
    if note:
        result.note = note + (f"; {result.note}" if result.note else "")
    return result


def instance_count(definition: P.Definition, sizes: dict) -> int:
    """Statement instances of one call: what the reference interpreter runs one by one."""
    return sum(math.prod(max(0, r.extent.evaluate(sizes)) for r in s.domain)
               for s in definition.statements)


def _full(kernel, inputs, outputs, names, dtypes, estimate, progress, options):
    from tclang.runtime.kernels import define_module
    module = kernel.module
    reference = define_module(module.program.source, "reference",
                              options if options is not None else module.options)
    expected = _with_progress(lambda: call_numpy(reference[kernel.name], inputs), estimate,
                              "checking every point on the reference interpreter", progress)
    ok, error, where = _compare(names, outputs, expected, dtypes)
    return CheckResult(ok, "the reference interpreter (every point)", error, where)


def _with_progress(work, estimate: float, what: str, shown: bool):
    """Run `work()` in a thread, showing a bar of the seconds spent against `estimate`
    once ~2 s have passed (the interpreter cannot report its own progress)."""
    if not shown:
        return work()
    from tqdm.auto import tqdm
    box: dict = {}

    def target():
        try:
            box["value"] = work()
        except BaseException as err:  # noqa: BLE001 - raised again in the caller
            box["error"] = err

    thread = threading.Thread(target=target, daemon=True, name="tclang-check")
    thread.start()
    total = max(estimate, 1.0)
    bar = tqdm(total=round(total), desc=what + " (estimated seconds)", unit="s",
               delay=BAR_DELAY, leave=False,
               bar_format="{desc}: {bar} {n:.0f}/{total:.0f} s")
    begun = time.perf_counter()
    try:
        while thread.is_alive():
            thread.join(0.5)
            spent = time.perf_counter() - begun
            if spent > bar.total:
                bar.total = round(spent * 1.5)
            bar.update(round(spent) - bar.n)  # shown once BAR_DELAY has passed
    finally:
        bar.close()
    if "error" in box:
        raise box["error"]
    return box["value"]


def _sampled(kernel, definition, sizes, inputs, outputs, names, dtypes, budget, limit,
             progress, seed, estimate, mode) -> CheckResult:
    from tclang.errors import TCError
    from tclang.tools.sampling import Sampler
    sampler = Sampler(definition, sizes)
    if not sampler.sliced:
        if estimate <= limit or mode == "full":
            result = _full(kernel, inputs, outputs, names, dtypes, estimate, progress, None)
            result.note = "no output dimension could be sampled"
            return result
        return CheckResult(None, f"no output dimension of {definition.name} can be sampled, "
                           f"and the reference interpreter would need about "
                           f"{_duration(estimate)} for the whole ({instances_text(estimate)}); "
                           f"--check=full waits for it, --check=none skips it")
    rng = np.random.default_rng(seed)
    try:
        found = sampler.run(inputs, rng, budget, limit, progress)
    except TCError as err:  # the rewritten definition was refused: check it all instead
        if estimate > limit:
            return CheckResult(None, f"the sampled check could not be built ({err.args[0]}), "
                               f"and the whole program would take the interpreter about "
                               f"{_duration(estimate)}; --check=full waits for it")
        result = _full(kernel, inputs, outputs, names, dtypes, estimate, progress, None)
        result.note = "the sampled check could not be built, so every point was checked"
        return result
    if found is None:
        cost = sampler.cost(1) / INTERPRETER_RATE
        return CheckResult(None, f"even one sampled point would take the reference "
                           f"interpreter about {_duration(cost)}; --check=full waits "
                           f"for the whole program (about {_duration(estimate)})")
    points, expected = found
    picked = [sampler.pick(k, np.asarray(o), points) for k, o in enumerate(outputs)]
    ok, error, where = _compare(names, picked, expected, dtypes,
                                lambda k, index: sampler.point(k, index, points))
    count = len(points[next(iter(points))]) if points else 0
    total = math.prod(P.evaluate_shape(definition.outputs[0].shape, sizes)) or 1
    what = (f"the reference interpreter on {count} sampled points of "
            f"{', '.join(sampler.sampled_outputs())} ({count / total:.2%} of "
            f"{definition.outputs[0].name}; each with its full reduction)")
    return CheckResult(ok, what, error, where)


def instances_text(seconds: float) -> str:
    return f"{seconds * INTERPRETER_RATE:.3g} statement instances"


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
