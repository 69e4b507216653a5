"""A definition rewritten to compute only sampled output points, for checks with a bound.

The reference interpreter runs a definition statement instance by statement instance, far
too slowly for a big problem (tclang.tools.checking). This rewrite makes it compute a random
sample of output points instead, each with its full reductions, so that a check costs
about what the caller allows, whatever the problem's size: `Sampler(definition,
sizes).source(points)` is the rewritten definition, `run` runs it in chunks of points on
the reference interpreter, `pick` takes the same points out of the kernel's outputs.
"""

from __future__ import annotations

import math
import time
from dataclasses import replace

import numpy as np

from tclang.bfloat16 import is_bfloat16, to_numpy_float32
from tclang.dtypes import DType
from tclang.lang import program as P
from tclang.runtime.arguments import call_numpy

#: statement instances a second of the reference interpreter, a cautious figure (150,000
#: on a quiet machine, 30,000-50,000 on the loaded 2-core test machine): for estimates
#: only; a sample measures its own rate as it goes
INTERPRETER_RATE = 50_000.0
BAR_DELAY = 2.0  # seconds before a progress bar is shown


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
    def run(self, inputs, rng, budget: float, limit: float, progress: bool):
        """({class: coordinates}, sampled outputs) or None when even one point is over
        `limit`. Chunks of points run until `budget` seconds are spent (at least one)."""
        rate = INTERPRETER_RATE
        per_point = self.cost(2) - self.cost(1)
        fixed = self.cost(1) - per_point  # tensors with no sampled dimension, per call
        if (fixed + per_point) / rate > limit:
            return None
        total = math.prod(self.extent[c] for c in self.sliced)
        # a chunk (one call, one compile for all) takes about a quarter of the budget
        chunk = int(max(1, min(total, 4096, (0.25 * budget * rate - fixed)
                               // max(per_point, 1))))
        planned = min(total, max(chunk, int(budget * rate // max(per_point, 1))))
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
                    compiled = self._kernel(chunk)
                arrays = tuple(inputs) + tuple(part[c] for c in self.sliced)
                got = call_numpy(compiled, arrays)
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
        if is_bfloat16(got.dtype):
            got = to_numpy_float32(got)
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

    def _kernel(self, points: int):
        """The sampled definition on the reference backend; a TCError if it cannot be
        written or is refused (the caller then checks every point, or says why not)."""
        from tclang.errors import TCError
        from tclang.runtime.kernels import define_module
        try:
            module = define_module(self.source(points), "reference")
        except TCError:
            raise
        except Exception as err:  # noqa: BLE001 - a rewrite tclang cannot make: say so
            raise TCError(f"the sampled definition could not be made: {err!r}") from err
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
