"""The search space of one kernel: every knob of `tc.Options` that a schedule of this
kernel on this backend can take, with the values that mean something for its extents.

A point is a `Candidate`: a sorted tuple of (knob, value) pairs, hashable, with None for
"automatic" (the heuristics decide that knob). The automatic schedule itself is the point
with every knob None. Knobs that cannot matter are left out rather than searched:
fusion where the scheduler sees one statement (a `+=!` is two: its initialisation
and its update, which fusion puts in one nest or two), a register tile without a
contraction, packing without a register tile, GPU knobs on the CPU and CPU knobs on a
GPU. Whether a point is legal
(a loop order that breaks a dependence) is the compiler's to say: such points are refused
when compiled, counted, and never timed.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, fields

import numpy as np

from tclang.options import FUSIONS, Options, format_knob
from tclang.lang.program import Definition

Candidate = tuple  # ((knob, value), ...), sorted by knob; None = automatic

MAX_ORDER_MEMBERS = 4  # beyond this, loop orders are sampled rather than listed
GPU_POINTS = (1, 2, 4, 8)  # points a thread takes along a mapped member (its register tile)
GPU_JAM = 16  # at most this many points a thread (backends/cuda/codegen.py's JAM)
GPU_REDUCTION_TILES = (8, 16, 32, 64)  # a reduction member's tile: its shared-memory slab


@dataclass(frozen=True)
class SearchSpace:
    """The knobs of one kernel and each one's choices (None first: automatic)."""

    members: tuple[str, ...]  # the main statement's indices, outermost first
    extents: tuple[int, ...]
    choices: tuple[tuple[str, tuple], ...]  # knob -> the values it may take
    parallel: int = 0  # members[:parallel] are the main statement's own indices
    gpu: bool = False

    @classmethod
    def of(cls, definition: Definition, sizes: dict[str, int], backend: str,
           vector_lanes: int = 8, vector_registers: int = 16) -> "SearchSpace":
        main = max(definition.statements,
                   key=lambda s: (len(s.all_indices), s.is_reduction))
        members = main.all_indices[:MAX_ORDER_MEMBERS + 2]
        extents = tuple(max(1, main.range_of(i).extent.evaluate(sizes)) for i in members)
        gpu = backend.startswith("cuda")
        choices: dict[str, tuple] = {}
        if scheduled_statements(definition) > 1:
            choices["fusion"] = (None,) + FUSIONS
        if members:
            choices["tile"] = (None, ())  # per-member sizes are drawn in `random`
            if 1 < len(members) <= MAX_ORDER_MEMBERS:
                choices["loop_order"] = (None,) + tuple(itertools.permutations(members))
        choices["unroll"] = (None, 1, 2, 4, 8, 16)
        if gpu:
            blocks = [(x, y) for x in (32, 64, 128, 256) for y in (1, 2, 4, 8) if x * y <= 1024]
            choices["block"] = (None,) + tuple(blocks)
            choices["shared_memory"] = (None, True, False)
            choices["private_memory"] = (None, True, False)
        else:
            choices["parallel"] = (None, False, True)
            choices["vectorize"] = (None, False)  # a guarded window ran faster without
            choices["vector_width"] = (None, 4, 8, 16)
            if _has_contraction(definition):
                # mr x nv vectors of accumulators and nv of the other operand must leave
                # two registers (polyhedral/register_tiles.py): larger tiles only spill
                tiles = tuple((mr, nv * vector_lanes) for mr in (1, 2, 3, 4, 6, 8)
                              for nv in (1, 2, 3, 4, 6)
                              if mr * nv + nv <= vector_registers - 2)
                choices["register_tile"] = (None, False) + tiles
                choices["pack"] = (None, True, False)
        parallel = min(len(main.indices), len(members))
        return cls(tuple(members), extents, tuple(choices.items()), parallel, gpu)

    # ---- points ----
    @property
    def knobs(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.choices)

    def automatic(self) -> Candidate:
        return tuple((name, None) for name in sorted(self.knobs))

    def tile_sizes(self, extent: int) -> tuple[int, ...]:
        """0 (untiled) and the powers of two from 4 up to the first that covers `extent`."""
        top = max(4, 1 << max(0, math.ceil(math.log2(max(extent, 1)))))
        return (0,) + tuple(1 << k for k in range(2, int(math.log2(min(top, 512))) + 1))

    def random_value(self, knob: str, rng: np.random.Generator):
        values = dict(self.choices)[knob]
        if knob == "tile" and rng.random() < 0.8:
            return tuple(int(rng.choice(self.tile_sizes(e))) for e in self.extents)
        return values[int(rng.integers(len(values)))]

    def random(self, rng: np.random.Generator, knobs_set: float = 0.5) -> Candidate:
        """Each knob set with probability `knobs_set`, else automatic. On a GPU, half the
        points that set a block get tiles made for it (`gpu_tiles`)."""
        point = {name: self.random_value(name, rng) if rng.random() < knobs_set else None
                 for name in self.knobs}
        if self.gpu and point.get("block") and "tile" in point and rng.random() < 0.5:
            point["tile"] = self.gpu_tiles(point["block"], rng)
        return tuple(sorted(point.items()))

    def mapped(self) -> list[int]:
        """Positions of the members a GPU launch maps to threads, x first: the innermost
        parallel ones (polyhedral/gpu.py maps at most three; the block knob sets two)."""
        return list(reversed(range(max(0, self.parallel - 2), self.parallel)))

    def gpu_tiles(self, block: tuple, rng: np.random.Generator) -> tuple[int, ...]:
        """Tile sizes that give each thread a register tile: on each mapped member the
        block's threads times 1 to 8 points (at most GPU_JAM points in all, so the CUDA
        code keeps them in registers), a reduction member a slab of 8 to 64 (what is
        copied to shared memory per step), other members untiled or their usual sizes."""
        sizes = [int(rng.choice(self.tile_sizes(e))) for e in self.extents]
        points = 1
        for k, position in enumerate(self.mapped()):
            threads = block[k] if k < len(block) else 1
            choices = [p for p in GPU_POINTS if points * p <= GPU_JAM and
                       threads * p <= max(threads, 2 * self.extents[position])]
            p = int(rng.choice(choices)) if choices else 1
            points *= p
            sizes[position] = threads * p
        for position in range(self.parallel, len(self.extents)):
            fits = [t for t in GPU_REDUCTION_TILES if t <= max(8, self.extents[position])]
            sizes[position] = int(rng.choice(fits))
        return tuple(sizes)

    def mutate(self, candidate: Candidate, rng: np.random.Generator) -> Candidate:
        """One or two knobs changed: a new value, automatic again, or one tile size."""
        point = dict(candidate)
        for _ in range(1 + int(rng.random() < 0.3)):
            knob = self.knobs[int(rng.integers(len(self.knobs)))]
            if knob == "tile" and point.get("tile") and rng.random() < 0.7:
                sizes = list(point["tile"])
                k = int(rng.integers(len(sizes)))
                sizes[k] = int(rng.choice(self.tile_sizes(self.extents[k])))
                point["tile"] = tuple(sizes)
            elif point.get(knob) is not None and rng.random() < 0.25:
                point[knob] = None
            else:
                point[knob] = self.random_value(knob, rng)
        return tuple(sorted(point.items()))

    def crossover(self, a: Candidate, b: Candidate, rng: np.random.Generator) -> Candidate:
        pb = dict(b)
        return tuple(sorted((k, v if rng.random() < 0.5 else pb[k]) for k, v in a))

    # ---- what a candidate means ----
    @staticmethod
    def options(candidate: Candidate) -> Options:
        """The Options of a point (TCScheduleError if its values are invalid)."""
        return Options(**{k: v for k, v in candidate if v is not None})

    def candidate(self, options: Options) -> Candidate:
        """The point of some Options (knobs outside this space are dropped)."""
        return tuple(sorted((k, getattr(options, k)) for k in self.knobs))


    def features(self, candidate: Candidate) -> np.ndarray:
        """Numbers for the cost model: for each knob, whether it is automatic and what its
        value says (log2 of sizes, positions of a loop order, one-hot choices)."""
        out: list[float] = []
        point = dict(candidate)
        for knob, values in self.choices:
            v = point.get(knob)
            out.append(1.0 if v is None else 0.0)
            if knob == "tile":
                sizes = v if v else (0,) * len(self.extents)
                sizes = tuple(sizes) + (0,) * (len(self.extents) - len(sizes))
                out += [math.log2(s) if s else 0.0 for s in sizes[:len(self.extents)]]
                out.append(1.0 if v == () else 0.0)
            elif knob == "loop_order":
                order = v or self.members
                out += [float(order.index(m)) if m in order else -1.0 for m in self.members]
            elif knob == "register_tile":
                out += [0.0, 0.0] if not v else [float(v[0]), float(v[1])]
                out.append(1.0 if v is False else 0.0)
            elif knob in ("unroll", "vector_width"):
                out.append(math.log2(v) if v else 0.0)
            elif knob == "block":
                out += [0.0, 0.0] if not v else [math.log2(v[0]), math.log2(v[1])]
                # the register tile each thread gets: log2 of tile / threads on x and y
                tile = point.get("tile")
                for k, position in enumerate(self.mapped()[:2]):
                    size = tile[position] if isinstance(tile, tuple) and \
                        position < len(tile) else 0
                    threads = v[k] if v and k < len(v) else 0
                    out.append(math.log2(size / threads) if size and threads and
                               size >= threads else 0.0)
                out += [0.0] * (2 - len(self.mapped()[:2]))
            else:  # fusion, parallel, pack, shared/private memory: one-hot
                out += [1.0 if v == choice else 0.0 for choice in values[1:]]
        return np.array(out, dtype=np.float64)

    def size(self) -> float:
        """How many points the space has (tile sizes per member counted)."""
        total = 1.0
        for knob, values in self.choices:
            if knob == "tile":
                total *= 2 + math.prod(len(self.tile_sizes(e)) for e in self.extents)
            else:
                total *= len(values)
        return total


