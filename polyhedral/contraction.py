"""Contraction of temporaries: one slice per iteration of the loops that use it (CPU).

After row fusion (polyhedral/row_fusion.py) softmax's `m(n)` and `s(n)`, layernorm's
`mean(n)` and `var(n)` are written and read only inside one iteration of the row loop, at
the element of that row. An [N] array allocated on every call, written and read back
through memory, is then one value per iteration: the temporary becomes a `Scratch` buffer
of the same name inside the loop, with the row's dimension cut to 1 (a scalar, or a
per-row buffer for a temporary with more dimensions), and each of its accesses is promoted
to it (`Promotion`: element s becomes buffer[s - offset], the offset the row's subscript).
The LLVM backend puts scratch buffers on the stack of the function that runs the loop, so
each thread has its own, and a one-element one becomes a register (SROA).

A temporary is contracted when:
- it is not zero-filled (every element is written before it is read, see
  `lowering.zero_filled`), so a slice never needs its earlier contents;
- every access to it is inside one top-level loop (run once per call), affine, outside
  register tiles' unrolled loops;
- some of its dimensions are subscripted, by every access, by the same expression
  `loop + constant`, for the loops 0..j of those around every access (the top-level one
  first), each loop by one dimension: then every iteration of loops 0..j touches elements
  of its own, no value flows from one iteration to another through the temporary, and
  those dimensions are cut to 1, the slice declared in loop j's body (a pointwise chain's
  `t(n, d)` in one nest becomes a scalar, softmax's `s_term(n, d)`, whose `d` loops
  differ, one row);
- its remaining dimensions are constants, and a slice takes at most SLICE_BYTES.
The others are kept as kernel buffers, each with the reason (`TemporaryPlan.note`), which
`.loops` and `tclang explain` print.
"""

from __future__ import annotations

from dataclasses import replace

from polyhedral import loop_ir as L
from tclang.lang.program import reads_of

SLICE_BYTES = 16 * 1024  # a per-iteration slice on a thread's stack, at most


def contract_temporaries(kernel: L.Kernel) -> L.Kernel:
    """The kernel with each temporary that qualifies contracted (module docstring), and a
    plan for every temporary."""
    temporaries = [b for b in kernel.buffers if b.kind == "temporary"]
    if not temporaries:
        return kernel
    uses = _uses(kernel)
    plans, slices = [], {}
    scratch: dict[int, list[L.Buffer]] = {}  # id of a top-level loop -> its slices
    for buffer in temporaries:
        plan, offsets, loop = _plan(buffer, kernel, uses.get(buffer.name, []))
        plans.append(plan)
        if plan.contracted:
            slices[buffer.name] = offsets
            shape = tuple(L.Int(1) if o is not None else d
                          for d, o in zip(buffer.shape, offsets))
            scratch.setdefault(id(loop), []).append(
                replace(buffer, shape=shape, kind="scratch", strides=None))
    if not slices:
        return replace(kernel, temporaries=tuple(plans))
    body = _rewrite(kernel.body, kernel, slices, scratch)
    kept = tuple(b for b in kernel.buffers if b.name not in slices)
    return replace(kernel, buffers=kept, body=body, temporaries=tuple(plans))


def _uses(kernel: L.Kernel) -> dict[str, list]:
    """tensor -> [(run, enclosing loops outermost first, subscripts in loop variables or
    None where gathered)] for each of its accesses; a tensor a copy or launch touches
    gets a None entry (never contracted)."""
    found: dict[str, list] = {}

    def visit(node: L.Node, loops: tuple[L.For, ...]) -> None:
        match node:
            case L.For(body=body):
                visit(body, loops + (node,))
            case L.Block(body=items):
                for item in items:
                    visit(item, loops)
            case L.If(then=t, other=o):
                visit(t, loops)
                if o is not None:
                    visit(o, loops)
            case L.Scratch(body=body):
                visit(body, loops)
            case L.Run():
                for tensor, subscripts in _accesses(node, kernel.statement(node.statement)):
                    found.setdefault(tensor, []).append((node, loops, subscripts))
            case L.Copy(tensor=t) | L.Combine(dst=t):
                found.setdefault(t, []).append(None)
            case L.Launch():
                for b in kernel.buffers:
                    found.setdefault(b.name, []).append(None)
    visit(kernel.body, ())
    return found


def _accesses(run: L.Run, s: L.StatementDef):
    """(tensor, subscripts as expressions of the loops, None for a gathered one) of each
    access of one statement instance: its target, then each read."""
    values = {L.index_var(name).name: value for name, value in zip(s.indices, run.indices)}
    if s.scatter:  # any element (tclang/lang/scatters.py)
        yield s.target, (None,) * len(s.scatter)
    else:
        yield s.target, tuple(L.substitute(L.index_var(i), values) for i in s.lhs)
    for read in reads_of(s.value) + [r for e in s.scatter for r in reads_of(e)]:
        yield read.tensor, tuple(None if a is None else L.substitute(a, values)
                                 for a in read.affine)


