"""Typed expressions, statements and definitions printed back as text: in the language's
notation (`A(i, j)`, `float(x)`: `tclang explain --stage passes`, the passes' notes) or in
the loop IR's pseudo-C (`A[i][j]`, `float32(x)`: `.loops`, polyhedral/loop_format.py).
Casts the checker made explicit are shown."""

from __future__ import annotations

from tclang.lang import program as P
from tclang.dtypes import DType

_INFIX = {"add": "+", "sub": "-", "mul": "*", "div": "/", "mod": "%", "and": "&&", "or": "||",
          "eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}
_TYPE_NAMES = {DType.FLOAT16: "half", DType.BFLOAT16: "bfloat16", DType.FLOAT32: "float",
               DType.FLOAT64: "double"}


def type_name(dtype: DType) -> str:
    """The language's name of a type (float for float32, ...)."""
    return _TYPE_NAMES.get(dtype, dtype.value)


def expression_text(e: P.Expr, loops: bool = False) -> str:
    """`e` in the language's notation, or (`loops`) in the loop IR's pseudo-C."""
    def text(x: P.Expr) -> str:
        return expression_text(x, loops)

    def operand(x: P.Expr) -> str:
        return f"({text(x)})" if isinstance(x, (P.Binary, P.Compare, P.Let)) else text(x)

    match e:
        case P.Const(value=v):
            return str(v).lower() if isinstance(v, bool) else repr(v)
        case P.IndexValue(name=n) | P.SizeValue(name=n) | P.Local(name=n):
            return n
        case P.Read(tensor=t, subscripts=subs):
            if not subs:
                return t
            if loops:
                return f"{t}[{']['.join(text(s) for s in subs)}]"
            return f"{t}({', '.join(text(s) for s in subs)})"
        case P.Unary(op="neg", operand=x):
            return f"-{operand(x)}"
        case P.Unary(op="not", operand=x):
            return f"!{operand(x)}"
        case P.Binary(op=op, lhs=a, rhs=b) | P.Compare(op=op, lhs=a, rhs=b):
            return f"{operand(a)} {_INFIX[op]} {operand(b)}"
        case P.Select(cond=c, then=t, other=o):
            return f"({text(c)} ? {text(t)} : {text(o)})"
        case P.Call(name=n, args=args):
            return f"{n}({', '.join(text(a) for a in args)})"
        case P.Cast(operand=x, dtype=d):
            return f"{d.value if loops else type_name(d)}({text(x)})"
        case P.Let(name=n, value=v, body=b):
            return f"let {n} = {text(v)} in {text(b)}"
    raise ValueError(f"not a value expression: {e!r}")


def statement_text(s: P.Statement) -> str:
    target = f"{s.target}({', '.join(s.indices)})" if s.indices else s.target
    op = "=" if s.op == "=" else f"{s.op}="
    return f"{target} {op}{'!' if s.reset else ''} {expression_text(s.rhs)}"


def definition_text(defn: P.Definition) -> str:
    """The definition as source: its signature, temporaries, and one statement a line."""
    lines = [defn.signature() + " {"]
    for t in defn.temporaries:
        dims = f"({', '.join(str(d) for d in t.shape)})" if t.shape else ""
        lines.append(f"    # temporary {type_name(t.dtype)}{dims} {t.name}")
    lines += [f"    {statement_text(s)}" for s in defn.statements]
    return "\n".join(lines + ["}"])
