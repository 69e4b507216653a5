"""Typed expressions printed back as source the front end accepts, with as few parentheses
and casts as the precedence and promotion rules allow: the backward definition is shown to
people (`tclang explain --grad`) and must read like what they would write.

Unlike tclang/lang/program_text.py (which shows every cast the checker made explicit, for the
compiler's stages), a cast of a literal is folded into the literal (`2.0`, not
`float(2)`), and an index may be printed as an expression of other indices
(`index_text`): what a scatter becomes when it is written as a gather.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from tclang.lang import program as P
from tclang.lang.affine import Affine, Div
from tclang.dtypes import DType
from tclang.lang.program_text import type_name

_INFIX = {"add": "+", "sub": "-", "mul": "*", "div": "/", "mod": "%", "and": "&&", "or": "||",
          "eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}
_LEVEL = {"or": 1, "and": 2, "eq": 3, "ne": 3, "lt": 3, "le": 3, "gt": 3, "ge": 3,
          "add": 4, "sub": 4, "mul": 5, "div": 5, "mod": 5}
_ATOM = 7


@dataclass(frozen=True)
class Raw:
    """Text that is already source (a guard on indices), at operator level `level`."""

    text: str
    level: int
    dtype: DType = DType.BOOL


def source(e: P.Expr, index_text: Mapping[str, tuple[str, int]] | None = None) -> str:
    """`e` as source; an index named in `index_text` is printed as that text (given with
    the precedence level of its outermost operator: 4 for a sum, 5 for a quotient)."""
    return _Printer(index_text or {}).text(e)[0]


def literal(value, dtype) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if dtype.is_float:
        text = repr(float(value))
        return text if text not in ("inf", "-inf", "nan") else f"({text})"
    return str(int(value))


class _Printer:
    def __init__(self, index_text: Mapping[str, str]):
        self.index_text = index_text

    def text(self, e: P.Expr) -> tuple[str, int]:
        """(text, precedence level of its outermost operator)."""
        match e:
            case Raw(text=t, level=level):
                return t, level
            case P.Const(value=v, dtype=d):
                t = literal(v, d)
                return t, (_ATOM if not t.startswith("-") else 6)
            case P.Cast(operand=P.Const(value=v), dtype=d) if not isinstance(v, bool):
                t = literal(v, d)
                return t, (_ATOM if not t.startswith("-") else 6)
            case P.IndexValue(name=n):
                return self.index_text.get(n, (n, _ATOM))
            case P.SizeValue(name=n) | P.Local(name=n):
                return n, _ATOM
            case P.Read(tensor=t, subscripts=subs):
                if not subs:
                    return t, _ATOM
                return f"{t}({', '.join(self.text(s)[0] for s in subs)})", _ATOM
            case P.Unary(op=op, operand=x):
                return ("-" if op == "neg" else "!") + self.wrap(x, 6), 6
            case P.Binary(op=op, lhs=a, rhs=b) | P.Compare(op=op, lhs=a, rhs=b):
                level = _LEVEL[op]
                left = self.wrap(a, level if op not in ("eq", "ne", "lt", "le", "gt", "ge")
                                 else level + 1)
                # the operators group to the left, so a right operand at the same level is
                # parenthesized even where the operator associates in exact arithmetic: in
                # floating point a * (b / c) is not a * b / c, nor a + (b + c) a + b + c,
                # and a recomputed expression (max=!'s tie count) must round as the
                # original did: the text parses back to the same tree
                return f"{left} {_INFIX[op]} {self.wrap(b, level + 1)}", level
            case P.Select(cond=c, then=t, other=o):
                return (f"{self.wrap(c, 1)} ? {self.wrap(t, 1)} : {self.text(o)[0]}"), 0
            case P.Call(name=n, args=args):
                return f"{n}({', '.join(self.text(a)[0] for a in args)})", _ATOM
            case P.Cast(operand=x, dtype=d):
                return f"{type_name(d)}({self.text(x)[0]})", _ATOM
        raise ValueError(f"cannot print {e!r}")

    def wrap(self, e: P.Expr, level: int) -> str:
        t, own = self.text(e)
        return t if own >= level else f"({t})"


def affine_level(a: Affine) -> int:
    """The precedence level of the text affine_text gives (see `source`)."""
    if len(a.terms) == 1 and a.offset.constant == 0:
        atom, coef = a.terms[0]
        if coef == 1:
            return 7 if isinstance(atom, str) else 5
        return 5 if coef > 0 else 4
    if not a.terms and a.offset.constant is not None and a.offset.constant >= 0:
        return 7
    return 4


def affine_text(a: Affine, paren: bool = False) -> str:
    parts: list[str] = []
    for atom, coef in sorted(a.terms, key=lambda t: t[1] < 0):
        text = atom if isinstance(atom, str) else div_text(atom)
        mag = abs(coef)
        term = text if mag == 1 else f"{mag} * {text}"
        if not parts:
            parts.append(term if coef > 0 else f"-{term}")
        else:
            parts.append(f"+ {term}" if coef > 0 else f"- {term}")
    offset = a.offset
    if offset.constant != 0 or not parts:
        text = str(offset)
        if not parts:
            parts.append(text)
        elif text.startswith("-"):
            parts.append(f"- {text[1:].lstrip()}" if offset.constant is not None
                         else f"+ ({text})")
        else:
            parts.append(f"+ {text}" if offset.constant is not None or
                         "+" not in text and "-" not in text else f"+ ({text})")
    out = " ".join(parts)
    if paren and (len(parts) > 1 or out.startswith("-")):
        return f"({out})"
    return out


def div_text(d: Div) -> str:
    op = "/" if d.kind == "div" else "%"
    return f"({affine_text(d.inner)}) {op} {d.divisor}" if len(d.inner.terms) + \
        (d.inner.offset.constant != 0) > 1 else f"{affine_text(d.inner)} {op} {d.divisor}"
