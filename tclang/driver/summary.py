"""What `tclang explain` says first: the schedule's decisions on one screen.

Everything here is read from the data structures a compile produced, never from printed
text: the loop IR (polyhedral/loop_ir.py: which loops are parallel, vector or unrolled
into a register tile, which guards sit inside innermost loops, what is packed into
per-thread buffers, what became of each temporary), the tiling's band reports
(polyhedral/tiling.py: tile sizes and why) and the definition's work (tclang/tuning/
roofline.py: floating-point operations and bytes, against the machine's measured limits
when given). Loops are named by their variables as `--stage loops` prints them (c0, c1,
...), each with the indices it advances: `c0 (m by 64)` runs over m, 64 values a step.
"""

from __future__ import annotations

from dataclasses import dataclass

from polyhedral import loop_ir as L
from polyhedral.loop_format import format_index

UNTILED = 1 << 30  # polyhedral/tiling.py's size of a member kept whole


@dataclass(frozen=True)
class Loop:
    """One `For` of the loop IR, as the summary names it."""

    var: str
    indices: tuple[str, ...]  # the statement indices it advances
    over: str  # the same in words: "m by 64, n"; "copy" for packing; "" for neither
    trips: int | None  # iterations, where the bounds are constants
    parallel: bool
    vectorize: bool
    unrolled: bool

    def name(self) -> str:
        return f"{self.var} ({self.over})" if self.over else self.var


@dataclass(frozen=True)
class RegisterTile:
    """Nested unrolled loops around a statement: its values for `extents` points of
    `indices` stay in registers (the CPU micro-kernel)."""

    target: str
    indices: tuple[str, ...]
    extents: tuple[int, ...]
    lanes: str  # the index along the vector lanes ("" when no loop of it is vectorized)


@dataclass(frozen=True)
class Packed:
    """An operand copied into a per-thread buffer (a `Scratch` buffer filled by `Copy`)."""

    buffer: str
    tensor: str
    shape: tuple[int | None, ...]
    inside: str  # the loop around the copy, as Loop.name(), or "" at the top


@dataclass(frozen=True)
class Guard:
    """An `If` evaluated on every iteration of an innermost loop."""

    condition: str
    loop: str  # Loop.name() of the innermost loop around it
    statements: tuple[str, ...]  # the statements it guards, as "S0 (line 2)"


@dataclass(frozen=True)
class Summary:
    kernel: str
    strategy: str
    fallback: str | None
    options: str  # the knobs that were set ("automatic")
    bands: tuple | None  # BandReports; None: not known (a cache hit)
    loops: tuple[Loop, ...]  # every loop, in program order
    threads: tuple[Loop, ...]  # the outermost parallel loops (run on threads)
    vector: tuple[Loop, ...]  # vectorized loops over statements
    register_tiles: tuple[RegisterTile, ...]
    packed: tuple[Packed, ...]
    guards: tuple[Guard, ...]
    temporaries: tuple[L.TemporaryPlan, ...]
    launches: tuple[L.Launch, ...]
    flops: float
    moved: float
    limits: dict | None  # roofline.machine_limits(), or None (not measured)

    def text(self) -> str:
        """The summary as `tclang explain` prints it: one line (or a few) per decision."""
        rows = [("options", self.options),
                ("fusion", self.strategy + (f" (requested one replaced: {self.fallback})"
                                            if self.fallback else ""))]
        if self.launches and not self.bands:
            rows.append(("tiles", "the GPU mapping's: blocks and threads (GPU below)"))
        else:
            rows += [("tiles", t) for t in _counted(_band_lines(self.bands), lines=True)]
        rows += [("registers", _register_line(r)) for r in self.register_tiles] or \
            [("registers", "no register tile")]
        rows += [("packing", f"{p.tensor} -> {p.buffer}{_shape(p.shape)} per thread"
                  + (f", filled in {p.inside}" if p.inside else "")) for p in self.packed]
        if not self.launches:  # (a GPU's parallel loops are its blocks and threads)
            rows.append(("threads", _counted(loop.name() for loop in self.threads) +
                         " (outermost parallel loops)" if self.threads else "none (no "
                         "parallel loop: runs on one thread)"))
            rows.append(("vector", _counted(loop.name() for loop in self.vector) or "none"))
        rows += [("GPU", f"{g.name}: grid ({', '.join(map(format_index, g.grid))}), "
                  f"block {g.block}" + (f", buffers {', '.join(b.name for b in g.buffers)}"
                                        if g.buffers else "")) for g in self.launches]
        rows += [("guards", f"if ({g.condition}) in {g.loop}, around "
                  f"{', '.join(g.statements)}") for g in self.guards] or \
            [("guards", "none inside innermost loops")]
        rows += [("temporary", _temporary_line(t)) for t in self.temporaries]
        rows.append(("roofline", self.roofline()))
        return "\n".join(f"{name:<11} {text}" for name, text in rows)

    def roofline(self) -> str:
        """Work, intensity and (with limits) the bound and the least time it allows."""
        work = f"{_quantity(self.flops, 'FLOP')}, {_quantity(self.moved, 'B')} in and out"
        if self.moved <= 0:
            return work
        intensity = self.flops / self.moved
        work += f": {intensity:.2f} FLOP/B"
        if not self.limits:
            return work + " (machine not measured)"
        peak, bandwidth = self.limits["sgemm_gflops"] * 1e9, self.limits["triad_gbs"] * 1e9
        bound = "compute" if intensity >= peak / bandwidth else "memory"
        least = max(self.flops / peak, self.moved / bandwidth)
        return (f"{work}; this machine: sgemm {peak / 1e9:.0f} GFLOP/s, triad "
                f"{bandwidth / 1e9:.1f} GB/s -> {bound}-bound, at best "
                f"{least * 1e3:.3g} ms")


