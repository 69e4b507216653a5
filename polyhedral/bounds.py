"""Exact bounds checks of every affine read, guarded ones included, with isl.

For concrete sizes a read that can leave its tensor is an error before any code runs; the
message names the read, the element and the statement point. For shape-generic code the
check yields, per read, the set of sizes for which it would leave its tensor; the runtime
tests each new shape against them.
"""

from __future__ import annotations


import islpy as isl

from polyhedral import loop_ir as L
from polyhedral.bounds_runtime import BoundsCondition
from polyhedral.lowering import ast_expr
from polyhedral.scop import Scop, tensor_box
from polyhedral.subscripts import size_index
from tclang.errors import TCArgumentError


def _violations(scop: Scop):
    for (sid, ref), access in scop.ref_reads.items():
        st = scop.statement(sid)
        read = next(r for r in st.source.reads() if r.ref == ref)
        domain = scop.domain.extract_set(access.get_space().domain())
        box = tensor_box(scop, read.tensor)
        outside = isl.Set.universe(box.get_space()).subtract(box)
        bad = access.intersect_domain(domain).intersect_range(outside)
        if not bad.is_empty():
            yield st, read, bad


def check_bounds(scop: Scop) -> None:
    """Raise `TCArgumentError` at the first read outside its tensor (specialized scops)."""
    for st, read, bad in _violations(scop):
        point = bad.wrap().sample_point()  # [instance -> element] as one point
        n_in = bad.dim(isl.dim_type.in_)
        values = [point.get_coordinate_val(isl.dim_type.set, k).to_python()
                  for k in range(n_in + bad.dim(isl.dim_type.out))]
        element = values[n_in:]
        where = ", ".join(f"{name} = {v}" for name, v in zip(st.indices, values))
        shape = tuple(e.evaluate(scop.sizes) for e in scop.extents[read.tensor])
        raise TCArgumentError(
            f"for these sizes, {read.tensor} would be read out of bounds: element "
            f"{read.tensor}{tuple(element) if len(element) != 1 else f'({element[0]})'} "
            f"of a tensor of shape {shape}, at {where}",
            read.span, scop.definition.source,
            hint="the sizes of the arguments do not fit this read; check the shapes, or "
                 "guard the read with `cond ? read : 0`")


def bounds_conditions(scop: Scop) -> tuple[BoundsCondition, ...]:
    """For shape-generic scops: each read's out-of-bounds sizes, to test per call."""
    found = []
    derived = {name: size_index(e, None) for name, e in scop.derived.items()}
    for st, read, bad in _violations(scop):
        message = (f"for these sizes, {read.tensor} would be read out of bounds in "
                   f"`{st.source.text}`")
        sizes = bad.params()
        found.append(BoundsCondition(str(sizes), message, read.span,
                                     _predicate(sizes, derived)))
    return tuple(found)


def _predicate(sizes: isl.Set, derived: dict[str, L.IExpr]) -> L.IExpr | None:
    """The set of bad sizes as a test on the size values (isl's AST generator writes it),
    so that a call checks it without isl; None if isl cannot write it."""
    try:
        build = isl.AstBuild.from_context(isl.Set.universe(sizes.get_space()))
        return ast_expr(build.expr_from_set(sizes), derived)
    except (isl.Error, KeyError):
        return None
