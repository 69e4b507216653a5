"""A register tile's unrolled loops (`For.unrolled`): which stay loops whose iterations
become the lanes of vector operations, and the straight-line copies of the rest.

The loop IR keeps a register tile's points as loops of constant bounds (an 8 x 32 tile is
two loops, not 256 statements). Before emitting a kernel the backend expands every such
loop into one copy of its body per iteration, except an innermost one whose iterations
carry no dependence (`vectorize`) and whose statements each write consecutive elements of
a row along it and read every operand either at one element (broadcast to the lanes) or
at consecutive ones: that loop stays, and each of its statements is emitted once, on
vectors of `trip count` lanes (see kernel_module.FunctionBuilder.lane_loop). Running all
lanes of one statement before the next one's is the same as the loop's order because its
iterations carry no dependence. LLVM gets a few vector operations per row of the tile
instead of hundreds of scalar statements for its SLP vectorizer to put back together.
"""

from __future__ import annotations

from dataclasses import replace

from backends.llvm.accumulators import affine_form, index_step
from polyhedral import loop_ir as L
from tclang.lang import program as P
from tclang.dtypes import DType

#: the element types whose statements become vector operations
VECTOR_DTYPES = (DType.FLOAT32, DType.FLOAT64)
#: builtins with a vector form (LLVM intrinsics on vectors)
VECTOR_CALLS = {"fmin": "minnum", "fmax": "maxnum", "min": "minnum", "max": "maxnum"}

Strides = dict[str, tuple[int | None, ...] | None]


def expand_unrolled(kernel: L.Kernel, vectors: bool) -> L.Node:
    """The kernel's body with each `unrolled` loop replaced by its iterations, but for the
    vector-lane loops (`vectors`: the kernel may have them), which stay as they are."""
    strides: Strides = {b.name: b.strides for b in kernel.buffers}
    return _expand(kernel.body, kernel, strides if vectors else None)


def _expand(node: L.Node, kernel: L.Kernel, strides: Strides | None) -> L.Node:
    match node:
        case L.Block(body=items):
            return L.Block(tuple(_expand(i, kernel, strides) for i in items))
        case L.If(cond=c, then=t, other=o):
            return L.If(c, _expand(t, kernel, strides),
                        _expand(o, kernel, strides) if o is not None else None)
        case L.Scratch(buffers=buffers, body=body):
            inner = None if strides is None else \
                {**strides, **{b.name: scratch_strides(b) for b in buffers}}
            return replace(node, body=_expand(body, kernel, inner))
        case L.For(unrolled=True, var=v, lo=L.Int(value=lo), hi=L.Int(value=hi), step=step):
            if strides is not None and is_lane_loop(node, kernel, strides):
                return _power_of_two_pieces(node)
            body = _expand(node.body, kernel, strides)
            return _copies(body, v, range(lo, hi, step))
        case L.For(body=body):
            return replace(node, body=_expand(body, kernel, strides))
    return node


def _copies(body: L.Node, var: str, values) -> L.Node:
    return L.Block(tuple(L.substitute_node(body, {var: L.Int(x)}) for x in values))


def _power_of_two_pieces(loop: L.For) -> L.Node:
    """The lane loop as consecutive lane loops of 2^k lanes each, widest first (24 lanes:
    16 and 8), a last single lane as a plain copy: LLVM splits a vector of 2^k lanes into
    whole registers, but legalizes one of 24 by widening to 32 lanes, which made the
    loads and stores of a 3x3 convolution's partial tiles element by element (3x slower)."""
    start, end = loop.lo.value, loop.hi.value
    if (end - start) & (end - start - 1) == 0:
        return loop
    pieces = []
    while start < end:
        width = 1 << ((end - start).bit_length() - 1)
        if width == 1:
            pieces.append(_copies(loop.body, loop.var, [start]))
        else:
            pieces.append(replace(loop, lo=L.Int(start), hi=L.Int(start + width)))
        start += width
    return L.Block(tuple(pieces))


def scratch_strides(buffer: L.Buffer) -> tuple[int, ...]:
    """A scratch buffer's strides in elements: its own (lanes-first), else row-major."""
    if buffer.strides:
        return tuple(buffer.strides)
    strides, step = [], 1
    for extent in reversed(buffer.shape):
        strides.append(step)
        step *= max(L.evaluate(extent, {}), 1)
    return tuple(reversed(strides))


