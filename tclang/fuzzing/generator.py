"""Random VALID tclang programs, driven by a `random.Random` (a script or hypothesis).

Programs are valid by construction, so that fuzzing time goes into the compiler rather
than into the front end's error paths (tests/lang fuzz those). Each statement starts from
"seed" reads whose plain subscripts anchor every index to an extent (a size, a literal, a
`where` range or a window); every other read uses an index over the same extent, a
constant, a gather, or an affine subscript under a `?:` guard, so all reads stay in
bounds. Values stay moderate (a magnitude bound per value; `tanh` or `%` where it would
grow), floats are rounded, cast to ints or compared only when computed exactly, and
integer products cannot overflow: the differential runner can then use tight tolerances.
The front end still checks every program; `STATS` counts attempts and rejections.
"""

from __future__ import annotations

import math
import random
import warnings
from collections import Counter
from dataclasses import dataclass, replace

from tclang.dtypes import DType, is_widening, promote
from tclang.errors import TCError, TCWarning
from tclang.lang.frontend import check_source
from tclang.lang.functions import BUILTINS

SIZES = ("N", "M", "K", "L", "P", "Q")
SIZE_VALUES = (1, 1, 2, 3, 3, 5, 7, 2, 4, 5, 6, 7, 8, 9, 11, 13, 16)  # primes and 1 often
VOLUME_CAP = 3000  # statement instances per program: the reference is a Python loop
INDEX_NAMES = "ijklmnpqrs"
RED_BOUND = 18  # the largest extent an index can get (N + 2 with N = 16)
LIMIT = {"bool": 1, "int8": 60, "uint8": 60, "int16": 1e4, "int32": 1e8, "int64": 1e14,
         "float16": 300.0, "bfloat16": 1e4, "float32": 1e6, "float64": 1e9}
_TYPES = {"float": DType.FLOAT32, "float32": DType.FLOAT32, "double": DType.FLOAT64,
          "int32": DType.INT32, "int64": DType.INT64, "half": DType.FLOAT16,
          "bfloat16": DType.BFLOAT16}
STATS: Counter = Counter()  # attempts, rejected, reject:<why>, programs


@dataclass(frozen=True)
class Node:
    """An expression tree: `fmt` with `{0}`, `{1}`... standing for the kids' text (the
    shrinker replaces a node by a kid or a literal and renders again)."""

    fmt: str
    kids: tuple["Node", ...] = ()

    def render(self) -> str:
        return self.fmt.format(*(k.render() for k in self.kids)) if self.kids else self.fmt


@dataclass(frozen=True)
class Decl:
    name: str
    type: str | None  # None: an output whose type and shape are inferred
    dims: tuple[str, ...] | None = None  # None: a scalar, written without parentheses

    def render(self) -> str:
        if self.type is None:
            return self.name
        return f"{self.type} {self.name}" if self.dims is None else \
            f"{self.type}({', '.join(self.dims)}) {self.name}"


@dataclass(frozen=True)
class Stmt:
    target: str
    indices: tuple[str, ...]
    op: str
    rhs: Node
    where: tuple[Node, ...] = ()
    semi: bool = False

    def render(self) -> str:
        lhs = f"{self.target}({', '.join(self.indices)})" if self.indices else self.target
        where = f" where {', '.join(c.render() for c in self.where)}" if self.where else ""
        return f"{lhs} {self.op} {self.rhs.render()}{where}{';' if self.semi else ''}"


@dataclass(frozen=True)
class Model:
    """A generated definition, kept structured for the shrinker."""

    name: str
    inputs: tuple[Decl, ...]
    outputs: tuple[Decl, ...]
    body: tuple[Stmt, ...]
    prelude: str = ""  # other definitions of the same source

    def render(self) -> str:
        ins = ", ".join(d.render() for d in self.inputs)
        outs = ", ".join(d.render() for d in self.outputs)
        body = "".join(f"    {s.render()}\n" for s in self.body)
        return f"{self.prelude}def {self.name}({ins}) -> ({outs}) {{\n{body}}}\n"


