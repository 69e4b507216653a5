"""The loops of scatters (tclang/lang/scatters.py), which isl schedules as single points.

In the scop a scatter is one instance that reads and writes the whole of each tensor it
touches (polyhedral/scop.py): any of its updates may land on any element of its target,
so every statement before it that writes what it reads or updates, and every statement
after it that reads its target, is ordered around all of it. Here that one instance becomes
its loop nest over the scatter's index ranges, in the statement's index order.

The loops are sequential: colliding updates then happen one at a time, in the same order
on every run and every backend, so a scatter is deterministic whatever
`Options(reorder_reductions=...)` says (a GPU kernel runs the nest in the thread that runs
the instance). Each update's subscripts are checked against the target's extents first.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Mapping

from polyhedral import loop_ir as L
from polyhedral.subscripts import lower_value, size_index
from tclang.lang import program as P


def scatter_def(sid: str, s: P.Statement, sizes: Mapping[str, int] | None,
                dtype) -> L.StatementDef:
    """The loop IR's statement of scatter `s`: an update at the point its subscripts name."""
    return L.StatementDef(sid, s.target, s.reduction_indices, (), "reduce", s.op,
                          lower_value(s.rhs, sizes), s.text, s.span.line,
                          scatter=tuple(lower_value(e, sizes) for e in s.scatter))


def expand_scatters(node: L.Node, statements: Mapping[str, P.Statement],
                    sizes: Mapping[str, int] | None) -> L.Node:
    """`node` with each run of a scatter (ids in `statements`) replaced by its loop nest."""
    match node:
        case L.Run(statement=sid) if sid in statements:
            return _nest(sid, statements[sid], sizes)
        case L.For(body=b) | L.Launch(body=b) | L.Scratch(body=b):
            return replace(node, body=expand_scatters(b, statements, sizes))
        case L.If(then=t, other=o):
            return replace(node, then=expand_scatters(t, statements, sizes),
                           other=None if o is None else expand_scatters(o, statements, sizes))
        case L.Block(body=items):
            return L.Block(tuple(expand_scatters(i, statements, sizes) for i in items))
    return node


def _nest(sid: str, s: P.Statement, sizes: Mapping[str, int] | None) -> L.Node:
    names = [f"{sid.lower()}_{k}" for k in range(len(s.reduction_indices))]
    node: L.Node = L.Run(sid, tuple(L.Var(n) for n in names))
    for name, index in reversed(list(zip(names, s.reduction_indices))):
        r = s.range_of(index)
        node = L.For(name, size_index(r.lo, sizes), size_index(r.hi, sizes), 1, node)
    return node
