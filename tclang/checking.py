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
  definition is rewritten to compute only sampled points (`Sampler`), points chosen at
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
from dataclasses import dataclass, replace

import numpy as np

from tclang.dtypes import DType
from tclang.lang import program as P

MODES = ("auto", "full", "sample", "none")
#: statement instances a second of the reference interpreter, a cautious figure (150,000
#: on a quiet machine, 30,000-50,000 on the loaded 2-core test machine): for estimates
#: only; a sample measures its own rate as it goes
INTERPRETER_RATE = 50_000.0
BAR_DELAY = 2.0  # seconds before a progress bar is shown


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
    if not np.issubdtype(dtype, np.floating):
        return 0.0
    return {2: 1e-2, 4: 1e-3}.get(dtype.itemsize, 1e-9)


def max_error(actual, expected) -> tuple[float, tuple | None]:
    """(largest relative error, its index): |a - e| / max(|e|, 1), NaN where only one
    side is NaN counting as infinite."""
    actual = np.asarray(actual, dtype=np.float64)
    expected = np.asarray(expected, dtype=np.float64)
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
                got_v = np.asarray(got)[index]
                want_v = np.asarray(want)[index]
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
    from tclang.arguments import bind_arguments
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
        if op is not None:
            expected = op.numpy([np.asarray(a, dtype=np.float64) for a in inputs])
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
    import tclang
    module = kernel.module
    reference = tclang.define(module.program.source, backend="reference",
                              options=options if options is not None else module.options)
    expected = _with_progress(lambda: reference[kernel.name](*inputs), estimate,
                              "checking every point on the reference interpreter", progress)
    expected = expected if isinstance(expected, tuple) else (expected,)
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
            bar.n = round(spent)
            bar.refresh()
    finally:
        bar.close()
    if "error" in box:
        raise box["error"]
    return box["value"]


def _sampled(kernel, definition, sizes, inputs, outputs, names, dtypes, budget, limit,
             progress, seed, estimate, mode) -> CheckResult:
    from tclang.errors import TCError
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
        found = sampler.run(kernel, inputs, rng, budget, limit, progress)
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


# ---- the sampled program -----------------------------------------------------------------

