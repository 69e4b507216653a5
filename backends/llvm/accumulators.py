"""Which result elements a loop may keep in registers: the analysis behind accumulator
promotion (the CPU twin of the CUDA backend's private-memory promotion).

A loop whose body (with the loops and conditions inside it) only updates, by reductions,
elements that do not move along any of those loops, and reads none of the tensors it
updates, may load each element once before the loop, carry it through the loop as an SSA
value and store it once after. For a register tile of a contraction (see
polyhedral/register_tiles.py) that is the micro-kernel: mr x nr accumulators live across the
whole reduction, and LLVM's SLP vectorizer turns them into vector registers and FMAs.
LLVM's own LICM does this only for what it can prove does not alias, and not across the
partial-tile branches and the loops nested in the reduction; here the loop IR says it.

Updated elements are told apart by their subscripts as affine forms of the loops outside:
two updates of one tensor must have the same variable part in each subscript, so a
different constant means a different element and the same constants the same one.
"""

from __future__ import annotations

from dataclasses import dataclass

from polyhedral import loop_ir as L
from tclang.lang.program import reads_of

MAX_ACCUMULATORS = 384  # scalars carried through one loop at most (an AVX-512 4 x 96 tile)


@dataclass(frozen=True)
class Accumulator:
    """One promoted element: `tensor[subscripts]` (expressions of the outer loops)."""

    tensor: str
    subscripts: tuple[L.IExpr, ...]
    lanes: int = 1  # a vector of this many consecutive elements along the last subscript


@dataclass(frozen=True)
class Promotion:
    """The accumulators of one loop, and the one each update in it goes to, in the order
    of the updates in the loop body (blocks in order, an if's `then` before its `else`)."""

    accumulators: tuple[Accumulator, ...]
    targets: tuple[int, ...]
    #: every read in the loop is contiguous or invariant along it: the loop vectorizer
    #: makes each accumulator a vector of partial sums (a register tile of dot products);
    #: otherwise the straight-line updates are the SLP vectorizer's (an outer product)
    contiguous: bool = False


def plan(loop: L.For, kernel: L.Kernel) -> Promotion | None:
    """The promotion for `loop`, or None when some update in it may not be carried."""
    if loop.parallel:
        return None
    runs: list[L.Run] = []
    inner_vars = {loop.var}
    if not _collect(loop.body, runs, inner_vars):
        return None
    if not runs:
        return None
    keys: dict[tuple, int] = {}
    shapes: dict[str, tuple] = {}  # tensor -> the variable parts of its subscripts
    accumulators: list[Accumulator] = []
    targets = []
    written, read = set(), set()
    for run in runs:
        run, lanes = run if isinstance(run, tuple) else (run, None)
        statement = kernel.statement(run.statement)
        if statement.kind != "reduce" or statement.scatter or \
                any(p.ref == -1 for p in run.promoted):  # a scatter's element moves
            return None  # (reads of a packed operand are fine: see polyhedral/packing.py)
        values = dict(zip(statement.indices, run.indices))
        subscripts = tuple(values[name] for name in statement.lhs)
        width = 1
        if lanes is not None:  # a vector update: from its first lane's element on
            subscripts = tuple(L.substitute(e, {lanes.var: lanes.lo}) for e in subscripts)
            width = len(range(lanes.lo.value, lanes.hi.value, lanes.step))
        forms = []
        for sub in subscripts:
            form = affine_form(sub)
            if form is None or any(v in inner_vars for v, _ in form[0]):
                return None  # the element moves inside the loop, or is not affine
            forms.append(form)
        shape = tuple(f[0] for f in forms)
        if shapes.setdefault(statement.target, shape) != shape:
            return None  # two elements whose difference is not a constant
        key = (statement.target, tuple(f[1] for f in forms), width)
        if key not in keys:
            keys[key] = len(accumulators)
            accumulators.append(Accumulator(statement.target, subscripts, width))
        targets.append(keys[key])
        written.add(statement.target)
        read.update(r.tensor for r in reads_of(statement.value))
    if written & read or sum(a.lanes for a in accumulators) > MAX_ACCUMULATORS \
            or _overlapping(keys):
        return None
    return Promotion(tuple(accumulators), tuple(targets),
                     all(_contiguous_along(run if isinstance(run, L.Run) else run[0],
                                           kernel, loop.var) for run in runs))


def _overlapping(keys: dict[tuple, int]) -> bool:
    """Whether two accumulators of different keys share an element: a vector of lanes
    and another vector or scalar of the same row (keys: tensor, constant parts, lanes)."""
    rows: dict[tuple, list[tuple[int, int]]] = {}
    for tensor, constants, lanes in keys:
        if not constants:
            continue  # a scalar: one element, one key
        rows.setdefault((tensor, constants[:-1]), []).append((constants[-1], lanes))
    for spans in rows.values():
        spans.sort()
        if any(a + width > b for (a, width), (b, _) in zip(spans, spans[1:])):
            return True
    return False


def innermost_and_contiguous(loop: L.For, kernel: L.Kernel) -> bool:
    """A loop nested in a promoted one, with no loop inside it, along which every update's
    reads are contiguous or invariant: the loop vectorizer can split its accumulators into
    lanes (a weight gradient's sum over n, h, w with w innermost)."""
    runs: list[L.Run] = []
    if not _collect(loop.body, runs, set()) or not runs:
        return False
    if any(isinstance(n, L.For) for n in L.walk_nodes(loop.body)):
        return False
    return all(_contiguous_along(run, kernel, loop.var) for run in runs)


