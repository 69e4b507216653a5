"""Per-call bounds checks of shape-generic kernels: do these sizes make a read leave its
tensor? The sets of bad sizes were computed by isl when the kernel was compiled. isl
loads on the first check, not with this module: a disk-cache hit reads `BoundsCondition`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from tclang.errors import Span, TCArgumentError


@dataclass(frozen=True)
class BoundsCondition:
    """For shape-generic kernels: the sizes (isl text of a params set) that break a read."""

    bad_sizes: str
    message: str
    span: Span


def check_generic_bounds(conditions, sizes: Mapping[str, int], source: str) -> None:
    import islpy as isl

    for cond in conditions:
        bad = isl.Set(cond.bad_sizes)
        for k in range(bad.dim(isl.dim_type.param)):
            name = bad.get_dim_name(isl.dim_type.param, k)
            value = _param_value(name, sizes)
            bad = bad.fix_val(isl.dim_type.param, k, isl.Val.int_from_si(bad.get_ctx(), value))
        if not bad.is_empty():
            raise TCArgumentError(cond.message, cond.span, source,
                                  hint="the sizes of the arguments do not fit this read")


def _param_value(name: str, sizes: Mapping[str, int]) -> int:
    if name.startswith("p__"):  # a product of sizes (see polyhedral.scop)
        value = 1
        for part in name[3:].split("__"):
            value *= sizes[part]
        return value
    return sizes[name]
