"""What every pass on the checked program needs: rewriting typed expressions bottom-up,
renumbering a statement's reads after a rewrite (printing: tclang/lang/program_text.py),
and the check that a rewrite left every name where it means something (`check_names`).

Subscripts are never rewritten: a read's subscripts and their quasi-affine forms (`affine`)
say the same thing, and every later stage relies on that.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

from tclang.errors import TCCompileError
from tclang.lang import program as P
from tclang.lang.affine import condition_indices


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


# ---- names in scope --------------------------------------------------------------------------

def check_names(defn: P.Definition, after: str) -> P.Definition:
    """`defn`, if every name each statement uses is one it has; else a `TCCompileError`
    that says which rewrite (`after`) broke that.

    A rewrite that moves an expression to another statement (a sum's factor into the
    assignment after it, a value into a new temporary's statement) must move nothing that
    names an index the destination lacks: not in an `IndexValue`, a read's quasi-affine
    subscripts, or its guard (which is metadata, not a node of the tree, so a rewrite that
    walks the tree never sees it). isl would meet such a name as an unknown variable in
    the scop's text and report a syntax error that tells nobody anything (kronecker's
    second derivative: `B(s0 % 2, s1 % 3)` left a guarded sum with the guard `m == s0 / 2`
    on it). The same holds for a read of a tensor the definition lacks, a size it lacks
    and a `Local` no enclosing `Let` binds. Linear in the nodes; polyhedral/pipeline.py
    runs it after every rewrite with TCLANG_VERIFY=1 (the tests set it), and once on what
    the scop is built from.
    """
    tensors, sizes = defn.tensors, set(defn.sizes)
    for s in defn.statements:
        problem = _misnamed(s, tensors, sizes)
        if problem is not None:
            raise TCCompileError(
                f"{after} left statement {s.position} of {defn.name} ({s.text or s.target}) "
                f"with {problem}: a compiler bug, not an error in the program; "
                "Options(passes=False, reorder_reductions=False) compiles it as written "
                "(please report it with the definition)")
    return defn


def _misnamed(s: P.Statement, tensors, sizes: set[str]) -> str | None:
    """What in statement `s` names something `s` or its definition lacks, or None."""
    indices = set(s.all_indices)
    if s.target not in tensors:
        return f"a write of {s.target}, which the definition does not have"
    if {r.name for r in s.domain} != indices:
        return f"a domain over {sorted(r.name for r in s.domain)}, not its indices"
    if s.condition is not None and not condition_indices(s.condition) <= indices:
        return _lacking("its condition", condition_indices(s.condition) - indices)
    stack = [(e, frozenset()) for e in (s.rhs, *s.exists)]
    while stack:
        e, bound = stack.pop()
        t = type(e)
        if t is P.IndexValue and e.name not in indices:
            return _lacking("a value", {e.name})
        if t is P.SizeValue and e.name not in sizes:
            return f"the size {e.name}, which the definition does not have"
        if t is P.Local and e.name not in bound:
            return f"{e.name}, which no enclosing let binds"
        if t is P.Read:
            problem = _misnamed_read(e, tensors, indices)
            if problem is not None:
                return problem
        if t is P.Let:
            stack += [(e.value, bound), (e.body, bound | {e.name})]
        else:
            stack += [(c, bound) for c in P.children(e)]
    return None


def _misnamed_read(r: P.Read, tensors, indices: set[str]) -> str | None:
    if r.tensor not in tensors:
        return f"a read of {r.tensor}, which the definition does not have"
    for a in r.affine:
        if a is not None and not a.indices() <= indices:
            return _lacking(f"a subscript of {r.tensor}", a.indices() - indices)
    if r.guard is not None and not condition_indices(r.guard) <= indices:
        return _lacking(f"the guard of its read of {r.tensor}",
                        condition_indices(r.guard) - indices)
    return None


def _lacking(what: str, names) -> str:
    listed = ", ".join(sorted(names))
    which = "an index" if len(names) == 1 else "indices"
    return f"{what} naming {listed}, {which} the statement does not have"


def fresh_tensor_name(defn: P.Definition, base: str) -> str:
    """`base`, or `base1`, `base2`, ...: a name no tensor or size of `defn` has (a new
    temporary of a pass)."""
    taken = set(defn.tensors) | set(defn.sizes)
    name, k = base, 0
    while name in taken:
        k += 1
        name = f"{base}{k}"
    return name