def scheduled_statements(definition: Definition) -> int:
    """The statements isl's scheduler sees: a reduction with `!` is two, its
    initialisation and its update (polyhedral/scop.py), so fusion matters even for one
    `+=!` (a depthwise convolution ran 3.4x faster with its initialisation in a nest of
    its own, issue 33)."""
    return sum(2 if s.is_reduction and s.reset else 1 for s in definition.statements)


def _has_contraction(definition: Definition) -> bool:
    """A sum of products of tensor reads over a reduction index (matmul, conv, attention):
    what a register tile is for. softmax's sum of exp(X - max) is not one."""
    from tclang.lang.program import Binary, reads_of

    def products(e) -> bool:
        if not isinstance(e, Binary):
            return False
        if e.op == "mul" and reads_of(e.lhs) and reads_of(e.rhs):
            return True
        return e.op in ("add", "sub", "mul", "div") and (products(e.lhs) or products(e.rhs))

    return any(s.op == "+" and s.reduction_indices and products(s.rhs)
               for s in definition.statements)


def describe(candidate: Candidate) -> str:
    """`tile=32x32x64,unroll=4`: the knobs a point sets, in the knob grammar that
    `tclang compare --manual` and `--options` read (tclang/options.py)."""
    return ",".join(f"{knob}={format_knob(knob, value)}" for knob, value in candidate
                    if value is not None) or "automatic"


def candidate_of(options: Options) -> Candidate:
    """Any Options as a point, every knob it sets kept (a manual schedule need not lie in
    a search space)."""
    return tuple(sorted((f.name, getattr(options, f.name)) for f in fields(options)
                        if getattr(options, f.name) != f.default))