@dataclass(frozen=True)
class Features:
    """The checks a program gets besides the differential run (`tclang fuzz`'s extended
    generator, `fuzz_program`, draws them from the program's own seed; each is a share of
    programs, so that a run spends its time on every one of them):

    family: "generic" (`generate`'s programs) or the kind of reduction program
        (tclang/fuzzing/reductions.py): guarded, masked, triangular, prefix, softmax.
    module: the program as one definition of a module of several, in random layouts,
        compiled into the run's shared disk cache and edited between revisions
        (tclang/fuzzing/modules.py).
    grad: `tc.grad` against central differences in float64 (where differentiable).
    gradcheck, gradgradcheck: the same through `tclang.torch` with PyTorch's checks.
    tuner_options: the manual configuration drawn from the tuner's search space.
    interrupt: SIGINT to a child compiling the program, this many seconds in
        (tclang/fuzzing/interrupts.py); None: no interrupted compile.
    """

    family: str = "generic"
    module: object | None = None  # a modules.ModulePlan
    grad: bool = False
    gradcheck: bool = False
    gradgradcheck: bool = False
    tuner_options: bool = False
    interrupt: float | None = None
    volume_cap: int = 0  # statement instances the program's sizes may reach (0: VOLUME_CAP)

    def names(self) -> tuple[str, ...]:
        """The extra checks drawn, as the runner names them."""
        return tuple(name for name, on in (
            ("module", self.module is not None), ("grad", self.grad),
            ("gradcheck", self.gradcheck), ("gradgradcheck", self.gradgradcheck),
            ("interrupt", self.interrupt is not None)) if on)


@dataclass(frozen=True)
class GeneratedProgram:
    source: str
    entry: str
    sizes: dict[str, int]
    model: Model | None = None  # None for programs known only as text (regressions)
    features: Features = Features()


def generate(rng: random.Random) -> GeneratedProgram:
    """A random valid program with sizes that keep every read in bounds."""
    for _ in range(100):
        STATS["attempts"] += 1
        model = _Builder(rng).build()
        if rng.random() < 0.08:  # a second definition in the same source
            other = replace(_Builder(rng).build(), name="helper")
            model = replace(model, prelude=other.render())
        program = finish(model, rng)
        if program is not None:
            STATS["programs"] += 1
            return program
    raise RuntimeError("the generator keeps producing invalid programs")


def finish(model: Model, rng: random.Random, sizes: dict | None = None, *,
           values=SIZE_VALUES, cap: int = VOLUME_CAP):
    """Check the model with the front end and pick sizes (from `values`, at most `cap`
    statement instances); None (and a count) if it fails."""
    defn = checked_draw(model)
    if defn is None:
        return None
    sizes = sizes if sizes is not None and fits(defn, sizes, cap) else \
        pick_sizes(defn, rng, values, cap)
    if sizes is None:
        STATS["rejected"] += 1
        STATS["reject:no sizes fit"] += 1
        return None
    return GeneratedProgram(model.render(), model.name, sizes, model)