def runs_in(node: L.Node) -> list[L.Run]:
    """The updates under `node` (in loops and branches)."""
    return [n for n in L.walk_nodes(node) if isinstance(n, L.Run)]


def single_inner_loop(loop: L.For) -> L.For | None:
    """The one innermost loop under `loop` holding every update, reached through loops
    and blocks only; `loop` itself when it has no loop inside; None otherwise."""
    node = loop
    while True:
        fors = [n for n in _children(node.body) if _is_loop(n)]
        others = [n for n in _children(node.body) if not _is_loop(n)]
        if not fors:
            return node
        if len(fors) != 1 or any(runs_in(o) for o in others):
            return None
        node = fors[0]


def _is_loop(node: L.Node) -> bool:
    """A loop that runs as one: not the vector lanes of a register tile's row."""
    return isinstance(node, L.For) and not node.unrolled


def children_of(body: L.Node) -> list[L.Node]:
    """The nodes of a loop body, nested blocks flattened."""
    out = []
    for node in _children(body):
        out += children_of(node) if isinstance(node, L.Block) else [node]
    return out


def _children(body: L.Node) -> list[L.Node]:
    return list(body.body) if isinstance(body, L.Block) else [body]


def _contiguous_along(run: L.Run, kernel: L.Kernel, var: str) -> bool:
    """Whether every read of `run` moves along `var` only in its last subscript, by one
    element (row-major: consecutive), or not at all. A packed operand is never: packing
    serves outer-product tiles, and its buffer may be lanes-first."""
    if run.promoted:
        return False
    statement = kernel.statement(run.statement)
    steps = {}
    for name, value in zip(statement.indices, run.indices):
        form = affine_form(value)
        if form is None:
            return False
        steps[L.index_var(name).name] = dict(form[0]).get(var, 0)
    for read in reads_of(statement.value):
        for k, subscript in enumerate(read.affine):
            step = None if subscript is None else index_step(subscript, steps)
            if step is None or step != 0 and (k != len(read.affine) - 1 or step != 1):
                return False
    return True


def index_step(e: L.IExpr, steps: dict[str, int]) -> int | None:
    """How far `e` moves when each variable moves by its step; None when that is not one
    number (a floor division or modulo of something that moves)."""
    terms: dict[str, int] = {}
    others: dict[L.IExpr, int] = {}
    _accumulate(e, 1, terms, others)
    if any(steps.get(v, 0) for other in others for v in L.variables(other)):
        return None
    return sum(c * steps.get(v, 0) for v, c in terms.items())


def _collect(node: L.Node, runs: list, inner_vars: set) -> bool:
    """Gather the updates under `node` (and the loop variables bound there); False when
    the region holds something that cannot carry values (a parallel loop, a GPU node)."""
    match node:
        case L.Block(body=items):
            return all(_collect(i, runs, inner_vars) for i in items)
        case L.If(then=t, other=o):
            return _collect(t, runs, inner_vars) and (o is None or _collect(o, runs, inner_vars))
        case L.For(unrolled=True):  # vector lanes (see lanes.py): one update per run
            found: list = []
            if not _collect(node.body, found, inner_vars):
                return False
            runs.extend((run, node) for run in found)
            return True
        case L.For(var=v, body=body, parallel=False):
            inner_vars.add(v)
            return _collect(body, runs, inner_vars)
        case L.Scratch(body=body):  # per-iteration temporaries (polyhedral/contraction.py)
            return _collect(body, runs, inner_vars)
        case L.Run():
            runs.append(node)
            return True
    return False


def affine_form(e: L.IExpr) -> tuple[tuple[tuple[str, int], ...], int] | None:
    """`e` as (sorted (variable, coefficient) pairs, constant), or None if not affine."""
    terms: dict[str, int] = {}
    constant = _accumulate(e, 1, terms)
    if constant is None:
        return None
    return tuple(sorted((v, c) for v, c in terms.items() if c)), constant


def _accumulate(e: L.IExpr, scale: int, terms: dict[str, int],
                others: dict[L.IExpr, int] | None = None) -> int | None:
    """Add `scale * e`'s variable terms to `terms` and return its constant; None when a
    part of it is not affine, unless `others` collects such parts (then they count 0)."""
    match e:
        case L.Int(value=v):
            return scale * v
        case L.Var(name=n):
            terms[n] = terms.get(n, 0) + scale
            return 0
        case L.Op(op="add", args=(a, b)):
            x, y = _accumulate(a, scale, terms, others), _accumulate(b, scale, terms, others)
            return None if x is None or y is None else x + y
        case L.Op(op="sub", args=(a, b)):
            x, y = _accumulate(a, scale, terms, others), _accumulate(b, -scale, terms, others)
            return None if x is None or y is None else x + y
        case L.Op(op="neg", args=(a,)):
            return _accumulate(a, -scale, terms, others)
        case L.Op(op="mul", args=(L.Int(value=k), a)) | L.Op(op="mul", args=(a, L.Int(value=k))):
            return _accumulate(a, scale * k, terms, others)
    if others is None:
        return None
    others[e] = others.get(e, 0) + scale
    return 0