def summarize(kernel: L.Kernel, *, strategy: str, fallback: str | None, options: str,
              bands: tuple | None, flops: float, moved: float,
              limits: dict | None = None) -> Summary:
    """The decisions of one scheduled kernel (see the module doc)."""
    walk = _Walk(kernel)
    walk.visit(kernel.body, (), None)
    return Summary(kernel.name, strategy, fallback, options, bands, tuple(walk.loops),
                   tuple(walk.threads), tuple(walk.vector), tuple(walk.tiles),
                   tuple(walk.packed), tuple(walk.guards), kernel.temporaries,
                   tuple(walk.launches), flops, moved, limits)


class _Walk:
    """One pass over the loop tree, parents first, collecting every decision."""

    def __init__(self, kernel: L.Kernel):
        self.kernel = kernel
        self.contracted = {p.buffer.name for p in kernel.temporaries if p.contracted}
        self.loops: list[Loop] = []
        self.threads: list[Loop] = []
        self.vector: list[Loop] = []
        self.tiles: list[RegisterTile] = []
        self.packed: list[Packed] = []
        self.guards: list[Guard] = []
        self.launches: list[L.Launch] = []

    def visit(self, node: L.Node, around: tuple[tuple[L.For, Loop], ...],
              launch: L.Launch | None) -> None:
        match node:
            case L.For(body=body):
                loop = self._loop(node)
                self.loops.append(loop)
                runs = _has(body, L.Run)
                if node.parallel and launch is None and runs and \
                        not any(outer.parallel for _, outer in around):
                    self.threads.append(loop)
                lanes_below = any(isinstance(n, L.For) and n.unrolled and n.vectorize
                                  for n in L.walk_nodes(body))  # a register tile's lanes
                if node.vectorize and runs and launch is None and not node.unrolled and \
                        not lanes_below:  # (those are in the register tile's line)
                    self.vector.append(loop)
                if node.unrolled and not (around and around[-1][0].unrolled):
                    self._register_tile(node)
                self.visit(body, around + ((node, loop),), launch)
            case L.If(cond=cond, then=then, other=other):
                if around and not _has(then, L.For) and \
                        (other is None or not _has(other, L.For)):
                    self._guard(cond, node, around[-1][1])
                self.visit(then, around, launch)
                if other is not None:
                    self.visit(other, around, launch)
            case L.Block(body=items):
                for item in items:
                    self.visit(item, around, launch)
            case L.Scratch(buffers=buffers, body=body):
                inside = around[-1][1].name() if around else ""
                for b in buffers:
                    if b.name not in self.contracted:
                        self.packed.append(Packed(b.name, _copied_from(body, b.name),
                                                  _extents(b.shape), inside))
                self.visit(body, around, launch)
            case L.Launch(body=body):
                self.launches.append(node)
                self.visit(body, around, node)

    def _loop(self, node: L.For) -> Loop:
        steps: dict[str, set[int | None]] = {}
        for run in _runs(node.body):
            statement = self.kernel.statement(run.statement)
            for index, value in zip(statement.indices, run.indices):
                if node.var in L.variables(value):
                    steps.setdefault(index, set()).add(_coefficient(value, node.var))
        over = ", ".join(_advance(index, found) for index, found in steps.items())
        if not over and not _has(node.body, L.Run):
            over = "copy" if _has(node.body, L.Copy) else ""
        return Loop(node.var, tuple(steps), over, _trips(node), node.parallel,
                    node.vectorize, node.unrolled)

    def _register_tile(self, outer: L.For) -> None:
        chain, node = [outer], outer.body
        while True:  # the unrolled loops nested in this one, outermost first
            inner = next((n for n in L.walk_nodes(node)
                          if isinstance(n, L.For) and n.unrolled), None)
            if inner is None:
                break
            chain.append(inner)
            node = inner.body
        runs = list(_runs(outer.body))
        if not runs:
            return
        statement = self.kernel.statement(runs[-1].statement)
        loops = [self._loop(f) for f in chain]
        indices = tuple("/".join(loop.indices) for loop in loops)
        lanes = next((index for f, index in zip(chain, indices) if f.vectorize), "")
        tile = RegisterTile(statement.target, indices,
                            tuple(loop.trips or 0 for loop in loops), lanes)
        if tile not in self.tiles:  # the peeled first step and the loop repeat it
            self.tiles.append(tile)

    def _guard(self, cond: L.IExpr, node: L.If, loop: Loop) -> None:
        statements = tuple(dict.fromkeys(
            [_statement_name(self.kernel.statement(r.statement)) for r in _runs(node)] +
            [f"the copy of {n.tensor} {'into' if n.direction == 'in' else 'from'} "
             f"{n.buffer}" for n in L.walk_nodes(node) if isinstance(n, L.Copy)]))
        guard = Guard(format_index(cond), loop.name(), statements)
        if guard not in self.guards:
            self.guards.append(guard)


