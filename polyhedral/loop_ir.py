"""The loop IR: what the polyhedral layer hands to every backend.

Plain frozen dataclasses (no isl object survives past the AST lowering): integer index
expressions (`Var`, `Int`, `Op`), loop nodes (`For`, `If`, `Block`), statement instances
(`Run`), GPU launches with their promoted buffers, copies and barriers, and the CPU's
per-thread scratch buffers (`Scratch`: packed operands of a micro-kernel). A statement's body
is the checked program's typed expression tree (`tclang.lang.program`), evaluated at the
statement's index values, with each read's subscript forms lowered to index expressions
(`Read.affine`, see `StatementDef`): nothing here is an `Affine`, a `SizeExpr` or an isl
object. polyhedral/loop_format.py prints the IR as readable pseudo-C.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Callable, Mapping

from tclang.dtypes import DType
from tclang.lang.program import Expr

# ---- integer index expressions ---------------------------------------------------------

#: operators of `Op`, with their arity. Division and remainder are only ever by a positive
#: constant or a positive size: "floordiv" rounds down and "floormod" is the remainder that
#: goes with it (a subscript's `/` and `%`), "div_nonneg" and "rem" are C's `/` and `%`
#: (isl emits them where the dividend is known non-negative, or for `% == 0` tests).
OPS = {"add": 2, "sub": 2, "mul": 2, "neg": 1, "floordiv": 2, "floormod": 2, "div_nonneg": 2,
       "rem": 2, "min": 2, "max": 2, "select": 3, "lt": 2, "le": 2, "gt": 2, "ge": 2, "eq": 2,
       "ne": 2, "and": 2, "or": 2, "not": 1}

#: what starts the name of a statement index variable; no loop variable, size or GPU id
#: has it (they are C identifiers), so a backend can bind these per statement instance
#: without shadowing anything bound by the loops around it
INDEX_PREFIX = "$"


@dataclass(frozen=True)
class Var:
    """A loop iterator, a size, a GPU id (`b0`..`b2` blocks, `t0`..`t2` threads), or in a
    statement's subscripts one of its indices (`index_var`)."""

    name: str


@dataclass(frozen=True)
class Int:
    value: int


@dataclass(frozen=True)
class Op:
    op: str
    args: tuple["IExpr", ...]


IExpr = Var | Int | Op


def index_var(name: str) -> Var:
    """The variable that stands for statement index `name` in its subscripts."""
    return Var(INDEX_PREFIX + name)


def index_name(var: str) -> str | None:
    """The statement index a variable name stands for, or None for any other variable."""
    return var[len(INDEX_PREFIX):] if var.startswith(INDEX_PREFIX) else None


def add(a: IExpr, b: IExpr) -> IExpr:
    if isinstance(b, Int) and b.value == 0:
        return a
    if isinstance(a, Int) and isinstance(b, Int):
        return Int(a.value + b.value)
    return Op("add", (a, b))


def sub(a: IExpr, b: IExpr) -> IExpr:
    if isinstance(b, Int) and b.value == 0:
        return a
    if isinstance(a, Int) and isinstance(b, Int):
        return Int(a.value - b.value)
    return Op("sub", (a, b))


def uses_var(e: IExpr, name: str) -> bool:
    return name in variables(e)


def variables(e: IExpr) -> set[str]:
    if isinstance(e, Var):
        return {e.name}
    if isinstance(e, Op):
        return set().union(*(variables(a) for a in e.args))
    return set()


#: C's spelling of each operator that C has: a template over the operands' texts ({0}, {1},
#: {2}); a target adds its own helpers for the rest (floordiv, floormod, min, max)
C_OPERATORS = {"add": "({0} + {1})", "sub": "({0} - {1})", "mul": "({0} * {1})",
               "div_nonneg": "({0} / {1})", "rem": "({0} % {1})", "lt": "({0} < {1})",
               "le": "({0} <= {1})", "gt": "({0} > {1})", "ge": "({0} >= {1})",
               "eq": "({0} == {1})", "ne": "({0} != {1})", "and": "({0} && {1})",
               "or": "({0} || {1})", "neg": "(-{0})", "not": "(!{0})",
               "select": "({0} ? {1} : {2})"}