def _plan(buffer: L.Buffer, kernel: L.Kernel, uses: list):
    """(TemporaryPlan, each dimension's offset expression where it is cut to 1 (else None),
    the loop node it is contracted in)."""
    def kept(note: str):
        return L.TemporaryPlan(buffer, False, note=note), None, None
    if buffer.name in kernel.zero_fill:
        return kept("it starts as zeros (some element is read before it is written)")
    if not uses:
        return kept("no statement uses it")
    if any(u is None for u in uses):
        return kept("a copy or a GPU launch uses it")
    if any(not loops for _, loops, _ in uses):
        return kept("a statement outside every loop uses it")
    if not _common_loops([loops for _, loops, _ in uses]):
        return kept("it is used in more than one loop nest")
    if any(loop.unrolled for _, loops, _ in uses for loop in loops):
        return kept("a register tile uses it")
    if any(None in subscripts for _, _, subscripts in uses):
        return kept("a gathered subscript reads it")
    common = _common_loops([loops for _, loops, _ in uses])
    offsets, depths = _contracted_dims(buffer, uses, common)
    if not depths:
        return kept(f"no dimension of it follows the loop {common[0].var} alone")
    loop = common[max(depths)]
    count = 1
    for extent, offset in zip(buffer.shape, offsets):
        if offset is None:
            if not isinstance(extent, L.Int):
                return kept("its slice's size is known only at run time")
            count *= max(extent.value, 1)
    if count * buffer.dtype.numpy.itemsize > SLICE_BYTES:
        return kept(f"a slice of it would take more than {SLICE_BYTES // 1024} KiB")
    shape = "".join("[1]" if o is not None else f"[{d.value}]"
                    for d, o in zip(buffer.shape, offsets))
    return L.TemporaryPlan(buffer, True, loop=loop.var, note=f"{buffer.name}{shape}"), \
        tuple(offsets), loop


def _common_loops(chains: list[tuple[L.For, ...]]) -> tuple[L.For, ...]:
    """The loops around every access (the same loop nodes), outermost first."""
    common = chains[0]
    for chain in chains[1:]:
        n = 0
        while n < min(len(common), len(chain)) and common[n] is chain[n]:
            n += 1
        common = common[:n]
    return common


def _contracted_dims(buffer: L.Buffer, uses: list, common: tuple[L.For, ...]):
    """(each dimension's offset where it is cut to 1, else None; the depths in `common` of
    the loops they follow). A dimension is cut where every access subscripts it by the same
    `loop + constant`, each loop of `common` at most once; only loops 0..j of `common`
    that all have such a dimension count (then every iteration of loops 0..j touches
    elements of its own, and the slice can live in loop j's body)."""
    depth_of = {loop.var: d for d, loop in enumerate(common)}
    follows: dict[int, int] = {}  # dimension -> depth
    for k in range(len(buffer.shape)):
        forms = {subscripts[k] for _, _, subscripts in uses}
        var = _loop_var(forms.pop()) if len(forms) == 1 else None
        if var in depth_of and depth_of[var] not in follows.values():
            follows[k] = depth_of[var]
    j = 0
    while j in follows.values():
        j += 1
    kept = {k: d for k, d in follows.items() if d < j}
    offsets = tuple(next(iter({subscripts[k] for _, _, subscripts in uses}))
                    if k in kept else None for k in range(len(buffer.shape)))
    return offsets, set(kept.values())


def _loop_var(e: L.IExpr) -> str | None:
    """The variable `e` is plus a constant (distinct in every iteration of its loop), or
    None."""
    match e:
        case L.Var(name=n):
            return n
        case L.Op(op="add" | "sub", args=(L.Var(name=n), L.Int())):
            return n
    return None


def _rewrite(node: L.Node, kernel: L.Kernel, slices: dict, scratch: dict) -> L.Node:
    """The loop tree with each contracted temporary's accesses promoted to its slice and
    its `Scratch` declared inside its loop."""
    match node:
        case L.For(body=body):
            rewritten = _rewrite(body, kernel, slices, scratch)
            if id(node) in scratch:
                rewritten = L.Scratch(tuple(scratch[id(node)]), rewritten)
            return replace(node, body=rewritten)
        case L.Block(body=items):
            return L.Block(tuple(_rewrite(i, kernel, slices, scratch) for i in items))
        case L.If(cond=c, then=t, other=o):
            return L.If(c, _rewrite(t, kernel, slices, scratch),
                        _rewrite(o, kernel, slices, scratch) if o is not None else None)
        case L.Scratch(body=body):
            return replace(node, body=_rewrite(body, kernel, slices, scratch))
        case L.Run():
            return _promote(node, kernel.statement(node.statement), slices)
    return node


def _promote(run: L.Run, s: L.StatementDef, slices: dict) -> L.Run:
    promoted = list(run.promoted)
    if s.target in slices:
        promoted.append(L.Promotion(-1, s.target, _offset(slices[s.target])))
    for read in reads_of(s.value):
        if read.tensor in slices:
            promoted.append(L.Promotion(read.ref, read.tensor, _offset(slices[read.tensor])))
    return replace(run, promoted=tuple(promoted)) if len(promoted) > len(run.promoted) else run


def _offset(offsets: tuple) -> tuple[L.IExpr, ...]:
    return tuple(L.Int(0) if o is None else o for o in offsets)