def _counted(items, lines: bool = False):
    """Equal items once, each with how many there were ("c1 (d) x4": one loop variable
    in four nests), joined by commas, or (lines) as a list."""
    counts: dict = {}
    for item in items:
        counts[item] = counts.get(item, 0) + 1
    shown = [item if n == 1 else f"{item} (x{n})" for item, n in counts.items()]
    return shown if lines else ", ".join(shown)


def _statement_name(s: L.StatementDef) -> str:
    what = f"the reset of {s.target}" if s.kind == "init" else s.id
    return f"{what} (line {s.line})" if s.line else what


def _runs(node: L.Node):
    return (n for n in L.walk_nodes(node) if isinstance(n, L.Run))


def _has(node: L.Node, kind) -> bool:
    return any(isinstance(n, kind) for n in L.walk_nodes(node))


def _copied_from(node: L.Node, buffer: str) -> str:
    return next((n.tensor for n in L.walk_nodes(node)
                 if isinstance(n, L.Copy) and n.buffer == buffer), "?")


def _extents(shape) -> tuple[int | None, ...]:
    return tuple(d.value if isinstance(d, L.Int) else None for d in shape)


def _trips(node: L.For) -> int | None:
    if isinstance(node.lo, L.Int) and isinstance(node.hi, L.Int):
        return max(0, -(-(node.hi.value - node.lo.value) // node.step))
    return None


def _coefficient(e: L.IExpr, var: str) -> int | None:
    """How much `e` grows when `var` grows by one; None where that is not a constant."""
    match e:
        case L.Var(name=name):
            return 1 if name == var else 0
        case L.Int():
            return 0
        case L.Op(op="add" | "sub" as op, args=(a, b)):
            ca, cb = _coefficient(a, var), _coefficient(b, var)
            if ca is None or cb is None:
                return None
            return ca + cb if op == "add" else ca - cb
        case L.Op(op="neg", args=(a,)):
            ca = _coefficient(a, var)
            return None if ca is None else -ca
        case L.Op(op="mul", args=(L.Int(value=k), b)) | L.Op(op="mul", args=(b, L.Int(value=k))):
            cb = _coefficient(b, var)
            return None if cb is None else k * cb
    return 0 if var not in L.variables(e) else None


def _advance(index: str, steps: set[int | None]) -> str:
    if steps == {1}:
        return index
    if len(steps) == 1 and None not in steps:
        return f"{index} by {next(iter(steps))}"
    return f"{index} (not affine)" if None in steps else f"{index} by {sorted(steps)}"


def _band_lines(bands) -> list[str]:
    if bands is None:
        return ["not known (loaded from the compile cache: compile with fresh=True)"]
    if not bands:
        return ["no loop band (nothing to tile)"]
    lines = []
    for band in bands:
        names = band.indices or tuple(f"#{k}" for k in range(band.members))
        if band.tile is None:
            lines.append(f"{', '.join(names)}: not tiled: {band.reason}")
        else:
            extents = band.extents or (None,) * len(band.tile)
            sizes = " x ".join("whole" if s >= UNTILED or (e is not None and s >= e)
                               else str(s) for s, e in zip(band.tile, extents))
            lines.append(f"{' x '.join(names)}: {sizes}: {band.reason}")
    return lines


def _register_line(tile: RegisterTile) -> str:
    shape = " x ".join(map(str, tile.extents))
    lanes = f", vector lanes along {tile.lanes}" if tile.lanes else ""
    return f"{tile.target}: {shape} ({' x '.join(tile.indices)}) kept in registers{lanes}"


def _temporary_line(plan: L.TemporaryPlan) -> str:
    if plan.contracted:
        return (f"{plan.buffer.name}: contracted to {plan.note}, one per iteration of "
                f"{plan.loop} (per thread)")
    return f"{plan.buffer.name}: kept: {plan.note}"


def _shape(shape) -> str:
    return "".join(f"[{'?' if d is None else d}]" for d in shape)


def _quantity(value: float, unit: str) -> str:
    for scale, prefix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if value >= scale:
            return f"{value / scale:.3g} {prefix}{unit}"
    return f"{value:.0f} {unit}"
