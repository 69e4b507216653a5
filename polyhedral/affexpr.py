"""isl affine functions -> loop-IR index expressions, by substituting expressions for the
function's inputs (integer divisions included: `32*floor(m/32)` and the like)."""

from __future__ import annotations

from typing import Mapping, Sequence

import islpy as isl

from polyhedral import loop_ir as L
from polyhedral.isl_callbacks import pieces as pieces_of


def pw_aff_expr(pa: isl.PwAff, inputs: Sequence[L.IExpr],
                params: Mapping[str, L.IExpr]) -> L.IExpr:
    """A single-piece PwAff as an expression of `inputs` and parameters."""
    pieces = [aff for _, aff in pieces_of(pa)]
    if len(pieces) != 1:
        raise ValueError(f"expected one affine piece, got {len(pieces)}: {pa}")
    return aff_expr(pieces[0], inputs, params)


def aff_expr(aff: isl.Aff, inputs: Sequence[L.IExpr], params: Mapping[str, L.IExpr]) -> L.IExpr:
    numerator, denominator = _scaled(aff, inputs, params)
    if denominator == 1:
        return numerator
    return L.Op("floordiv", (numerator, L.Int(denominator)))


def _scaled(aff: isl.Aff, inputs, params) -> tuple[L.IExpr, int]:
    """(numerator, denominator) with the value equal to numerator / denominator."""
    den = aff.get_denominator_val().to_python()
    terms: list[L.IExpr] = []

    def scaled(kind: isl.dim_type, k: int) -> int:
        return aff.get_coefficient_val(kind, k).mul(
            isl.Val.int_from_si(aff.get_ctx(), den)).to_python()

    def add(c: int, term: L.IExpr) -> None:
        if c:
            terms.append(term if c == 1 else L.Op("mul", (L.Int(c), term)))

    for k in range(aff.dim(isl.dim_type.in_)):
        add(scaled(isl.dim_type.in_, k), inputs[k])
    for k in range(aff.dim(isl.dim_type.param)):
        name = aff.get_dim_name(isl.dim_type.param, k)
        add(scaled(isl.dim_type.param, k), params.get(name, L.Var(name)))
    for k in range(aff.dim(isl.dim_type.div)):
        c = scaled(isl.dim_type.div, k)
        if not c:
            continue  # a div may only use earlier divs: skip unused ones (and itself)
        inner, inner_den = _scaled(aff.get_div(k), inputs, params)
        add(c, inner if inner_den == 1 else L.Op("floordiv", (inner, L.Int(inner_den))))
    constant = aff.get_constant_val().mul(isl.Val.int_from_si(aff.get_ctx(), den)).to_python()
    if constant or not terms:
        terms.append(L.Int(constant))
    total = terms[0]
    for t in terms[1:]:
        total = L.add(total, t)
    return total, den