def render_index(e: IExpr, variable: Callable[[str], str], integer: Callable[[int], str],
                 operators: Mapping[str, str]) -> str:
    """`e` as generated code's text: each variable and number as `variable` and `integer`
    spell them, each operation by its template in `operators` (fully parenthesized). The
    CUDA kernels, the exported C wrapper and the NumPy interpreter print index
    expressions with this, each with its own spelling."""
    match e:
        case Int(value=v):
            return integer(v)
        case Var(name=n):
            return variable(n)
    template = operators.get(e.op)
    if template is None:
        raise ValueError(f"no spelling for index operator {e.op!r}")
    return template.format(*(render_index(a, variable, integer, operators) for a in e.args))


def iexpr_to_json(e: IExpr):
    """An index expression as JSON data: a number, a variable's name, or [op, args...]."""
    if isinstance(e, Int):
        return e.value
    if isinstance(e, Var):
        return e.name
    return [e.op, *(iexpr_to_json(a) for a in e.args)]


def iexpr_from_json(x) -> IExpr:
    """The inverse of `iexpr_to_json`; ValueError on anything else (the disk cache's data
    is checked, not trusted)."""
    if isinstance(x, bool):
        raise ValueError(f"not an index expression: {x!r}")
    if isinstance(x, int):
        return Int(x)
    if isinstance(x, str):
        return Var(x)
    if isinstance(x, list) and x and x[0] in OPS and len(x) - 1 == OPS[x[0]]:
        return Op(x[0], tuple(iexpr_from_json(a) for a in x[1:]))
    raise ValueError(f"not an index expression: {x!r}")


# ---- buffers and statements -------------------------------------------------------------

@dataclass(frozen=True)
class Buffer:
    """An array the kernel touches. kind: input, output, temporary (the kernel's own
    scratch array), shared (GPU shared memory, per block), private (per GPU thread) or
    scratch (per CPU thread, declared by a `Scratch` node)."""

    name: str
    dtype: DType
    shape: tuple[IExpr, ...]
    kind: str
    #: strides in elements where they are constants of the code (a specialized kernel: an
    #: input's come from its layout key, tclang/layouts.py, which the compile cache key
    #: includes; the runtime allocates the others row-major); None for the whole buffer or
    #: one dimension: the kernel reads it at run time
    strides: tuple[int | None, ...] | None = field(default=None, compare=False)
    #: a buffer with run-time strides: every element offset of its layout is below this in
    #: magnitude (the layout key guarantees it); None: no bound known
    offset_bound: int | None = field(default=None, compare=False)


@dataclass(frozen=True)
class StatementDef:
    """What one statement does at each point of its domain.

    kind "init" sets target[lhs] to `value` (a reduction's identity); "assign" stores
    `value`; "reduce" combines target[lhs] with `value` by `op` (+, *, min, max). `value`
    refers to the statement's indices by name (`IndexValue`), bound from `Run.indices`.
    Each read in `value` has its subscripts twice: `subscripts`, typed expressions (what a
    gather evaluates), and `affine`, each one's index expression over the statement's index
    variables (`index_var`) and the sizes (numbers in a specialized kernel), or None where
    it is data-dependent; its `guard` is None (the branches around the read hold it).
    """

    id: str
    target: str
    indices: tuple[str, ...]
    lhs: tuple[str, ...]
    kind: str
    op: str
    value: Expr
    text: str = field(default="", compare=False)
    line: int = field(default=0, compare=False)
    #: a scatter (tclang/lang/scatters.py): the target's subscripts as typed integer
    #: expressions over `indices` (`lhs` is then empty), each checked against the target's
    #: extent before the update, as a gather's are; () for every other statement
    scatter: tuple[Expr, ...] = ()


# ---- loop nodes --------------------------------------------------------------------------

@dataclass(frozen=True)
class For:
    """`for (var = lo; var < hi; var += step)`.

    parallel: the iterations are independent (coincident): the CPU backend may run them on
    several threads. parallel and reduction together: a scatter's loop on threads
    (polyhedral/scatter_loops.py), whose iterations may update the same elements of its
    target: the backend combines them (privatized copies merged at the end). vectorize:
    innermost and stride-1, worth SIMD. reduction: the loop carries only reduction
    dependences, so a float reduction in it may be reassociated.
    unroll: unroll by this factor (0: backend's choice). unrolled: a register tile's point
    loop (constant bounds), emitted as straight-line code, one copy of the body per
    iteration; where `vectorize` also holds (its iterations carry no dependence) and the
    accesses allow, an innermost one becomes vector operations, one lane per iteration.
    The loop IR stays small: an 8 x 32 tile is two loops, not 256 statements.
    """

    var: str
    lo: IExpr
    hi: IExpr
    step: int
    body: "Node"
    parallel: bool = False
    vectorize: bool = False
    reduction: bool = False
    unroll: int = 0
    unrolled: bool = False


