"""Hoisting of size-only expressions: `1.0 / D` computed once per call, not per point.

In a shape-generic kernel a float expression of sizes and constants alone that divides or
calls a function (`1.0 / float(D)`, `sqrt(float(N))`) is the same at every point of every
statement. It becomes a rank-0 temporary, assigned by a new first statement and read where
the expression was. Only float32 and float64 values move: storing them is exact, where an
int32 product of sizes would wrap in storage that the widened arithmetic (see
tclang/lang/wide_indices.py) never does. A specialized kernel needs none of this: its sizes are
constants and constant folding computes such expressions at compile time.
"""

from __future__ import annotations

from dataclasses import replace

from tclang.lang import program as P
from tclang.dtypes import DType
from tclang.lang.passes.rewrite import map_statements, postorder
from tclang.lang.program_text import expression_text

_MOVABLE = (DType.FLOAT32, DType.FLOAT64)


def hoist_size_expressions(defn: P.Definition, sizes=None):
    """`defn` with its costly size-only float expressions computed once (generic only:
    fully, or in the sizes `sizes` does not give, whose uses folding left)."""
    if (sizes is not None and set(defn.sizes) <= sizes.keys()) or not defn.statements:
        return defn, []
    hoisted: dict = {}  # expression -> its temporary's name
    taken = set(defn.tensors) | set(defn.sizes)
    kinds = _kinds(s.rhs for s in defn.statements)

    def hoist(e: P.Expr) -> P.Expr:
        size_only, costly = kinds[id(e)]
        if size_only and costly and e.dtype in _MOVABLE and \
                type(e) not in (P.Const, P.SizeValue):
            if e not in hoisted:
                name, k = "size_value", 0
                while f"{name}{k}" in taken:
                    k += 1
                hoisted[e] = f"{name}{k}"
                taken.add(f"{name}{k}")
            return P.Read(hoisted[e], (), (), None, 0, e.dtype, defn.statements[0].span)
        if type(e) is P.Read:
            return e
        return P.with_children(e, tuple(hoist(c) for c in P.children(e)))

    rewritten = map_statements(defn, lambda s: hoist(s.rhs))
    if not hoisted:
        return defn, []
    span = defn.statements[0].span
    new = [P.Statement(0, name, (), "=", False, e, (), (), (), span,
                       text=f"{name} = {expression_text(e)}")
           for e, name in hoisted.items()]
    temporaries = tuple(P.Tensor(name, e.dtype, (), "temporary", defn.span)
                        for e, name in hoisted.items())
    statements = tuple(replace(s, position=k)
                       for k, s in enumerate(new + list(rewritten.statements)))
    notes = [f"{expression_text(e)}: computed once, into {name}" for e, name in hoisted.items()]
    return replace(rewritten, statements=statements,
                   temporaries=rewritten.temporaries + temporaries), notes


def _kinds(roots) -> dict[int, tuple[bool, bool]]:
    """id(node) -> (a value of sizes and constants with a size in it, a division or a call
    in it), for every node, in one pass from the leaves up."""
    facts: dict[int, tuple[bool, bool, bool]] = {}  # (no read, index, ...; a size; costly)
    for e in postorder(roots):
        t = type(e)
        parts = [facts[id(c)] for c in P.children(e)]
        if t in (P.Read, P.IndexValue, P.Local, P.Let, P.Select):
            facts[id(e)] = (False, False, False)
        else:
            costly = t is P.Call or (t is P.Binary and e.op in ("div", "mod"))
            facts[id(e)] = (all(p[0] for p in parts),
                            t is P.SizeValue or any(p[1] for p in parts),
                            costly or any(p[2] for p in parts))
    return {k: (pure and size, costly) for k, (pure, size, costly) in facts.items()}
