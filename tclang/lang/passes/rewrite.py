"""What every pass on the checked program needs: rewriting typed expressions bottom-up and
renumbering a statement's reads after a rewrite (printing: tclang/lang/program_text.py).

Subscripts are never rewritten: a read's subscripts and their quasi-affine forms (`affine`)
say the same thing, and every later stage relies on that.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

from tclang.lang import program as P



def rewrite_bottom_up(e: P.Expr, f: Callable[[P.Expr], P.Expr]) -> P.Expr:
    """`e` with `f` applied to every node, children first (a read's subscripts excepted)."""
    if type(e) is P.Read:
        return f(e)
    new = tuple(rewrite_bottom_up(c, f) for c in P.children(e))
    return f(P.with_children(e, new))


def postorder(roots):
    """Every node under `roots` (subscripts included), children before parents, without
    recursion: a statement may be a chain thousands of terms long, and a recursive
    generator costs its depth at every step."""
    for root in roots:
        stack = [(root, False)]
        while stack:
            e, expanded = stack.pop()
            if expanded:
                yield e
                continue
            stack.append((e, True))
            stack.extend((c, False) for c in reversed(P.children(e)))


def renumber_reads(e: P.Expr) -> P.Expr:
    """`e` with its reads' `ref` numbered 0, 1, ... in the order `reads_of` lists them."""
    counter = iter(range(1 << 40))

    def visit(x: P.Expr) -> P.Expr:
        if type(x) is P.Read:
            ref = next(counter)
            return replace(x, ref=ref, subscripts=tuple(visit(s) for s in x.subscripts))
        return P.with_children(x, tuple(visit(c) for c in P.children(x)))

    return visit(e)


def map_statements(defn: P.Definition, rhs_of: Callable[[P.Statement], P.Expr]) -> P.Definition:
    """`defn` with each statement's value replaced by `rhs_of(statement)` (its reads then
    renumbered); `defn` itself if no value changed."""
    statements, changed = [], False
    for s in defn.statements:
        rhs = rhs_of(s)
        if rhs != s.rhs:
            s = replace(s, rhs=renumber_reads(rhs))
            changed = True
        statements.append(s)
    return replace(defn, statements=tuple(statements)) if changed else defn