class Sampler:
    """A definition rewritten to compute only sampled output points.

    Dimensions of outputs and temporaries are grouped into classes: a statement that
    writes T(i, j) and reads U(i, k) links T's first dimension with U's, since the value
    of T at i needs U at i alone. A class can be sampled when every link is such a plain
    index, every statement writes its whole extent, and no tensor has two dimensions in
    it. Sampled classes become one new index `p` over sampled points (each class's
    coordinate of point p read from an index array, a gather); every other index keeps its
    range, so each sampled point is computed with its full reductions, and tensors with
    no sampled dimension are computed whole. The rewritten definition runs on the
    reference interpreter, a chunk of points per call, and the sampled points of the
    kernel's outputs are compared with its results.
    """

    def __init__(self, defn: P.Definition, sizes: dict):
        self.defn, self.sizes = defn, sizes
        self.shapes = {t.name: P.evaluate_shape(t.shape, sizes)
                       for t in defn.inputs + defn.outputs + defn.temporaries}
        self.classes = self._classes()
        outputs = {t.name for t in defn.outputs}
        # the sampled classes: those that reach an output, numbered
        self.sliced = sorted({c for (t, _), c in self.classes.items() if t in outputs})
        self.dims = {}  # tensor -> its sampled dims, in order
        for (t, d), c in sorted(self.classes.items()):
            if c in self.sliced:
                self.dims.setdefault(t, []).append(d)
        self.extent = {c: next(self.shapes[t][d] for (t, d), k in self.classes.items()
                               if k == c) for c in self.sliced}
        self._compiled = {}

    def _classes(self) -> dict:
        """(tensor, dim) -> class number, for the sampleable dimensions only."""
        parent: dict = {}

        def find(x):
            parent.setdefault(x, x)
            while parent[x] != x:
                parent[x] = parent[parent[x]]
                x = parent[x]
            return x

        bad = set()
        defn, sizes = self.defn, self.sizes
        for s in defn.statements:
            shape = self.shapes[s.target]
            position = {i: k for k, i in enumerate(s.indices)}
            for k, i in enumerate(s.indices):
                find((s.target, k))
                r = s.range_of(i)
                if s.condition is not None or r.lo.evaluate(sizes) != 0 or \
                        r.hi.evaluate(sizes) != shape[k]:
                    bad.add((s.target, k))
            for read in s.reads():
                if defn.tensor(read.tensor).role == "input":
                    continue
                for j, sub in enumerate(read.subscripts):
                    node = (read.tensor, j)
                    find(node)
                    if isinstance(sub, P.IndexValue) and sub.name in position:
                        parent[find(node)] = find((s.target, position[sub.name]))
                    else:
                        bad.add(node)
        groups: dict = {}
        for node in parent:
            groups.setdefault(find(node), []).append(node)
        out, number = {}, 0
        for members in sorted(groups.values()):
            tensors = [t for t, _ in members]
            extents = {self.shapes[t][d] for t, d in members}
            if any(m in bad for m in members) or len(set(tensors)) != len(tensors) or \
                    len(extents) != 1 or extents == {0}:
                continue
            for m in members:
                out[m] = number
            number += 1
        return out

    def sampled_outputs(self) -> list[str]:
        return [t.name for t in self.defn.outputs if t.name in self.dims]

    # -- cost --
    def cost(self, points: int) -> float:
        """Statement instances of the rewritten program for `points` points."""
        total = 0
        for s in self.defn.statements:
            sliced = {self._index_class(s, i) for i in s.indices} - {None}
            n = points if sliced else 1
            for r in s.domain:
                if self._index_class(s, r.name) is None:
                    n *= max(0, r.extent.evaluate(self.sizes))
            total += n
        return total

    def _index_class(self, s: P.Statement, index: str):
        if index not in s.indices:
            return None
        c = self.classes.get((s.target, s.indices.index(index)))
        return c if c in self.sliced else None

    # -- running --
    def run(self, kernel, inputs, rng, budget: float, limit: float, progress: bool):
        """({class: coordinates}, sampled outputs) or None when even one point is over
        `limit`. Chunks of points run until `budget` seconds are spent (at least one)."""
        per_point = self.cost(2) - self.cost(1)
        fixed = self.cost(1) - per_point
        if (fixed + per_point) / INTERPRETER_RATE > limit:
            return None
        total = math.prod(self.extent[c] for c in self.sliced)
        chunk = int(max(1, min(total, (0.25 * budget * INTERPRETER_RATE - fixed)
                               // max(per_point, 1))))
        chunk = min(chunk, 4096)
        planned = min(total, max(chunk, int(budget * INTERPRETER_RATE // max(per_point, 1))))
        points = self._points(rng, total, planned)
        compiled = None
        results: list = []
        done = 0
        from tqdm.auto import tqdm
        bar = tqdm(total=len(next(iter(points.values()))), unit="point", leave=False,
                   delay=BAR_DELAY, disable=not progress,
                   desc="checking sampled points on the reference interpreter")
        begun = time.perf_counter()
        try:
            count = len(next(iter(points.values())))
            while done < count:
                part = {c: v[done:done + chunk] for c, v in points.items()}
                n = len(next(iter(part.values())))
                if n < chunk:  # the last chunk: padded, so the same compile serves it
                    part = {c: np.concatenate([v, np.repeat(v[-1:], chunk - n)])
                            for c, v in part.items()}
                if compiled is None:
                    compiled = self._kernel(kernel, chunk)
                arrays = tuple(inputs) + tuple(part[c] for c in self.sliced)
                got = compiled(*arrays)
                got = got if isinstance(got, tuple) else (got,)
                results.append(tuple(self._trim(k, g, n) for k, g in enumerate(got)))
                done += n
                bar.update(n)
                if time.perf_counter() - begun > budget and done >= min(count, 2):
                    break
        finally:
            bar.close()
        points = {c: v[:done] for c, v in points.items()}
        expected = tuple(np.concatenate([r[k] for r in results],
                                        axis=self._p_axis(t.name))
                         if t.name in self.dims else results[0][k]
                         for k, t in enumerate(self.defn.outputs))
        return points, expected

    def _points(self, rng, total: int, count: int) -> dict:
        """`count` points (every point if count >= total): the first and the last point of
        every sampled class, then random ones, each class's coordinate drawn on its own
        (the classes of several outputs multiply past any integer a flat index fits)."""
        shape = [self.extent[c] for c in self.sliced]
        dtype = np.int32 if max(shape) < 2 ** 31 else np.int64
        if count >= total:
            coords = np.unravel_index(np.arange(total), shape)
        else:
            coords = [np.concatenate([[0, n - 1], rng.integers(0, n, size=max(0, count - 2))])
                      [:max(1, count)] for n in shape]
        return {c: np.ascontiguousarray(np.asarray(x).astype(dtype))
                for c, x in zip(self.sliced, coords)}

    def _p_axis(self, tensor: str) -> int:
        return self.dims[tensor][0]

    def _trim(self, k: int, got, n: int):
        name = self.defn.outputs[k].name
        got = np.asarray(got)
        if name not in self.dims:
            return got
        index = [slice(None)] * got.ndim
        index[self._p_axis(name)] = slice(0, n)
        return got[tuple(index)]

    def pick(self, k: int, output: np.ndarray, points: dict) -> np.ndarray:
        """The sampled points of the kernel's output k, shaped as the sampled program's."""
        name = self.defn.outputs[k].name
        if name not in self.dims:
            return output
        dims = self.dims[name]
        moved = np.moveaxis(output, dims, list(range(len(dims))))
        index = tuple(points[self.classes[(name, d)]] for d in dims)
        return np.moveaxis(moved[index], 0, dims[0])

    def point(self, k: int, index: tuple, points: dict) -> tuple:
        """The kernel's coordinates of a point of the sampled output k."""
        name = self.defn.outputs[k].name
        index = [int(i) for i in index]
        if name not in self.dims:
            return tuple(index)
        dims = self.dims[name]
        p = index[dims[0]]
        rest = [i for d, i in enumerate(index) if d != dims[0]]
        out, it = [], iter(rest)
        for d in range(len(self.shapes[name])):
            out.append(int(points[self.classes[(name, d)]][p]) if d in dims else next(it))
        return tuple(out)

    def _kernel(self, kernel, points: int):
        import tclang
        source = self.source(points)
        module = tclang.define(source, backend="reference")
        return module[module.names[0]]

    # -- the rewritten source --
    def source(self, points: int) -> str:
        """The sampled definition for `points` points per call, as source text."""
        defn = self.defn
        taken = {t.name for t in defn.inputs + defn.outputs + defn.temporaries}
        taken |= {i for s in defn.statements for i in s.all_indices}
        self.p = _fresh("p", taken)
        self.arrays = {c: _fresh(f"at{c}", taken) for c in self.sliced}
        index_type = "int32" if max(self.extent.values()) < 2 ** 31 else "int64"
        params = [self._declare(t, self.shapes[t.name]) for t in defn.inputs]
        params += [f"{index_type}({points}) {self.arrays[c]}" for c in self.sliced]
        outs = [self._declare(t, self._sampled_shape(t.name, points)) for t in defn.outputs]
        lines = [f"def {defn.name}_sampled({', '.join(params)}) -> ({', '.join(outs)}) {{"]
        for s in defn.statements:
            lines.append("    " + self._statement(s, points, index_type))
        return "\n".join(lines + ["}"])

    def _sampled_shape(self, tensor: str, points: int) -> list[int]:
        shape = list(self.shapes[tensor])
        dims = self.dims.get(tensor)
        if not dims:
            return shape
        return [points if d == dims[0] else n for d, n in enumerate(shape)
                if d == dims[0] or d not in dims]

    @staticmethod
    def _declare(t: P.Tensor, shape) -> str:
        dims = f"({', '.join(str(n) for n in shape)})" if shape else ""
        return f"{t.dtype.value}{dims} {t.name}"

    def _statement(self, s: P.Statement, points: int, index_type: str) -> str:
        from tclang.lang.program_text import expression_text
        sliced = {i: self._index_class(s, i) for i in s.indices}
        sliced = {i: c for i, c in sliced.items() if c is not None}
        target = []
        for k, i in enumerate(s.indices):
            if i not in sliced:
                target.append(i)
            elif k == self.dims[s.target][0]:
                target.append(self.p)
        gather = DType.INT32 if index_type == "int32" else DType.INT64
        rhs = self._rewrite(s.rhs, sliced, gather)
        op = "=" if s.op == "=" else f"{s.op}=" + ("!" if s.reset else "")
        head = f"{s.target}({', '.join(target)})" if target else s.target
        ranges = [f"{self.p} in 0:{points}"] if sliced else []
        for r in s.domain:
            if r.name not in sliced:
                ranges.append(f"{r.name} in {r.lo.evaluate(self.sizes)}:"
                              f"{r.hi.evaluate(self.sizes)}")
        where = f" where {', '.join(ranges)}" if ranges else ""
        return f"{head} {op} {expression_text(rhs)}{where}"

    def _rewrite(self, e, sliced: dict, gather: DType):
        """`e` with sampled indices read from their index arrays, sampled tensors read at
        `p`, sizes as numbers."""
        t = type(e)
        if t is P.IndexValue and e.name in sliced:
            array = self.arrays[sliced[e.name]]
            return P.Read(array, (P.IndexValue(self.p),), (None,), None, 0, gather,
                          self.defn.span)
        if t is P.SizeValue:
            return P.Const(self.sizes[e.name], e.dtype)
        if t is P.Read and e.tensor in self.dims and \
                self.defn.tensor(e.tensor).role != "input":
            dims = self.dims[e.tensor]
            subs = []
            for d, sub in enumerate(e.subscripts):
                if d == dims[0]:
                    subs.append(P.IndexValue(self.p))
                elif d not in dims:
                    subs.append(self._rewrite(sub, sliced, gather))
            return replace(e, subscripts=tuple(subs))
        if t is P.Const and isinstance(e.value, float) and not math.isfinite(e.value):
            from tclang.errors import TCError
            raise TCError("a non-finite constant has no source text")
        return P.with_children(e, tuple(self._rewrite(c, sliced, gather)
                                        for c in P.children(e)))


def _fresh(stem: str, taken: set) -> str:
    """`stem`, or `stem_1`, `stem_2`, ... : a name the definition does not use."""
    name, k = stem, 0
    while name in taken:
        k += 1
        name = f"{stem}_{k}"
    taken.add(name)
    return name