@dataclass(frozen=True)
class If:
    cond: IExpr
    then: "Node"
    other: "Node | None" = None


@dataclass(frozen=True)
class Block:
    body: tuple["Node", ...]


@dataclass(frozen=True)
class Promotion:
    """Accesses of one reference redirected to a promoted buffer.

    ref is the `Read.ref` of the statement's value, or -1 for its target (write and, for a
    reduction, the accumulated read). The element A[s] becomes buffer[s - offset].
    """

    ref: int
    buffer: str
    offset: tuple[IExpr, ...]


@dataclass(frozen=True)
class Run:
    """One instance of a statement: its indices' values as expressions of the loops."""

    statement: str
    indices: tuple[IExpr, ...]
    promoted: tuple[Promotion, ...] = ()


@dataclass(frozen=True)
class Copy:
    """Move tensor[index] to (direction "in") or from ("out") buffer[index - offset]."""

    buffer: str
    tensor: str
    direction: str
    index: tuple[IExpr, ...]
    offset: tuple[IExpr, ...]


@dataclass(frozen=True)
class Combine:
    """dst[dst_index] = src[src_index] when op is None, else dst = dst <op> src (op one of
    +, *, min, max): the steps of a parallel reduction. dst and src name a kernel buffer
    or one of the launch's own buffers."""

    op: str | None
    dtype: DType
    dst: str
    dst_index: tuple[IExpr, ...]
    src: str
    src_index: tuple[IExpr, ...]
    atomic: bool = False  # dst is combined with by several blocks at once (an atomic update)


@dataclass(frozen=True)
class BlockCombine:
    """partial[0] = partial[0] op partial[1] op ... op partial[count - 1]: the last steps of
    a parallel reduction, by a block's `count` threads together (a power of two, at least
    a warp; thread t wrote partial[t] before a barrier). The order of the combinations is
    the backend's: CUDA combines within each warp by shuffles, then the warps' results,
    with two barriers where a tree over shared memory takes one per level. Afterwards
    partial[0] holds the result and the rest of `partial` is undefined; a barrier after it
    is the caller's."""

    op: str
    dtype: DType
    partial: str
    count: int


@dataclass(frozen=True)
class Barrier:
    """All threads of a GPU block wait here (`__syncthreads()`)."""


@dataclass(frozen=True)
class Launch:
    """A GPU kernel: `grid` blocks of `block` threads run `body`, which reads its block and
    thread ids as the variables b0, b1, b2 and t0, t1, t2 (x first). `buffers` are the
    shared and private arrays it declares."""

    name: str
    grid: tuple[IExpr, ...]
    block: tuple[int, ...]
    buffers: tuple[Buffer, ...]
    body: "Node"


@dataclass(frozen=True)
class TileOperand:
    """One operand of a `TileContraction`: its element at a point of the contraction is
    `tensor[index]`, `index` written in the variables TILE_M and TILE_K (the left operand)
    or TILE_K and TILE_N (the right one), and TILE_B. `linear`: every subscript is a sum of
    those variables times constants plus sizes, so consecutive points along one variable
    are a constant number of elements apart, and a backend may load several at once where
    the run-time strides make that number 1 (and the addresses are aligned).
    `fast`: the variable ("m", "n" or "k") that walks the tensor's last subscript with
    coefficient 1 in the layout the kernel was compiled for, "" if none does: the direction
    a backend lays the operand's tile out along in shared memory."""

    tensor: str
    dtype: DType
    index: tuple[IExpr, ...]
    linear: bool
    fast: str = ""


TILE_M, TILE_N, TILE_K, TILE_B = "tc_m", "tc_n", "tc_k", "tc_b"


