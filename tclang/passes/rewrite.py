"""What every pass on the checked program needs: rewriting typed expressions bottom-up,
renumbering a statement's reads after a rewrite, and printing a definition back as source
(for `tclang explain --stage passes` and the passes' notes).

Subscripts are never rewritten: a read's subscripts and their quasi-affine forms (`affine`)
say the same thing, and every later stage relies on that.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

from tclang import program as P
from tclang.dtypes import DType


def rewrite_bottom_up(e: P.Expr, f: Callable[[P.Expr], P.Expr]) -> P.Expr:
    """`e` with `f` applied to every node, children first (a read's subscripts excepted)."""
    if type(e) is P.Read:
        return f(e)
    new = tuple(rewrite_bottom_up(c, f) for c in P.children(e))
    return f(P.with_children(e, new))


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


# ---- printing ------------------------------------------------------------------------------

_INFIX = {"add": "+", "sub": "-", "mul": "*", "div": "/", "mod": "%", "and": "&&", "or": "||",
          "eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}
_TYPE_NAMES = {DType.FLOAT16: "half", DType.FLOAT32: "float", DType.FLOAT64: "double"}


def expression_text(e: P.Expr) -> str:
    """A typed expression in the language's notation (casts the checker made shown)."""
    match e:
        case P.Const(value=v, dtype=dt):
            if isinstance(v, bool):
                return str(v).lower()
            if dt.is_float:
                return repr(float(v))
            return str(v)
        case P.IndexValue(name=n) | P.SizeValue(name=n) | P.Local(name=n):
            return n
        case P.Read(tensor=t, subscripts=subs):
            return f"{t}({', '.join(expression_text(s) for s in subs)})" if subs else t
        case P.Unary(op="neg", operand=x):
            return f"-{_operand(x)}"
        case P.Unary(op="not", operand=x):
            return f"!{_operand(x)}"
        case P.Binary(op=op, lhs=a, rhs=b) | P.Compare(op=op, lhs=a, rhs=b):
            return f"{_operand(a)} {_INFIX[op]} {_operand(b)}"
        case P.Select(cond=c, then=t, other=o):
            return f"{_operand(c)} ? {_operand(t)} : {_operand(o)}"
        case P.Call(name=n, args=args):
            return f"{n}({', '.join(expression_text(a) for a in args)})"
        case P.Cast(operand=x, dtype=dt):
            return f"{_TYPE_NAMES.get(dt, dt.value)}({expression_text(x)})"
        case P.Let(name=n, value=v, body=b):
            return f"let {n} = {expression_text(v)} in {expression_text(b)}"
    raise ValueError(f"not a value expression: {e!r}")


def _operand(e: P.Expr) -> str:
    text = expression_text(e)
    return f"({text})" if type(e) in (P.Binary, P.Compare, P.Select, P.Let) else text


def statement_text(s: P.Statement) -> str:
    target = f"{s.target}({', '.join(s.indices)})" if s.indices else s.target
    op = "=" if s.op == "=" else f"{s.op}="
    return f"{target} {op}{'!' if s.reset else ''} {expression_text(s.rhs)}"


def definition_text(defn: P.Definition) -> str:
    """The definition as source: its signature, temporaries, and one statement a line."""
    lines = [defn.signature() + " {"]
    for t in defn.temporaries:
        dims = f"({', '.join(str(d) for d in t.shape)})" if t.shape else ""
        lines.append(f"    # temporary {_TYPE_NAMES.get(t.dtype, t.dtype.value)}{dims} {t.name}")
    lines += [f"    {statement_text(s)}" for s in defn.statements]
    return "\n".join(lines + ["}"])