def lanes(loop: L.For) -> int:
    """The vector width of a lane loop: its trip count."""
    return len(range(loop.lo.value, loop.hi.value, loop.step))


def is_lane_loop(loop: L.For, kernel: L.Kernel, strides: Strides) -> bool:
    """Whether the unrolled `loop` becomes vector operations (see the module docstring)."""
    if not (loop.vectorize and loop.step == 1 and isinstance(loop.lo, L.Int)
            and isinstance(loop.hi, L.Int) and lanes(loop) >= 2):
        return False
    runs = []
    if not _straight(loop.body, loop.var, runs) or not runs:
        return False
    return all(_vector_run(run, kernel, loop.var, strides) for run in runs)


def _straight(node: L.Node, var: str, runs: list) -> bool:
    """Runs under blocks and conditions that do not depend on `var`, nothing else."""
    match node:
        case L.Block(body=items):
            return all(_straight(i, var, runs) for i in items)
        case L.If(cond=c, then=t, other=o):
            return not L.uses_var(c, var) and _straight(t, var, runs) and \
                (o is None or _straight(o, var, runs))
        case L.Run():
            runs.append(node)
            return True
    return False


def _vector_run(run: L.Run, kernel: L.Kernel, var: str, strides: Strides) -> bool:
    s = kernel.statement(run.statement)
    target = kernel.buffer(s.target)
    if target.dtype not in VECTOR_DTYPES or (s.kind == "reduce" and s.op not in "+*"):
        return False
    steps = index_steps(run, s, var)
    if steps is None or not _vector_value(s.value, target.dtype):
        return False
    # the target: consecutive elements of one row
    if any(steps[name] for name in s.lhs[:-1]) or steps[s.lhs[-1]] != 1:
        return False
    known = strides.get(s.target)
    if not known or known[-1] != 1:
        return False
    if any(L.uses_var(o, var) for p in run.promoted for o in p.offset):
        return False
    promoted = {p.ref: p.buffer for p in run.promoted}
    return all(read_step(read, steps, strides.get(promoted.get(read.ref, read.tensor)))
               in (0, 1) for read in P.reads_of(s.value))


def index_steps(run: L.Run, statement: L.StatementDef, var: str) -> dict[str, int] | None:
    """How much each of the statement's indices moves per iteration of `var`."""
    steps = {}
    for name, value in zip(statement.indices, run.indices):
        form = affine_form(value)
        if form is None:
            return None
        steps[name] = dict(form[0]).get(var, 0)
    return steps


def read_step(read: P.Read, steps: dict[str, int], strides) -> int | None:
    """Elements the address of `read` moves per lane (None: not a constant, or unknown).
    `steps`: per statement index; `strides`: of the buffer it reads (a packed copy's where
    it is promoted)."""
    if read.guard is not None:
        return None
    var_steps = {L.index_var(name).name: step for name, step in steps.items()}
    total = 0
    for k, subscript in enumerate(read.affine):
        step = None if subscript is None else index_step(subscript, var_steps)
        if step is None:
            return None  # a gather, or a floor division or modulo of a moving index
        if step:
            if not strides or strides[k] is None:
                return None
            total += step * strides[k]
    return total


def _vector_value(e: P.Expr, dtype: DType) -> bool:
    """Whether every operation of `e` has a vector form of `dtype` lanes (a read's
    subscripts are computed once, for the first lane, and moved by `read_step`)."""
    match e:
        case P.Let(value=value, body=body):
            return _vector_value(value, dtype) and _vector_value(body, dtype)
        case P.Const() | P.Local() | P.Read(guard=None):
            return e.dtype is dtype
        case P.Unary(op="neg", operand=x):
            return e.dtype is dtype and _vector_value(x, dtype)
        case P.Binary(op="add" | "sub" | "mul" | "div", lhs=a, rhs=c):
            return e.dtype is dtype and _vector_value(a, dtype) and _vector_value(c, dtype)
        case P.Call(name=name, args=args) if name in VECTOR_CALLS:
            return e.dtype is dtype and all(_vector_value(a, dtype) for a in args)
    return False