@dataclass(frozen=True)
class TileContraction:
    """A launch's whole body: a contraction computed a tile per block, as tuned GEMMs do.

        S(b, m, n) = sum over k < depth of  a(b, m, k) * b(b, k, n)     (products and sums
        in float32), for m < rows, n < cols, b < batch

    then `target[out_index] = S` (op None) or `target[out_index] += S` (op "+"), with
    out_index in TILE_M, TILE_N, TILE_B. Block (x, y, z) of the launch's grid takes the
    points TILE_N in [x * tile[1], ...), TILE_M in [y * tile[0], ...) and TILE_B = z; its
    threads load the operands' tiles (tile[2] deep) into shared memory and multiply them,
    on the tensor cores (`engine` "mma": float16/bfloat16 operands, `warp_tile` points per
    warp, `stages` slices in shared memory, the next ones' copies in flight while one is
    multiplied) or the CUDA cores ("simt": an 8 x 8 register tile per thread). After the sum is
    written, `followers` (runs in the same variables: elementwise statements of the next
    band, such as a bias and an activation, or the rounding of a half result) run at each
    point of the tile, reading what the block wrote. Sums of a point never cross blocks,
    so there are no atomics, and each point is written once.

    The order of the additions is the backend's (tiles of `tile[2]`); that is the freedom a
    reduction's `reduction` mark gives a CPU loop."""

    a: TileOperand
    b: TileOperand
    target: str
    target_dtype: DType
    out_index: tuple[IExpr, ...]
    op: str | None
    rows: IExpr
    cols: IExpr
    depth: IExpr
    batch: IExpr
    tile: tuple[int, int, int]
    engine: str
    warp_tile: tuple[int, int] = (0, 0)
    followers: tuple["Node", ...] = ()
    stages: int = 2  # slices in flight in shared memory (tensor cores: copies ahead)


@dataclass(frozen=True)
class Scratch:
    """`buffers` private to the CPU thread that runs `body`: small, fixed-size arrays (a
    packed operand of a micro-kernel, copied in by `Copy` nodes in `body` and read through
    `Run.promoted`). A backend gives each thread its own, e.g. on its stack; nothing in
    them outlives `body`."""

    buffers: tuple[Buffer, ...]
    body: "Node"


Node = (For | If | Block | Run | Copy | Combine | BlockCombine | Barrier | Launch | Scratch |
        TileContraction)


@dataclass(frozen=True)
class TemporaryPlan:
    """Where a temporary of the definition lives (polyhedral/contraction.py): `contracted`,
    in a `Scratch` buffer of the same name inside the loop `loop`, one slice per
    iteration (its accesses promoted to it; `note` is the slice, as `m[1]`), and no
    longer among the kernel's buffers; or kept as a kernel buffer, the runtime's to
    allocate, for the reason in `note`."""

    buffer: Buffer  # as the definition declares it
    contracted: bool
    loop: str = ""  # the loop variable whose iterations each have their own slice
    note: str = ""


@dataclass(frozen=True)
class CodeChoices:
    """What the schedule leaves to code generation, decided by the driver from the user's
    options and the target, so that a backend reads the kernel and nothing else.

    check_bounds: every array access checked at run time. reassociate: a float reduction in
    a loop marked `reduction` may be reordered (fast-math reassoc on its steps).
    always_threaded: parallel loops go to threads however little work they have (else the
    backend runs small ones serially). vectorize: the backend's vectorizers run;
    vector_width: the lanes to ask them for (0: their choice). private_memory: GPU
    accumulators live in registers (else in global memory).
    """

    check_bounds: bool = False
    reassociate: bool = True
    always_threaded: bool = False
    vectorize: bool = True
    vector_width: int = 0
    private_memory: bool = True


