"""`tclang.Options`: the knobs of a manual schedule.

Every field left at None stays automatic: the automatic schedule is simply what the
heuristics pick for the unset knobs. Values are validated here, when the Options are made;
whether they are legal for a given program (a loop order that breaks a dependence) is
checked when that program is scheduled, with an error naming the dependence.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

from tclang.boundary import api_boundary
from tclang.errors import TCScheduleError

FUSIONS = ("max", "min", "preserve_parallel")
MAX_VECTOR_WIDTH = 64
"""The widest vector_width the CPU backend takes: LLVM's loop vectorizer forces only
power-of-two widths up to 64 (VectorizerParams::MaxVectorWidth) and silently ignores any
other request; register tiles are checked against the target when scheduled
(polyhedral/register_tiles.check_shape)."""


@dataclass(frozen=True)
class Options:
    """Manual scheduling knobs; None means "let tclang decide".

    fusion: "max" (fuse whenever dependences allow, even at the cost of parallelism),
        "min" (each statement its own loop nest), or "preserve_parallel" (fuse only where
        no parallel loop is lost; the default).
    tile: tile sizes for the members of each outermost permutable band, outermost first;
        an int applies to every member; 0 leaves a member untiled; () turns tiling off.
    unroll: unroll innermost loops of at most this many iterations (1 disables).
    specialize: "auto" (the default): compile for the concrete sizes of the first call;
        once a size has taken a second value, compile one variant generic in the sizes
        that changed (the others stay constants) and run every later value on it, while a
        value that has its own specialized kernel keeps it (docs/schedules.md, Dynamic
        shapes; CPU and reference backends: the GPU backends specialize). True: compile for
        the concrete sizes of each call; False: once for all sizes (shape-generic code).
    loop_order: a permutation of the members of the outermost band of each loop nest, as
        positions (2, 0, 1) or as index names ("k", "m", "n").
    parallel: run the outermost parallel loop on several threads (CPU) or not; None lets
        a cost model decide.
    vectorize: mark innermost stride-1 loops for SIMD (CPU).
    vector_width: SIMD lanes to ask for (CPU), a power of two up to 64; None: the
        target's natural width.
    block, grid: GPU threads per block and blocks per grid, (x, y, z) with x innermost.
    shared_memory, private_memory: promote reused tiles to shared memory / registers (GPU).
    reorder_reductions: reductions are associative, so by default their iterations may be
        reordered, tiled, interchanged and (for floats) vectorized, which changes rounding;
        CPU code may also fuse a multiply-add and multiply by a loop-invariant divisor's
        reciprocal. False runs every reduction in program order and rounds every
        operation: bitwise reproducible, slower.
    register_tile: keep an mr x nr block of a contraction's result in vector registers
        through its reduction loops (CPU micro-kernel): None lets a model of the machine
        choose (mr, nr), a pair (mr, nr) sets them, False turns it off. A pair whose
        accumulators and operand vectors do not fit the CPU's vector registers is refused
        when a contraction is scheduled with it.
    pack: copy the operand a register tile reads along its lanes into a contiguous
        per-thread buffer, one kc x nr sliver at a time (CPU, BLIS's packing): None packs
        where the sliver is reused by enough rows (and, with AVX-512, an operand the lanes
        read with a stride, lanes-first), True wherever it can, False never.
    check_bounds: check every array access of the generated code and raise
        `TCIndexError` at the first one outside its array (as TCLANG_CHECK_BOUNDS=1 does);
        for debugging and for the differential tester, slower.
    passes: run the passes on the checked program (dead code, constant folding, exact
        algebraic simplification, common subexpressions, hoisting; docs/passes.md) before
        scheduling: None or True runs them, False compiles the definition as written.
    compile_budget: seconds of wall-clock time for a whole compile (tclang/budget.py);
        None: TCLANG_COMPILE_BUDGET, else 60. Past it the compile takes the cheapest legal
        schedule (degraded: not stored, compiled again later) or, before any schedule
        exists, fails with a TCCompileError naming the stage. Not part of the cache key:
        it changes how long a compile may take, never what a full compile produces.
    """

    fusion: str | None = None
    tile: int | tuple[int, ...] | None = None
    unroll: int | None = None
    specialize: bool | str = "auto"
    loop_order: tuple[int | str, ...] | None = None
    parallel: bool | None = None
    vectorize: bool | None = None
    vector_width: int | None = None
    block: tuple[int, ...] | None = None
    grid: tuple[int, ...] | None = None
    shared_memory: bool | None = None
    private_memory: bool | None = None
    reorder_reductions: bool | None = None
    check_bounds: bool | None = None
    register_tile: bool | tuple[int, int] | None = None
    pack: bool | None = None
    passes: bool | None = None
    compile_budget: float | None = None

    def __post_init__(self) -> None:
        if self.fusion is not None and self.fusion not in FUSIONS:
            raise TCScheduleError(f"fusion must be one of {', '.join(FUSIONS)}, "
                                  f"not {self.fusion!r}")
        if self.tile is not None:  # kept as given: an int and a 1-tuple tile differently
            _check_sizes("tile", (self.tile,) if _is_int(self.tile) else self.tile,
                         allow_zero=True)
        for name in ("unroll", "vector_width"):
            value = getattr(self, name)
            if value is not None and (not _is_int(value) or value < 1):
                raise TCScheduleError(f"{name} must be a positive integer, not {value!r}")
        if self.vector_width is not None and (self.vector_width > MAX_VECTOR_WIDTH or
                                              self.vector_width & (self.vector_width - 1)):
            raise TCScheduleError(f"vector_width must be a power of two up to "
                                  f"{MAX_VECTOR_WIDTH}, not {self.vector_width}: LLVM's loop "
                                  "vectorizer ignores any other width",
                                  hint="for example vector_width=8 (8 float32 lanes fill a "
                                       "256-bit AVX2 register)")
        for name in ("block", "grid"):
            value = getattr(self, name)
            if value is not None:
                _check_sizes(name, value, allow_zero=False)
                if not 1 <= len(value) <= 3:
                    raise TCScheduleError(f"{name} takes 1 to 3 sizes (x, y, z), not {value!r}")
        if self.loop_order is not None:
            order = tuple(self.loop_order)
            if len(set(order)) != len(order) or not all(isinstance(x, (int, str)) for x in order):
                raise TCScheduleError(f"loop_order must list distinct positions or index "
                                      f"names, not {self.loop_order!r}")
            object.__setattr__(self, "loop_order", order)
        if isinstance(self.register_tile, list):
            object.__setattr__(self, "register_tile", tuple(self.register_tile))
        if self.register_tile is not None and self.register_tile is not False:
            value = self.register_tile
            if value is True or not isinstance(value, tuple) or len(value) != 2 or \
                    not all(_is_int(x) and x >= 1 for x in value):
                raise TCScheduleError(f"register_tile must be None, False or a pair of "
                                      f"positive sizes (mr, nr), not {value!r}",
                                      hint="for example register_tile=(4, 16)")
        if self.passes not in (None, True, False):
            raise TCScheduleError(f"passes must be None, True or False, not {self.passes!r}")
        if self.pack not in (None, True, False):
            raise TCScheduleError(f"pack must be None, True or False, not {self.pack!r}")
        if self.compile_budget is not None and (
                isinstance(self.compile_budget, bool)
                or not isinstance(self.compile_budget, (int, float))
                or not 0 < self.compile_budget < float("inf")):
            raise TCScheduleError(f"compile_budget must be a positive number of seconds, "
                                  f"not {self.compile_budget!r}")
        if not isinstance(self.specialize, bool) and self.specialize != "auto":
            raise TCScheduleError(f"specialize must be True, False or \"auto\", not "
                                  f"{self.specialize!r}")

    def tile_sizes(self, members: int) -> tuple[int, ...] | None:
        """The tile size of each of `members` band members, or None for the heuristic."""
        if self.tile is None:
            return None
        if _is_int(self.tile):
            return (self.tile,) * members
        return tuple(self.tile[:members]) + (0,) * max(0, members - len(self.tile))

    def key(self) -> tuple:
        """A plain tuple of every knob that decides the code, for cache keys (not the
        compile budget: a compile that ran out of it is never stored)."""
        return tuple((f.name, getattr(self, f.name)) for f in fields(self)
                     if f.name != "compile_budget")

    def to_dict(self) -> dict:
        """The knobs that differ from automatic, JSON-ready (tuples as lists): what the
        tuning database stores."""
        out = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value != f.default:
                out[f.name] = list(value) if isinstance(value, tuple) else value
        return out

    @classmethod
    def from_dict(cls, data: dict) -> "Options":
        """The inverse of to_dict; validated like any Options (TCScheduleError if not)."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise TCScheduleError(f"unknown option(s) {', '.join(unknown)}")
        return cls(**{name: tuple(v) if isinstance(v, list) else v
                      for name, v in data.items()})

    def describe(self) -> str:
        """The knobs that were set, as a knob string ("automatic" when none was)."""
        return format_knobs(self) or "automatic"

    @classmethod
    @api_boundary
    def parse(cls, text: str) -> "Options":
        """Options from a knob string, `Options.parse("tile=32x32x64,unroll=4")`: the
        grammar of `tclang compare --manual`, of the other commands' `--options`, of
        their knob flags (`--tile 32,32,64`) and of `repr` (see parse_knobs)."""
        return parse_knobs(text)

    def __repr__(self) -> str:
        """Only the knobs that were set, in the one knob grammar, so that what a tuning
        found can be pasted into `--options` or `--manual` as it is printed (and eval'd
        back: `Options.parse(...)`)."""
        text = format_knobs(self)
        return f"Options.parse({text!r})" if text else "Options()"


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_sizes(name: str, value, allow_zero: bool) -> None:
    if not isinstance(value, tuple) or not all(_is_int(v) for v in value):
        raise TCScheduleError(f"{name} must be a tuple of integers, not {value!r}")
    least = 0 if allow_zero else 1
    if any(v < least for v in value):
        raise TCScheduleError(f"{name} sizes must be at least {least}, not {value!r}")


# a bad knob is the caller's error: shown at their line, not in dataclass and check frames
Options.__init__ = api_boundary(Options.__init__)
AUTOMATIC = Options()


# ---- the knob grammar -------------------------------------------------------------------
#
#   knobs := knob ("," knob)*              tile=32x32x64,unroll=4,loop_order=k:m:n
#   knob  := name "=" value                a field of Options; "-" and "_" alike
#
# and each knob's value by its kind (KNOBS):
#   sizes    tile, block, grid     32x32x64 (a 0 leaves a loop untiled); tile: "off" for no
#                                  tiling, "32x..." for 32 on every member
#   pair     register_tile         6x16, or off
#   order    loop_order            k:m:n or 2:0:1 (index names or positions)
#   count    unroll, vector_width  a positive integer
#   choice   fusion                max, min or preserve_parallel
#   seconds  compile_budget        a finite number of seconds above 0, e.g. 30 or 2.5
#   switch   the others            on or off (true/false, yes/no, 1/0 too); specialize
#                                  also auto (its default)
#
# Lists may also be separated by commas (`--tile 32,32,64`, the older spelling): inside a
# knob string, a piece with no "=" continues the value before it, so "tile=32,32,unroll=4"
# is "tile=32x32,unroll=4". `tclang compare --manual`, every command's --options and knob
# flags (tclang/cli/commands.py), `Options.parse` and `repr(Options)` all go through here.

KNOBS = {"fusion": "choice", "tile": "sizes", "unroll": "count", "specialize": "switch",
         "loop_order": "order", "parallel": "switch", "vectorize": "switch",
         "vector_width": "count", "block": "sizes", "grid": "sizes",
         "shared_memory": "switch", "private_memory": "switch",
         "reorder_reductions": "switch", "check_bounds": "switch", "register_tile": "pair",
         "pack": "switch", "passes": "switch", "compile_budget": "seconds"}
_ON, _OFF = ("on", "true", "yes", "1"), ("off", "false", "no", "0", "none")
_EVERY = "..."  # "32x...": an int tile, the same size on every member


def parse_knobs(text: str, what: str = "knob string") -> Options:
    """Options from a knob string (the grammar above); TCScheduleError, naming the string
    (as `what` calls it) and the knob, for anything else."""
    where = f"{what} {text!r}"
    pairs: list[list[str]] = []
    for piece in (p.strip() for p in text.split(",")):
        name, sep, value = piece.partition("=")
        if sep:
            pairs.append([name.strip(), value.strip()])
        elif pairs and piece:  # "tile=32,32": a comma list continues the value
            pairs[-1][1] += "," + piece
        elif piece:
            raise TCScheduleError(f"{where}: {piece!r} is not name=value",
                                  hint='for example "tile=32x32x64,unroll=4"')
    return knobs_options([(n, v) for n, v in pairs], where=where)


def knobs_options(pairs, base: Options | None = None, where: str = "") -> Options:
    """`base` (default: automatic) with each (knob name, value text) of `pairs` set, later
    pairs overriding earlier ones: the CLI's --options string, then its knob flags."""
    changes = {}
    for name, text in pairs:
        knob = knob_name(name, where)
        changes[knob] = parse_knob(knob, text, where)
    return replace(base if base is not None else AUTOMATIC, **changes)


def knob_name(name: str, where: str = "") -> str:
    """The Options field a knob name means ("loop-order" is loop_order)."""
    knob = name.strip().replace("-", "_")
    if knob not in KNOBS:
        import difflib
        close = difflib.get_close_matches(knob, list(KNOBS), n=1)
        raise TCScheduleError(f"{where + ': ' if where else ''}unknown knob {name!r}"
                              + (f" (did you mean {close[0]}?)" if close else ""),
                              hint="knobs: " + ", ".join(KNOBS))
    return knob


def parse_knob(knob: str, text: str, where: str = ""):
    """One knob's value from its text, as its kind reads it (the grammar above)."""
    kind, value = KNOBS[knob], text.strip()
    say = f"{where + ': ' if where else ''}{knob}"
    low = value.lower()
    if knob == "specialize" and low == "auto":
        return "auto"
    if kind == "switch":
        if low not in _ON + _OFF:
            raise TCScheduleError(f"{say} is on or off, not {value!r}")
        return low in _ON
    if kind == "choice":
        return low.replace("-", "_")
    if kind == "count":
        return _integer(say, value)
    if kind == "seconds":  # Options checks the range (finite, above 0)
        try:
            return float(value)
        except ValueError:
            raise TCScheduleError(f"{say}: {value!r} is not a number of seconds") from None
    if kind == "order":
        items = [x.strip() for x in value.replace(",", ":").split(":")]
        return tuple(int(x) if x.lstrip("-").isdigit() else x for x in items)
    if kind == "pair" and low in _OFF:
        return False
    if knob == "tile" and low in _OFF + ("",) and low != "0":  # (0 is a size: untiled)
        return ()
    if knob == "tile" and value.endswith(_EVERY):
        return _integer(say, value[:-len(_EVERY)].rstrip("x,"))
    return tuple(_integer(say, x) for x in value.replace(",", "x").split("x"))


def format_knobs(options: Options) -> str:
    """The knobs `options` sets (those that differ from automatic), as a knob string that
    parse_knobs reads back to equal Options; "" for the automatic schedule."""
    return ",".join(f"{f.name}={format_knob(f.name, getattr(options, f.name))}"
                    for f in fields(options) if getattr(options, f.name) != f.default)


def format_knob(knob: str, value) -> str:
    """One knob's value as text (what its --flag takes)."""
    kind = KNOBS[knob]
    if kind == "switch":
        return value if value == "auto" else "on" if value else "off"
    if kind == "order":
        return ":".join(map(str, value))
    if value is False or value == ():
        return "off"
    if _is_int(value) and knob == "tile":
        return f"{value}x{_EVERY}"
    if isinstance(value, tuple):
        return "x".join(map(str, value))
    return str(value)


def _integer(say: str, text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise TCScheduleError(f"{say}: {text!r} is not an integer") from None
