"""float16 and bfloat16 sums and products accumulate in float32 and round to half
(bfloat16) once per element.

A half tensor is stored as half, so a reduction that updates it in place rounds after every
term: 100,000 additions of 0.01 stall at 32 (32 + 0.01 rounds back to 32), and the result
depends on the schedule. Before scheduling, each `+`/`*` reduction into a float16 tensor T
is rewritten to reduce into a float32 temporary instead, followed by one rounding:

    T(i) +=! e          ->   T_f32(i) +=! float(e);   T(i) = half(T_f32(i))
    T(i) +=  e          ->   T_f32(i) = float(T(i));  T_f32(i) += float(e);  T(i) = half(T_f32(i))

Done on the checked definition, it holds for every backend and every schedule (register
accumulators, GPU block reductions and tiling all see a float32 reduction), and fusion can
keep the rounding next to its reduction. min and max are exact in any type and are left
alone. The new statements keep the original's text and span, so errors still name it.
bfloat16 tensors are rewritten the same way (with `bfloat16(...)` for `half(...)`).
"""

from __future__ import annotations

from dataclasses import replace

from tclang.lang import program as P
from tclang.lang.affine import Affine
from tclang.dtypes import DType

WIDENED_OPS = ("+", "*")


def widen_half_reductions(defn: P.Definition) -> P.Definition:
    """`defn` with every float16 and bfloat16 sum and product accumulated in a float32
    temporary."""
    if not any(_widens(defn, s) for s in defn.statements):
        return defn
    taken = set(defn.tensors) | set(defn.sizes)
    temporaries, statements = list(defn.temporaries), []
    for s in defn.statements:
        if not _widens(defn, s):
            statements.append(s)
            continue
        target = defn.tensor(s.target)
        acc = _fresh_name(f"{s.target}_f32", taken)
        taken.add(acc)
        temporaries.append(P.Tensor(acc, DType.FLOAT32, target.shape, "temporary",
                                    target.span))
        statements += _widened(s, acc, target.dtype)
    numbered = tuple(replace(s, position=k) for k, s in enumerate(statements))
    return replace(defn, temporaries=tuple(temporaries), statements=numbered)


def _widens(defn: P.Definition, s: P.Statement) -> bool:
    """A half sum or product, but not a scatter's: its updates land on elements named by
    data, so the accumulator would have to cover the whole target (a copy before, a
    rounding after); the rewrite below writes both at the statement's own point, which a
    scatter does not have (isl refused the result: "incompatible spaces"; fuzz seed 2030,
    program 724). A half scatter-add rounds after every update, as a half `+=` did before
    this module, and says so in docs/language.md."""
    return s.op in WIDENED_OPS and defn.tensor(s.target).dtype.is_narrow_float and \
        not s.is_scatter


def _fresh_name(base: str, taken: set[str]) -> str:
    name, k = base, 1
    while name in taken:
        name, k = f"{base}_{k}", k + 1
    return name


def _widened(s: P.Statement, acc: str, narrow: DType) -> list[P.Statement]:
    """The statements replacing reduction `s` of half (`narrow`: float16 or bfloat16)
    tensor s.target, accumulating in acc."""
    lhs_domain = tuple(r for r in s.domain if r.name in s.indices)

    def assign(target: str, rhs: P.Expr) -> P.Statement:
        return replace(s, target=target, op="=", reset=False, rhs=rhs, reduction_indices=(),
                       domain=lhs_domain, exists=())

    # a reduction without reduction indices may read its target at the same point: it
    # then reads the accumulator, which holds exactly that half value (identity or start)
    rhs = _map_reads(s.rhs, lambda r: P.Cast(replace(r, tensor=acc, dtype=DType.FLOAT32),
                                             narrow) if r.tensor == s.target else r)
    reduce = replace(s, target=acc, rhs=P.Cast(rhs, DType.FLOAT32))
    start = [] if s.reset else \
        [assign(acc, P.Cast(_same_point(s, s.target, narrow), DType.FLOAT32))]
    return start + [reduce, assign(s.target, P.Cast(_same_point(s, acc, DType.FLOAT32),
                                                    narrow))]


def _same_point(s: P.Statement, tensor: str, dtype: DType) -> P.Read:
    """`tensor(i...)` at the left-side indices of `s`."""
    return P.Read(tensor, tuple(P.IndexValue(i) for i in s.indices),
                  tuple(Affine.index(i) for i in s.indices), None, 0, dtype, s.span)


def _map_reads(e: P.Expr, fn) -> P.Expr:
    """`e` with each tensor read r (subscripts included) replaced by fn(r)."""
    match e:
        case P.Read(subscripts=subs):
            return fn(replace(e, subscripts=tuple(_map_reads(x, fn) for x in subs)))
        case P.Unary(operand=x) | P.Cast(operand=x):
            return replace(e, operand=_map_reads(x, fn))
        case P.Binary(lhs=a, rhs=b) | P.Compare(lhs=a, rhs=b):
            return replace(e, lhs=_map_reads(a, fn), rhs=_map_reads(b, fn))
        case P.Select(cond=c, then=t, other=o):
            return replace(e, cond=_map_reads(c, fn), then=_map_reads(t, fn),
                           other=_map_reads(o, fn))
        case P.Call(args=args):
            return replace(e, args=tuple(_map_reads(a, fn) for a in args))
    return e