@dataclass(frozen=True)
class Kernel:
    """One definition, scheduled: the unit each backend compiles.

    sizes are the size names; in a specialized kernel `size_values` gives each one's value
    and the loops use the numbers directly (in a partly generic one, the values of the
    sizes it is specialized in: the others are passed at run time). `zero_fill` lists outputs not written at every
    point, which the runtime must allocate zero-filled. `choices` say how to emit it.
    `buffers` are what the runtime allocates: a contracted temporary is not among them.
    """

    name: str
    sizes: tuple[str, ...]
    size_values: tuple[tuple[str, int], ...]
    buffers: tuple[Buffer, ...]
    statements: tuple[StatementDef, ...]
    body: Node
    zero_fill: tuple[str, ...] = ()
    choices: CodeChoices = CodeChoices()
    temporaries: tuple[TemporaryPlan, ...] = ()  # what became of each temporary (CPU)

    @property
    def specialized(self) -> bool:
        """Whether every size is a constant of the code (`size_values` names them all)."""
        return bool(self.size_values) and \
            set(self.sizes) <= {name for name, _ in self.size_values}

    def buffer(self, name: str) -> Buffer:
        return self._by_name[0][name]

    def declared(self, name: str) -> Buffer:
        """A kernel buffer, or a contracted temporary as the definition declares it (its
        dtype and shape; its storage is a `Scratch` buffer of the same name)."""
        for plan in self.temporaries:
            if plan.contracted and plan.buffer.name == name:
                return plan.buffer
        return self.buffer(name)

    def statement(self, sid: str) -> StatementDef:
        return self._by_name[1][sid]

    @cached_property
    def _by_name(self) -> tuple[dict[str, Buffer], dict[str, StatementDef]]:
        """Buffers and statements by name, built once: the backends and the passes ask per
        statement run, and a kernel of n statements may have n buffers."""
        buffers: dict[str, Buffer] = {}
        statements: dict[str, StatementDef] = {}
        for b in self.buffers:
            buffers.setdefault(b.name, b)
        for s in self.statements:
            statements.setdefault(s.id, s)
        return buffers, statements


def walk_nodes(node: Node):
    """Every node of a loop tree, parents first."""
    yield node
    match node:
        case For(body=b) | Launch(body=b) | Scratch(body=b):
            yield from walk_nodes(b)
        case If(then=t, other=o):
            yield from walk_nodes(t)
            if o is not None:
                yield from walk_nodes(o)
        case Block(body=items):
            for item in items:
                yield from walk_nodes(item)
        case TileContraction(followers=items):
            for item in items:
                yield from walk_nodes(item)


def evaluate(e: IExpr, env) -> int:
    """The value of an index expression, given values for its variables."""
    if isinstance(e, Int):
        return e.value
    if isinstance(e, Var):
        return env[e.name]
    a = [evaluate(x, env) for x in e.args]
    match e.op:
        case "add":
            return a[0] + a[1]
        case "sub":
            return a[0] - a[1]
        case "mul":
            return a[0] * a[1]
        case "neg":
            return -a[0]
        case "floordiv" | "div_nonneg":
            return a[0] // a[1]
        case "rem" | "floormod":
            return a[0] % a[1]
        case "min":
            return min(a)
        case "max":
            return max(a)
        case "select":
            return a[1] if a[0] else a[2]
        case "lt":
            return int(a[0] < a[1])
        case "le":
            return int(a[0] <= a[1])
        case "gt":
            return int(a[0] > a[1])
        case "ge":
            return int(a[0] >= a[1])
        case "eq":
            return int(a[0] == a[1])
        case "ne":
            return int(a[0] != a[1])
        case "and":
            return int(bool(a[0]) and bool(a[1]))
        case "or":
            return int(bool(a[0]) or bool(a[1]))
        case "not":
            return int(not a[0])
    raise ValueError(f"unknown operator {e.op}")


def substitute(e: IExpr, values: dict[str, IExpr]) -> IExpr:
    """`e` with the variables in `values` replaced; operations on numbers only folded."""
    match e:
        case Var(name=n):
            return values.get(n, e)
        case Op(op=op, args=args):
            new = tuple(substitute(a, values) for a in args)
            if all(isinstance(a, Int) for a in new):
                return Int(evaluate(Op(op, new), {}))
            if op == "add":
                return add(*new)
            if op == "sub":
                return sub(*new)
            return Op(op, new)
    return e


def substitute_node(node: Node, values: dict[str, IExpr]) -> Node:
    """A loop tree with the variables in `values` replaced everywhere (an unrolled copy)."""
    match node:
        case Run(indices=indices, promoted=promoted):
            promoted = tuple(replace(p, offset=tuple(substitute(o, values) for o in p.offset))
                             for p in promoted)
            return replace(node, indices=tuple(substitute(i, values) for i in indices),
                           promoted=promoted)
        case For(lo=lo, hi=hi, body=body):
            return replace(node, lo=substitute(lo, values), hi=substitute(hi, values),
                           body=substitute_node(body, values))
        case If(cond=c, then=t, other=o):
            return If(substitute(c, values), substitute_node(t, values),
                      substitute_node(o, values) if o is not None else None)
        case Block(body=items):
            return Block(tuple(substitute_node(i, values) for i in items))
    raise ValueError(f"cannot unroll over a {type(node).__name__} node")
