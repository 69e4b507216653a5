"""Per-call bounds checks of shape-generic kernels: do these sizes make a read leave its
tensor? The sets of bad sizes were computed by isl when the kernel was compiled, and
written by isl's AST generator as a test on the sizes (a loop-IR index expression), which
a call evaluates without isl. Only a condition isl could not write that way is checked
with isl, loaded then."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from polyhedral import loop_ir as L
from tclang.errors import Span, TCArgumentError


@dataclass(frozen=True)
class BoundsCondition:
    """For shape-generic kernels: the sizes (isl text of a params set) that break a read."""

    bad_sizes: str
    message: str
    span: Span
    predicate: L.IExpr | None = None  # nonzero for the bad sizes


def check_generic_bounds(conditions, sizes: Mapping[str, int], source: str) -> None:
    for cond in conditions:
        if _bad(cond, sizes):
            raise TCArgumentError(cond.message, cond.span, source,
                                  hint="the sizes of the arguments do not fit this read")


def _bad(cond: BoundsCondition, sizes: Mapping[str, int]) -> bool:
    if cond.predicate is not None:
        try:
            return bool(L.evaluate(cond.predicate, sizes))
        except KeyError:  # a name the sizes do not give: ask isl
            pass
    return _bad_by_isl(cond, sizes)


def _bad_by_isl(cond: BoundsCondition, sizes: Mapping[str, int]) -> bool:
    import islpy as isl

    bad = isl.Set(cond.bad_sizes)
    for k in range(bad.dim(isl.dim_type.param)):
        name = bad.get_dim_name(isl.dim_type.param, k)
        value = _param_value(name, sizes)
        bad = bad.fix_val(isl.dim_type.param, k, isl.Val.int_from_si(bad.get_ctx(), value))
    return not bad.is_empty()


def _param_value(name: str, sizes: Mapping[str, int]) -> int:
    if name.startswith("p__"):  # a product of sizes (see polyhedral.scop)
        value = 1
        for part in name[3:].split("__"):
            value *= sizes[part]
        return value
    return sizes[name]