def checked_draw(model: Model, label: str = ""):
    """The model's definition as the front end checks it (its warnings ignored: a draw may
    well accumulate into a fresh tensor); None, counted in STATS with why, where the front
    end refuses it. Every family's drawing goes through here."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", TCWarning)
            return check_source(model.render())[model.name]
    except TCError as err:
        STATS["rejected"] += 1
        STATS[f"reject:{label}{type(err).__name__}: {str(err).splitlines()[0][:70]}"] += 1
        return None


def pick_sizes(defn, rng: random.Random, values=SIZE_VALUES,
               cap: int = VOLUME_CAP) -> dict[str, int] | None:
    for attempt in range(40):
        choices = values if attempt < 20 else (1, 2, 3)
        sizes = {s: rng.choice(choices) for s in defn.sizes}
        if fits(defn, sizes, cap):
            return sizes
    return None


def fits(defn, sizes: dict[str, int], cap: int = VOLUME_CAP) -> bool:
    """Every obligation holds, no statement is empty, the instances stay few."""
    if any(s not in sizes for s in defn.sizes) or \
            not all(o.holds(sizes) for o in defn.obligations):
        return False
    volume = 0
    for s in defn.statements:
        extents = [(r.hi - r.lo).evaluate(sizes) for r in s.domain]
        if any(e < 1 for e in extents):
            return False
        volume += math.prod(extents)
    return volume <= cap


@dataclass(frozen=True)
class Val:
    """A value being built: its tree and what the generator knows of it."""

    node: Node
    dtype: DType
    exact: bool = True  # computed without rounding: safe to compare or cast to int
    mag: float = 1.0  # a bound on |value|
    anchor: bool = False  # holds a seed read: must not sit under an affine `?:`
    affine: bool = False  # reads no tensor: as a `?:` condition it may guard reads

    def map(self, fmt: str, dtype: DType | None = None, exact: bool | None = None,
            mag: float | None = None) -> "Val":
        """`fmt` applied to this value; what is not given is kept."""
        return Val(Node(fmt, (self.node,)), dtype or self.dtype,
                   self.exact if exact is None else exact, self.mag if mag is None else mag,
                   self.anchor, self.affine)


@dataclass
class _Tensor:
    name: str
    dtype: DType
    exts: tuple[str, ...]  # each dimension's extent: "N", "3", "N + 2" or "@w1" (window)
    exact: bool = True
    mag: float = 5.0
    index: bool = False  # an int32 input used for gathers


class _Indices:
    """The indices of the statement being built, each with the extent it ranges over."""

    def __init__(self, cap: int):
        self.cap, self.exts, self.where = cap, {}, []
        self.window: set[str] = set()  # bounded only by their window read
        self.reduce: list[str] = []  # must be reduction indices

    def new(self, ext: str) -> str:
        name = INDEX_NAMES[len(self.exts)]
        self.exts[name] = ext
        return name

    def over(self, ext: str) -> list[str]:
        return [i for i, e in self.exts.items() if e == ext and i not in self.window]

    def full(self) -> bool:
        return len(self.exts) >= self.cap


def bfloat16_callable() -> bool:
    """Whether the fuzzer can call bfloat16 programs: NumPy has bfloat16 (ml_dtypes) or
    torch is installed (differential.py then passes torch tensors)."""
    from tclang.bfloat16 import NUMPY_HAS_BFLOAT16
    if NUMPY_HAS_BFLOAT16:
        return True
    import importlib.util
    return importlib.util.find_spec("torch") is not None


def kind(dtype: DType) -> str:
    return "bool" if dtype is DType.BOOL else "float" if dtype.is_float else "int"


def _called(fmt: str, dtypes: tuple[DType, ...], default: DType) -> DType:
    """The type of `fmt` when it calls a builtin (they compute in at least float32)."""
    name = fmt.split("(")[0]
    return BUILTINS[name].result_type(dtypes) if name in BUILTINS else default


def _lit(v) -> Val:
    dtype = DType.FLOAT32 if isinstance(v, float) else DType.INT32
    text = repr(v) if v >= 0 else f"({v!r})"
    return Val(Node(text), dtype, True, abs(v) + 1e-9, affine=True)


_FLOAT_UNARY = (  # (format, magnitude of the result from the argument's; None: unsafe)
    ("tanh({0})", lambda m: 1), ("sigmoid({0})", lambda m: 1), ("atan({0})", lambda m: 1.6),
    ("erf({0})", lambda m: 1), ("exp({0})", lambda m: math.exp(m) if m <= 6 else None),
    ("expm1({0})", lambda m: math.exp(m) if m <= 6 else None),
    ("sin({0})", lambda m: 1 if m <= 20 else None), ("cos({0})", lambda m: 1 if m <= 20 else None),
    ("sqrt(fabs({0}) + 1.0)", lambda m: math.sqrt(m + 1)),
    ("log(fabs({0}) + 1.0)", lambda m: math.log(m + 1) + 1), ("log1p(fabs({0}))", lambda m: m),
    ("rsqrt(fabs({0}) + 1.0)", lambda m: 1), ("cbrt({0})", lambda m: m ** (1 / 3) + 1),
    ("fabs({0})", lambda m: m), ("(-{0})", lambda m: m), ("abs({0})", lambda m: m),
    ("pow(fabs({0}) + 1.0, 1.5)", lambda m: (m + 1) ** 1.5 if m < 100 else None))
_EXACT_UNARY = ("fabs({0})", "(-{0})", "abs({0})", "floor({0})", "ceil({0})", "round({0})",
                "trunc({0})")


CONDITIONS_NOT_AFFINE = ("float({i}) > 0.5", "2.0 > 0.0", "{i} * {j} >= 1")
"""Conditions that read no tensor and are not affine, put inside a read's guard
(`_read`); gradients.grad_forms counts the programs that have one."""


class _Builder:
    def __init__(self, rng: random.Random):
        self.rng, self.t, self.inputs, self.outputs, self.body = rng, {}, [], [], []
        self.pool = rng.sample(SIZES, rng.choice((1, 2, 2, 3, 3, 4)))
        self.windows = 0
        self.current = None  # the tensor the statement being built writes

    # ---- the signature ----
    def build(self) -> Model:
        rng = self.rng
        for k in range(rng.choice((1, 2, 2, 3, 3, 4))):
            self._input("ABCD"[k], k)
        self.pool = sorted({x for d in self.inputs for x in d.dims or () if x in SIZES})
        if rng.random() < 0.25 and len(self.inputs) < 4 and self.pool:
            dims = tuple(rng.choice(self.pool) for _ in range(rng.choice((1, 1, 2))))
            self.inputs.append(Decl("G", "int32", dims))
            self.t["G"] = _Tensor("G", DType.INT32, dims, index=True)
        n = rng.choice((1, 1, 2, 2, 3, 3, 4, 5, 6))
        for k in range(n):
            self._statement(force_output=k == n - 1 and not self.outputs)
        while not self.outputs:
            self._statement(force_output=True)
        outs = tuple(self._output_decl(o) for o in self.outputs)
        return Model(rng.choice(("f", "fuzz", "kernel")), tuple(self.inputs), outs,
                     tuple(self.body))

    def _input(self, name: str, k: int) -> None:
        rng = self.rng
        rank = rng.choice((0, 1, 1, 2, 2, 2, 3, 3, 4))
        dtype = rng.choices(("float32", "float64", "int32", "int64", "float16", "bool", "int8",
                             "uint8", "bfloat16"),
                            (50, 12, 14, 5, 6, 6, 5, 2, 5 if bfloat16_callable() else 0))[0]
        dims = tuple(rng.choice(self.pool) if rng.random() < 0.9 else rng.choice("23")
                     for _ in range(rank))
        name = name if rank else ("alpha", "beta", "gamma", "delta")[k]
        spelled = {"float32": ("float", "float32"), "float64": ("double", "float64"),
                   "float16": ("half", "float16"),
                   "bfloat16": ("bfloat16", "bf16")}.get(dtype, (dtype,))
        self.inputs.append(Decl(name, rng.choice(spelled), dims if rank else None))
        self.t[name] = _Tensor(name, DType(dtype), dims)

    def _output_decl(self, name: str) -> Decl:
        t = self.t[name]
        if self.rng.random() < 0.2 and all(x.isidentifier() or x.isdigit() for x in t.exts):
            return Decl(name, t.dtype.value, t.exts if t.exts else None)
        return Decl(name, None)

    # ---- statements ----
    def _statement(self, force_output: bool) -> None:
        rng = self.rng
        written = [n for n in self.t if n not in {d.name for d in self.inputs}]
        if written and not force_output and rng.random() < 0.25:
            return self._rewrite(rng.choice(written))
        op = rng.choice(("=",) * 7 + ("+=!",) * 5 + ("max=!",) * 2 + ("min=!", "*=!", "+="))
        readable = [t for t in self.t.values() if t.exts]
        seeds = rng.sample(readable, min(len(readable), rng.choice((1, 1, 2, 2, 3))))
        idx = _Indices(cap=4 if op == "=" else 6)
        window = seeds and op.endswith("=!") and rng.random() < 0.2
        reads = [self._seed(t, idx, window and k == 0) for k, t in enumerate(seeds)]
        red = [i for i in idx.exts if op != "=" and i not in idx.window and rng.random() < 0.45]
        red = red[:3] + [k for k in idx.reduce if k not in red[:3]]
        lhs = [i for i in idx.exts if i not in red]
        if len(lhs) < 4 and rng.random() < 0.2:  # a broadcast or padded dimension
            ext = rng.choice(self.pool or ["2"])
            ext = rng.choice((ext, f"{ext} + 2", f"{ext} + 1", "3", f"2*{ext}"))
            lhs.append(idx.new(ext))
            # `+ 1` padding leaves the first point unwritten: a later statement over the
            # whole extent that reads the old value there reads the initial zeros
            # (tests/e2e/test_read_before_written.py)
            start = 1 if ext.endswith(" + 1") else 0
            idx.where.append(Node(f"{lhs[-1]} in {start}:{ext}"))
        if len(lhs) > 4:
            return None  # rare: too many seed dimensions
        rng.shuffle(lhs)
        if len(reads) > 1 and rng.random() < 0.1:  # a read that only bounds the indices
            idx.where.append(Node("exists " + reads.pop().node.render()))
        kinds = [kind(r.dtype) for r in reads if kind(r.dtype) != "float" or r.exact]
        want = "float" if rng.random() < 0.6 or not kinds else rng.choice(kinds)
        want = "int" if want == "bool" and op not in ("=", "max=!", "min=!") else want
        name = self.current = self._new_name(force_output)
        value = self._rhs(want, reads, idx, op, target=None)
        self._emit(name, tuple(lhs), op, value, idx)
        self.t[name] = _Tensor(name, value.dtype, tuple(idx.exts[i] for i in lhs),
                               value.exact and op in ("=", "max=!", "min=!"),
                               value.mag * (RED_BOUND ** len(red) if "+" in op else 1))
        return None

    def _rewrite(self, name: str) -> None:
        """Another statement writing an existing tensor over its whole extent."""
        rng, t = self.rng, self.t[name]
        self.current = name
        ops = ["=", "max=", "min=", "max=!", "min=!"]
        if kind(t.dtype) != "bool" and t.dtype.bits >= 32:
            ops += ["+=", "+=", "*=", "+=!"]
        op = rng.choice(ops)
        idx = _Indices(cap=len(t.exts) + (0 if op == "=" else 2))
        lhs = tuple(idx.new(x) for x in t.exts)
        others = [u for u in self.t.values() if u.exts and u.name != name]
        reads = [self._seed(u, idx) for u in rng.sample(others, min(len(others),
                                                                    rng.choice((0, 1, 2))))]
        if op == "=" and rng.random() < 0.6:  # the old value, at the same point
            reads.append(Val(Node(f"{name}({', '.join(lhs)})" if lhs else name), t.dtype,
                             t.exact, t.mag, anchor=True))
        value = self._rhs(kind(t.dtype), reads, idx, op, target=t)
        self._emit(name, lhs, op, value, idx)
        grown = value.mag * (RED_BOUND ** (len(idx.exts) - len(lhs)) if "+" in op else 1)
        t.mag = max(t.mag, grown) * (1500 if "*" in op else 1)
        t.exact = t.exact and value.exact and op[:3] in ("=", "max", "min")

    def _emit(self, name, lhs, op, value: Val, idx: _Indices) -> None:
        rhs, where = value.node, list(idx.where)
        if self.rng.random() < 0.12 and rhs.kids:  # name a part with a where-local
            part = self.rng.choice(rhs.kids)
            rhs = Node(rhs.fmt, tuple(Node("x") if k is part else k for k in rhs.kids))
            where.append(Node("x = {0}", (part,)))
        self.rng.shuffle(where)
        self.body.append(Stmt(name, lhs, op, rhs, tuple(where), self.rng.random() < 0.2))

    def _new_name(self, force_output: bool) -> str:
        output = force_output or self.rng.random() < 0.5
        name = f"{'O' if output else 'T'}{len(self.body)}"
        if output:
            self.outputs.append(name)
        return name

    # ---- reads ----
    def _seed(self, t: _Tensor, idx: _Indices, window: bool = False) -> Val:
        """A read whose plain subscripts anchor the indices it introduces; with `window`,
        one subscript is a sliding window `s*w + k` and w's extent is inferred from it."""
        rng, subs = self.rng, []
        d = rng.randrange(len(t.exts)) if window else -1
        for j, x in enumerate(t.exts):
            same = idx.over(x)
            if j == d:
                self.windows += 1
                w = idx.new(f"@w{self.windows}")
                idx.window.add(w)
                k = idx.new(str(rng.randint(1, int(x) if x.isdigit() else 3)))
                idx.where.append(Node(f"{k} in 0:{idx.exts[k]}"))
                idx.reduce.append(k)
                s = rng.choice((1, 1, 2, 3))
                subs.append(rng.choice((f"{s}*{w} + {k}", f"{k} + {w}*{s}") if s > 1 else
                                       (f"{w} + {k}", f"{k} + {w}")))
            elif same and (rng.random() < 0.6 or idx.full()):
                subs.append(self._plain(rng.choice(same), x))
            else:
                subs.append(idx.new(x) if not idx.full() else self._constant(x))
        return Val(Node(f"{t.name}({', '.join(subs)})"), t.dtype, t.exact, t.mag, anchor=True)

    def _plain(self, i: str, x: str) -> str:
        reverse = not x.startswith("@") and self.rng.random() < 0.15
        return f"{x if x.isidentifier() or x.isdigit() else f'({x})'} - 1 - {i}" if reverse else i

    def _constant(self, x: str) -> str:
        last = not x.startswith("@") and self.rng.random() < 0.3
        return f"{x if x.isidentifier() or x.isdigit() else f'({x})'} - 1" if last else "0"

    def _read(self, t: _Tensor, idx: _Indices) -> Val:
        """A read of `t` inside the statement's indices: every subscript in bounds, or
        guarded by an affine `?:` condition (which does not bound the indices)."""
        rng, subs, guards = self.rng, [], []
        gathers = [g for g in self.t.values() if g.index]
        for x in t.exts:
            same, r = idx.over(x), rng.random()
            if same and r < 0.7:
                subs.append(self._plain(rng.choice(same), x))
            elif gathers and r < 0.8:
                g = rng.choice(gathers)
                inner = [self._plain(rng.choice(idx.over(y)), y) if idx.over(y) else "0"
                         for y in g.exts]
                subs.append(f"{g.name}({', '.join(inner)})")
            elif not x.startswith("@") and idx.exts and r < 0.92:
                i, j, c = rng.choice(list(idx.exts)), rng.choice(list(idx.exts)), rng.randint(1, 2)
                # a stride with another index in the same subscript (2*i + j): its gradient
                # solves one subscript for i under a divisibility guard that mentions j
                s = rng.choice((f"{i} + {c}", f"{i} - {c}", f"2*{i} - {c * c}", f"{i} + {j}",
                                f"{x} - {i}", f"{i} - {j}", f"2*{i} + {j}"))
                subs.append(s)
                guards.append(rng.choice((f"{s} >= 0 && {s} < {x}", f"{s} >= 0 && {s} <= {x} - 1",
                                          f"!({s} < 0 || {s} >= {x})")))
            else:
                subs.append(self._constant(x))
        node = Node(f"{t.name}({', '.join(subs)})" if t.exts else
                    rng.choice((t.name, f"{t.name}()")))
        if guards:
            zero = "false" if t.dtype is DType.BOOL else \
                rng.choice(("0", "0.0", "1")) if t.dtype.is_float else "0"
            if rng.random() < 0.15:  # a condition that is not affine and reads nothing,
                # under the guard: merged with it, it left the read unguarded in a backward
                # (fuzz seed 2036, program 418)
                i, j = rng.choice(list(idx.exts) or ["0"]), rng.choice(list(idx.exts) or ["0"])
                cond = rng.choice(CONDITIONS_NOT_AFFINE).format(i=i, j=j)
                node = Node(f"(({cond}) ? {{0}} : {zero})", (node,))
            node = Node(f"(({' && '.join(guards)}) ? {{0}} : {zero})", (node,))
        return Val(node, t.dtype, t.exact, max(t.mag, 1))

    # ---- expressions ----
    def _rhs(self, want: str, reads: list[Val], idx: _Indices, op: str, target) -> Val:
        rng = self.rng
        vals = [self._convert(r, want) for r in reads]
        vals += [self._expr(want, idx, rng.choice((0, 1, 1, 2, 2, 3)))
                 for _ in range(rng.choice((0, 0, 1, 1, 2)) if vals else 1)]
        rng.shuffle(vals)
        value = vals[0]
        for v in vals[1:]:
            value = self._combine(value, v, want)
        if rng.random() < 0.25:
            value = self._wrap(value, idx)
        return self._fit(value, op, target)

    def _fit(self, v: Val, op: str, target) -> Val:
        """Bound what a reduction accumulates, and cast to the target's type if needed."""
        if "*" in op:  # products of values near 1 (or -1, 0, 1) cannot overflow
            v = v.map("min(max({0}, -1), 1)", promote(v.dtype, DType.INT32), True, 1) \
                if kind(v.dtype) == "int" else \
                v.map("(1.0 + 0.01 * tanh({0}))", promote(v.dtype, DType.FLOAT32), False, 1.02)
        elif "+" in op and v.mag > LIMIT[v.dtype.value] / RED_BOUND ** 3:
            v = self._bounded(v)
        if "+" in op and v.dtype.is_narrow_float:  # a half sum would round at every term
            v = v.map("float({0})", DType.FLOAT32)
        if target is not None and not is_widening(v.dtype, target.dtype):
            if target.dtype.is_narrow_float and v.mag > LIMIT[target.dtype.value]:
                v = self._bounded(v)
            v = v.map(f"{target.dtype.value}({{0}})", target.dtype)
        return v

    def _bounded(self, v: Val) -> Val:
        if kind(v.dtype) == "int":
            c = self.rng.choice((3, 7, 13, 97))
            return v.map(f"({{0}} % {c})", mag=c)
        return v.map("tanh({0})", _called("tanh", (v.dtype,), v.dtype), False, 1)

    def _convert(self, v: Val, want: str) -> Val:
        have, rng = kind(v.dtype), self.rng
        if have == want:
            small = want == "int" and v.dtype.bits < 32 and rng.random() < 0.8
            return v.map("int32({0})", DType.INT32) if small else v
        if want == "float":
            if have == "bool":
                return v.map("({0} ? 1.5 : -0.5)", DType.FLOAT32, True, 1.5)
            t = rng.choice(("float", "double", "float32"))
            return v.map(f"{t}({{0}})", _TYPES[t])
        if want == "int":
            if have == "bool":
                return v.map("int32({0})", DType.INT32, True, 1)
            if not v.exact:  # rounding differs between backends: only a safe comparison
                return v.map("int32({0} > 1e30)", DType.INT32, True, 1)
            t = rng.choice(("int32({0})", "int32(floor({0}))", "int64({0})"))
            return v.map(t, _TYPES[t[:5]], True, v.mag + 1)
        zero = "0.0" if have == "float" else "0"
        cond = f"({{0}} {rng.choice(('>', '<=', '!='))} {zero})" if v.exact else "({0} < 1e30)"
        return v.map(cond, DType.BOOL, True, 1)

    def _expr(self, want: str, idx: _Indices, depth: int) -> Val:
        rng, r = self.rng, self.rng.random()
        if depth <= 0:
            return self._leaf(want, idx)
        if r < 0.45:
            return self._combine(self._expr(want, idx, depth - 1),
                                 self._expr(want, idx, depth - 1), want)
        if r < 0.7 and want != "bool":
            return self._unary(self._expr(want, idx, depth - 1))
        if r < 0.85:
            return self._wrap(self._expr(want, idx, depth - 1), idx)
        other = rng.choice(("float", "int", "bool"))
        return self._convert(self._expr(other, idx, depth - 1), want)

    def _leaf(self, want: str, idx: _Indices) -> Val:
        rng, r = self.rng, self.rng.random()
        readable = [t for t in self.t.values() if t.name != self.current]
        if r < 0.6 and readable:
            return self._convert(self._read(rng.choice(readable), idx), want)
        if r < 0.8 or not idx.exts:
            if want == "bool":
                return Val(Node(rng.choice(("true", "false"))), DType.BOOL, True, 1, affine=True)
            return _lit(rng.choice((0.5, 1.5, 2.0, -0.75, 0.25, 3.0) if want == "float" else
                                   (1, 2, 3, -1, -4, 7, 0)))
        i = rng.choice(list(idx.exts))  # index and size values
        other = rng.choice(list(idx.exts) + self.pool + ["1"])
        if want == "bool":
            op = rng.choice(("<", "<=", "==", "!=", ">", ">="))
            return Val(Node(f"({i} {op} {other})"), DType.BOOL, True, 1, affine=True)
        v = Val(Node(rng.choice((i, f"({i} - {other})", rng.choice(self.pool or ["3"])))),
                DType.INT32, True, 2 * RED_BOUND, affine=True)
        return self._convert(v, want)

    def _combine(self, a: Val, b: Val, want: str) -> Val:
        rng, dtype = self.rng, promote(a.dtype, b.dtype)
        limit = LIMIT[dtype.value]
        if want == "bool":
            fmt = rng.choice(("({0} && {1})", "({0} || {1})", "({0} != {1})", "(!{0} || {1})"))
            return Val(Node(fmt, (a.node, b.node)), DType.BOOL, True, 1, a.anchor or b.anchor,
                       a.affine and b.affine)
        if want == "int":
            if dtype.bits < 32 or not dtype.is_signed:  # no int8 or unsigned arithmetic
                dtype = DType.INT32 if dtype.bits < 64 else DType.INT64
                a = a.map(f"{dtype.value}({{0}})", dtype)
            c = rng.choice((2, 3, -3, 5, 7, -1))
            choices = [("({0} + {1})", a.mag + b.mag), ("({0} - {1})", a.mag + b.mag),
                       ("min({0}, {1})", max(a.mag, b.mag)), ("max({0}, {1})", max(a.mag, b.mag)),
                       ("({0} / {1})", a.mag), ("({0} % {1})", max(a.mag, b.mag)),
                       (f"({{0}} / {c} + {{1}})", a.mag + b.mag),
                       (f"({{1}} % {c} - {{0}})", abs(c) + a.mag)]
            if a.mag * b.mag < limit / 1e3:
                choices.append(("({0} * {1})", a.mag * b.mag))
        else:
            choices = [("({0} + {1})", a.mag + b.mag), ("({0} - {1})", a.mag + b.mag),
                       ("({0} / (fabs({1}) + 1.0))", a.mag), ("fmax({0}, {1})", max(a.mag, b.mag)),
                       ("min({0}, {1})", max(a.mag, b.mag)), ("hypot({0}, {1})", a.mag + b.mag),
                       ("({0} * 0.5 + {1})", a.mag + b.mag)]
            if a.mag * b.mag < limit:
                choices += [("({0} * {1})", a.mag * b.mag)] * 2 + \
                    [("fma({0}, {1}, 0.25)", a.mag * b.mag + 1)]
        fmt, mag = rng.choice(choices)
        exact = a.exact and b.exact and (want == "int" or fmt.startswith(("min", "fmax", "max")))
        if fmt.startswith("({0} / (fabs"):
            dtype = promote(dtype, DType.FLOAT32)
        v = Val(Node(fmt, (a.node, b.node)), _called(fmt, (a.dtype, b.dtype), dtype), exact,
                mag, a.anchor or b.anchor, a.affine and b.affine)
        return self._bounded(v) if mag > limit else v

    def _unary(self, v: Val) -> Val:
        rng = self.rng
        if kind(v.dtype) == "int":
            fmt = rng.choice(("abs({0})", "(-{0})", "({0} / 2)", "({0} % 4)"))
            return v.map(fmt, promote(v.dtype, DType.INT32), True, v.mag + 4)
        if v.exact and rng.random() < 0.3:
            fmt = rng.choice(_EXACT_UNARY)
            return v.map(fmt, _called(fmt, (v.dtype,), v.dtype), True, v.mag + 1)
        fmt, mag = rng.choice(_FLOAT_UNARY)
        mag = mag(v.mag)
        fmt, mag = (fmt, mag) if mag is not None else ("tanh({0})", 1)
        return v.map(fmt, _called(fmt, (v.dtype,), v.dtype), False, mag)

    def _wrap(self, v: Val, idx: _Indices) -> Val:
        """A `?:` choosing between v and another value, on data or on the indices."""
        cond = self._expr("bool", idx, self.rng.choice((0, 1)))
        if cond.affine and v.anchor:  # an affine condition would guard the seed reads
            cond = self._convert(v, "bool")
        other = self._convert(self._leaf(kind(v.dtype), idx), kind(v.dtype))
        a, b = (v, other) if self.rng.random() < 0.5 else (other, v)
        return Val(Node("({0} ? {1} : {2})", (cond.node, a.node, b.node)),
                   promote(v.dtype, other.dtype), v.exact and other.exact,
                   max(v.mag, other.mag), v.anchor, v.affine and other.affine and cond.affine)
