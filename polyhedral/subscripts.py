"""The checked program's symbolic forms as loop-IR index expressions: size expressions
(`tclang.lang.sizes`), quasi-affine subscripts (`tclang.lang.affine`) and the statement values that
hold them. After `lower_value` a statement's reads carry index expressions over its index
variables (`L.index_var`) and the sizes, so no `Affine` or `SizeExpr` reaches a backend.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Mapping

from polyhedral import loop_ir as L
from tclang.lang import affine as A
from tclang.lang import program as P
from tclang.lang import sizes as Z


def size_index(e: Z.SizeExpr, sizes: Mapping[str, int] | None) -> L.IExpr:
    """A size expression as an index expression (a number when `sizes` give every size
    it names; the sizes they give substituted in the others)."""
    if sizes is not None:
        if e.names() <= sizes.keys():
            return L.Int(e.evaluate(sizes))
        e = Z.substitute(e, sizes)
    match e:
        case Z.Poly(terms=terms):
            result: L.IExpr = L.Int(0)
            for monomial, coef in terms:
                term: L.IExpr = L.Int(coef)
                for name in monomial:
                    term = L.Var(name) if term == L.Int(1) else L.Op("mul", (term, L.Var(name)))
                result = term if result == L.Int(0) else L.add(result, term)
            return result
        case Z.FloorDiv(numerator=n, divisor=d):
            return L.Op("floordiv", (size_index(n, None), L.Int(d)))
        case Z.MinMax(kind=k, args=args):
            result = size_index(args[0], None)
            for a in args[1:]:
                result = L.Op(k, (result, size_index(a, None)))
            return result
        case Z.Sum(poly=poly, parts=parts):
            result = size_index(poly, None)
            for part, coef in parts:
                result = L.add(result, L.Op("mul", (L.Int(coef), size_index(part, None))))
            return result
    raise TypeError(e)


def affine_index(a: A.Affine, sizes: Mapping[str, int] | None) -> L.IExpr:
    """A quasi-affine subscript as an index expression of the statement's index variables:
    its offset, then each term in order (`coef * atom`), a floor division or modulo as
    "floordiv" or "floormod" by its constant divisor. A zero offset is left out."""
    total = size_index(a.offset, sizes)
    for atom, coef in a.terms:
        if isinstance(atom, str):
            term: L.IExpr = L.index_var(atom)
        else:
            op = "floordiv" if atom.kind == "div" else "floormod"
            term = L.Op(op, (affine_index(atom.inner, sizes), L.Int(atom.divisor)))
        if coef != 1:
            term = L.Op("mul", (L.Int(coef), term))
        total = term if total == L.Int(0) else L.Op("add", (total, term))
    return total


def lower_value(e: P.Expr, sizes: Mapping[str, int] | None) -> P.Expr:
    """A statement value with every read's subscript forms as index expressions (None for
    a data-dependent one) and its guard dropped (the domain and the branches around the
    read already hold it; backends evaluate a read only where its `?:` branch runs)."""
    new = tuple(lower_value(c, sizes) for c in P.children(e))
    e = P.with_children(e, new)
    if type(e) is P.Read:
        forms = tuple(None if a is None else affine_index(a, sizes) for a in e.affine)
        return replace(e, affine=forms, guard=None)
    return e
