"""Symbolic derivatives of typed expressions, built already simplified.

`derivative(e, is_leaf)` is the partial derivative of `e` with respect to the reads for
which `is_leaf` holds (one tensor element: the same tensor at the same subscripts), as a
typed `program.Expr`, or None where it is identically zero. The constructors fold the
zeros and ones the chain rule makes (`0 * x`, `1 * x`, `x + 0`) and push a product into a
`?:` whose other branch is zero, so a backward statement reads like one written by hand:
`(c ? dO(i) * W(k) : 0.0)`, not `dO(i) * ((c ? 1.0 : 0.0) * W(k) + 0.0 * ...)`.

At a kink the derivative is one-sided, by a fixed rule (docs/autodiff.md): `fmax(a, b)`,
`max`, `fmin`, `min` give the gradient to `a` when a == b; `abs(x)` and `fabs(x)` take the
right derivative (1) at 0. Functions whose derivative is zero almost everywhere or not
defined (floor, ceil, round, trunc, comparisons used as values, casts to integers) raise
`NotDifferentiable` when a differentiated value reaches them: silently returning zero would
hide a bug in a model, and PyTorch users expect an error from such a definition.
"""

from __future__ import annotations

import itertools
import math
from typing import Callable

from tclang.lang import program as P
from tclang.autodiff.source_text import Raw, source
from tclang.dtypes import DType, promote
from tclang.lang.guarded_sums import affine_condition


class NotDifferentiable(Exception):
    """`reason` says which operation of the expression has no usable derivative."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


# ---- typed constructors that simplify ----------------------------------------------------

def const(value: float, dtype: DType) -> P.Const:
    return P.Const(float(value) if dtype.is_float else value, dtype)


def _is_const(e: P.Expr | None, value: float) -> bool:
    return isinstance(e, P.Const) and not isinstance(e.value, bool) and e.value == value


def _joined(a: P.Expr, b: P.Expr) -> DType:
    return promote(a.dtype, b.dtype).compute


def _as(e: P.Expr, dtype: DType) -> P.Expr:
    if e.dtype is dtype:
        return e
    if isinstance(e, P.Const) and not isinstance(e.value, bool):
        return const(e.value, dtype)
    return P.Cast(e, dtype)


def add(a: P.Expr | None, b: P.Expr | None) -> P.Expr | None:
    if a is None or _is_const(a, 0):
        return b
    if b is None or _is_const(b, 0):
        return a
    if isinstance(b, P.Unary) and b.op == "neg":
        return sub(a, b.operand)
    if _same(a, b):  # x*y + x*y (the derivative of a square): 2 * (x*y)
        return mul(const(2, a.dtype.compute), a)
    t = _joined(a, b)
    return P.Binary("add", _as(a, t), _as(b, t), t)


def sub(a: P.Expr | None, b: P.Expr | None) -> P.Expr | None:
    if b is None or _is_const(b, 0):
        return a
    if a is None or _is_const(a, 0):
        return neg(b)
    t = _joined(a, b)
    return P.Binary("sub", _as(a, t), _as(b, t), t)


def neg(a: P.Expr | None) -> P.Expr | None:
    if a is None:
        return None
    if isinstance(a, P.Unary) and a.op == "neg":
        return a.operand
    if isinstance(a, P.Const) and not isinstance(a.value, bool):
        return const(-a.value, a.dtype)
    return P.Unary("neg", a, a.dtype)


def mul(a: P.Expr | None, b: P.Expr | None) -> P.Expr | None:
    if a is None or b is None or _is_const(a, 0) or _is_const(b, 0):
        return None
    if _is_const(a, 1):
        return _as(b, _joined(a, b))
    if _is_const(b, 1):
        return _as(a, _joined(a, b))
    if _is_const(a, -1):
        return neg(_as(b, _joined(a, b)))
    if _is_const(b, -1):
        return neg(_as(a, _joined(a, b)))
    # a product with a ?: whose other branch is zero: the product moves into the branch
    for x, y in ((a, b), (b, a)):
        if isinstance(x, P.Select) and _is_const(x.other, 0):
            return select(x.cond, mul(x.then, y), None, _joined(a, b))
        if isinstance(x, P.Select) and _is_const(x.then, 0):
            return select(x.cond, None, mul(x.other, y), _joined(a, b))
    for x, y in ((a, b), (b, a)):  # y * (1 / z): y / z
        if isinstance(x, P.Binary) and x.op == "div" and _is_const(x.lhs, 1):
            return div(y, x.rhs)
    if isinstance(a, P.Unary) and a.op == "neg":
        return neg(mul(a.operand, b))
    if isinstance(b, P.Unary) and b.op == "neg":
        return neg(mul(a, b.operand))
    t = _joined(a, b)
    return P.Binary("mul", _as(a, t), _as(b, t), t)


def div(a: P.Expr | None, b: P.Expr) -> P.Expr | None:
    if a is None or _is_const(a, 0):
        return None
    if _is_const(b, 1):
        return a
    if isinstance(a, P.Select) and _is_const(a.other, 0):
        return select(a.cond, div(a.then, b), None, _joined(a, b))
    t = _joined(a, b)
    return P.Binary("div", _as(a, t), _as(b, t), t)


def select(cond: P.Expr, then: P.Expr | None, other: P.Expr | None,
           dtype: DType) -> P.Expr | None:
    if then is None and other is None:
        return None
    then = then if then is not None else const(0, dtype)
    other = other if other is not None else const(0, dtype)
    t = _joined(then, other)
    # nested guards with zero elsewhere become one guard: (a ? (b ? x : 0) : 0) -> (a && b ? x : 0)
    if _is_const(other, 0) and isinstance(then, P.Select) and _is_const(then.other, 0) \
            and _affine_condition(cond) and _affine_condition(then.cond):
        return select(P.Binary("and", cond, then.cond, DType.BOOL), then.then, None, t)
    return P.Select(cond, _as(then, t), _as(other, t), t)


_SAME_NODES = 32  # larger terms are not compared: each `add` would print both sides


def _same(a: P.Expr, b: P.Expr) -> bool:
    """Structurally equal, reads compared by tensor and subscripts (not by position), for
    terms of up to _SAME_NODES nodes: the derivative of a square, `x*y + x*y`."""
    if type(a) is not type(b) or a.dtype is not b.dtype:
        return False
    sizes = [sum(1 for _ in itertools.islice(P.walk(x), _SAME_NODES + 1)) for x in (a, b)]
    return max(sizes) <= _SAME_NODES and source(a) == source(b)


def _affine_condition(e) -> bool:
    """Whether the language reads condition `e` as affine (guarded_sums.affine_condition,
    the typed program's reading of it). Only an affine condition guards the reads under
    it: `a && b` with `b` data (a read, or a float comparison like `2.0 > 0.0`) guards
    nothing, so a read that `a` kept in bounds would be out of bounds (fuzz seed 2036,
    program 418, second order)."""
    return isinstance(e, Raw) or affine_condition(e) is not None  # Raw: our own guards


def call(name: str, *args: P.Expr) -> P.Call:
    t = args[0].dtype.compute
    for a in args[1:]:
        t = promote(t, a.dtype).compute
    if not t.is_float:
        t = DType.FLOAT32
    return P.Call(name, tuple(_as(a, t) for a in args), t)


def compare(op: str, a: P.Expr, b: P.Expr) -> P.Compare:
    t = _joined(a, b)
    return P.Compare(op, _as(a, t), _as(b, t))


# ---- the chain rule ----------------------------------------------------------------------

_LN2, _LN10 = math.log(2.0), math.log(10.0)
_TWO_OVER_SQRT_PI = 2.0 / math.sqrt(math.pi)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
_SQRT_PI_OVER_2 = math.sqrt(math.pi) / 2.0
_SQRT_2PI = math.sqrt(2.0 * math.pi)
_STEPS = {"floor", "ceil", "round", "trunc", "logb", "nextafter"}
_SINGULAR = {"sqrt", "rsqrt", "cbrt", "rcbrt", "log", "log1p", "log2", "log10", "asin",
             "acos", "acosh", "atanh", "y0", "y1", "erfinv", "erfcinv", "normcdfinv"}
"""Functions whose derivative is infinite at a finite argument."""
_NO_DERIVATIVE_HERE = {"lgamma": "its derivative (digamma) is not a builtin",
                       "tgamma": "its derivative (digamma) is not a builtin",
                       "remainder": "it rounds half to even, which no builtin does"}


def derivative(e: P.Expr, is_leaf: Callable[[P.Read], bool]) -> P.Expr | None:
    """d e / d leaf, or None when `e` does not depend on the leaf (see the module doc)."""
    memo: dict[int, P.Expr | None] = {}

    def d(x: P.Expr) -> P.Expr | None:
        key = id(x)
        if key not in memo:
            memo[key] = _rule(x, d, is_leaf)
        return memo[key]

    return d(e)


def _rule(x: P.Expr, d, is_leaf) -> P.Expr | None:
    if isinstance(x, P.Read):
        return const(1, x.dtype.compute) if is_leaf(x) else None
    if isinstance(x, (P.Const, P.IndexValue, P.SizeValue, P.Local)):
        return None
    if isinstance(x, P.Unary):
        inner = d(x.operand)
        if isinstance(inner, _Flag) or (inner is not None and x.op == "not"):
            raise NotDifferentiable("`!` of a differentiated value")
        return neg(inner)
    if isinstance(x, P.Compare):
        if d(x.lhs) is not None or d(x.rhs) is not None:
            # a comparison only matters as a value (as a ?: condition it is never
            # differentiated: the branches are)
            return _Flag(x)
        return None
    if isinstance(x, P.Cast):
        inner = d(x.operand)
        if isinstance(inner, _Flag) or (inner is not None and not x.dtype.is_float):
            what = "a comparison" if isinstance(inner, _Flag) else "a value"
            raise NotDifferentiable(f"{what} converted to {x.dtype.value}: its derivative "
                                    "is zero wherever it exists")
        return None if inner is None else _as(inner, x.dtype.compute)
    if isinstance(x, P.Select):
        then, other = d(x.then), d(x.other)
        for branch in (then, other):
            if isinstance(branch, _Flag):
                raise NotDifferentiable("a comparison used as a value")
        return select(x.cond, then, other, x.dtype.compute)
    if isinstance(x, P.Binary):
        return _binary(x, d)
    if isinstance(x, P.Call):
        return _call(x, d)
    if isinstance(x, P.Let):
        raise NotDifferentiable("a let binding (differentiate before the passes)")
    raise NotDifferentiable(f"{type(x).__name__}")


class _Flag(P.Compare):
    """Marks a comparison of differentiated values, an error if it is used as a value."""

    def __init__(self, compare: P.Compare):
        object.__setattr__(self, "op", compare.op)
        object.__setattr__(self, "lhs", compare.lhs)
        object.__setattr__(self, "rhs", compare.rhs)
        object.__setattr__(self, "dtype", compare.dtype)


def _binary(x: P.Binary, d) -> P.Expr | None:
    da, db = d(x.lhs), d(x.rhs)
    if isinstance(da, _Flag) or isinstance(db, _Flag):
        raise NotDifferentiable(f"a comparison used as a value (`{x.op}`)")
    if da is None and db is None:
        return None
    if x.op in ("and", "or"):
        raise NotDifferentiable(f"`{'&&' if x.op == 'and' else '||'}` of differentiated values")
    if not x.dtype.is_float:
        raise NotDifferentiable(f"integer arithmetic ({x.op}) on a differentiated value")
    a, b = x.lhs, x.rhs
    if x.op == "add":
        return add(da, db)
    if x.op == "sub":
        return sub(da, db)
    if x.op == "mul":
        return add(mul(da, b), mul(a, db))
    if x.op == "div":
        # d(a/b) = da/b - a*db/(b*b)
        return sub(div(da, b), div(mul(a, db), mul(b, b)))
    if x.op == "mod":
        # a % b = a - b * floor(a / b): da - db * floor(a / b)
        return sub(da, mul(db, call("floor", div(a, b))))
    raise NotDifferentiable(f"the operator {x.op}")


def _call(x: P.Call, d) -> P.Expr | None:
    args = x.args
    ds = [d(a) for a in args]
    if any(isinstance(g, _Flag) for g in ds):
        raise NotDifferentiable(f"a comparison used as a value (in {x.name})")
    if all(g is None for g in ds):
        return None
    name = x.name
    if name in _STEPS:
        raise NotDifferentiable(f"{name}() of a differentiated value: its derivative is zero "
                                "wherever it exists")
    if name in _NO_DERIVATIVE_HERE:
        raise NotDifferentiable(f"{name}() of a differentiated value: "
                                f"{_NO_DERIVATIVE_HERE[name]}")
    t = x.dtype
    one = const(1, t)
    if len(args) == 1:
        a, da = args[0], ds[0]
        factor = _unary_factor(name, a, x, t, one)
        if factor is None:
            raise NotDifferentiable(f"{name}() has no derivative rule")
        product = mul(da, factor)
        if name in _SINGULAR and product is not None and not isinstance(da, P.Const):
            # f'(a) is infinite where f is singular (cbrt at 0); where the argument does
            # not move with the leaf there (da == 0: cbrt((i - 1) * B) at i = 1), f does
            # not either, and the product is 0, not 0 * inf = NaN (TF's multiply_no_nan)
            product = select(compare("eq", da, const(0, da.dtype.compute)), None, product, t)
        return product
    if name in ("fmax", "max", "fmin", "min"):
        a, b = args
        op = "ge" if name in ("fmax", "max") else "le"
        return select(compare(op, a, b), ds[0], ds[1], t)
    zero = const(0, t)
    if name == "pow":
        # as torch.pow: the base's part is 0 where b == 0 (b * a^(b-1) is 0 * inf at
        # a = 0), the exponent's is 0 where a == 0 and b >= 0 (log(0) * 0 otherwise)
        a, b = args
        base = mul(ds[0], mul(b, call("pow", a, sub(b, one))))
        if base is not None and not isinstance(b, P.Const):  # a constant b != 0 here
            base = select(compare("eq", b, zero), None, base, t)
        exponent = mul(ds[1], mul(call("log", a), x))  # None for a constant b
        if exponent is not None:
            at_zero = P.Binary("and", compare("eq", a, zero), compare("ge", b, zero),
                               DType.BOOL)
            exponent = select(at_zero, None, exponent, t)
        return add(base, exponent)
    if name == "atan2":  # atan2(y, x): (x dy - y dx) / (x^2 + y^2); 0 at the origin
        y, xx = args
        norm = add(mul(xx, xx), mul(y, y))
        return select(compare("eq", norm, zero), None,
                      div(sub(mul(xx, ds[0]), mul(y, ds[1])), norm), t)
    if name in ("hypot", "norm3d", "norm4d"):
        # (a da + b db + ...) / hypot: 0/0 at the origin, where the gradient is 0 (the
        # norm's subgradient, and the derivative wherever hypot's arguments stay 0)
        return select(compare("eq", x, zero), None, div(_dot(args, ds), x), t)
    if name in ("rhypot", "rnorm3d", "rnorm4d"):
        return neg(mul(_dot(args, ds), mul(x, mul(x, x))))
    if name == "fma":
        a, b, _ = args
        return add(add(mul(ds[0], b), mul(a, ds[1])), ds[2])
    if name == "fdivide":
        a, b = args
        return sub(div(ds[0], b), div(mul(a, ds[1]), mul(b, b)))
    if name == "copysign":  # |a| sign(b): da * sign(a) * sign(b); b's derivative is 0
        a, b = args
        return mul(ds[0], mul(call("copysign", one, a), call("copysign", one, b)))
    if name == "fdim":  # max(a - b, 0)
        a, b = args
        return select(compare("gt", a, b), sub(ds[0], ds[1]), None, t)
    if name == "fmod":  # a - b * trunc(a / b)
        a, b = args
        return sub(ds[0], mul(ds[1], call("trunc", div(a, b))))
    raise NotDifferentiable(f"{name}() has no derivative rule")


def _dot(args, ds):
    total = None
    for a, g in zip(args, ds):
        total = add(total, mul(a, g))
    return total


def _unary_factor(name: str, a: P.Expr, fx: P.Expr, t: DType, one: P.Expr) -> P.Expr | None:
    """f'(a) for a builtin of one argument (fx is f(a) itself, reused where it appears)."""
    c = lambda v: const(v, t)  # noqa: E731
    sq = mul(a, a)
    rules: dict[str, Callable[[], P.Expr]] = {
        "exp": lambda: fx,
        "expm1": lambda: call("exp", a),
        "exp2": lambda: mul(fx, c(_LN2)),
        "exp10": lambda: mul(fx, c(_LN10)),
        "log": lambda: div(one, a),
        "log1p": lambda: div(one, add(one, a)),
        "log2": lambda: div(one, mul(a, c(_LN2))),
        "log10": lambda: div(one, mul(a, c(_LN10))),
        "sqrt": lambda: div(c(0.5), fx),
        "rsqrt": lambda: mul(c(-0.5), div(fx, a)),
        "cbrt": lambda: div(one, mul(c(3), mul(fx, fx))),  # not f/(3a): 0/0 at 0
        "rcbrt": lambda: neg(div(fx, mul(c(3), a))),
        "sin": lambda: call("cos", a),
        "cos": lambda: neg(call("sin", a)),
        "tan": lambda: add(one, mul(fx, fx)),
        "sinpi": lambda: mul(c(math.pi), call("cospi", a)),
        "cospi": lambda: neg(mul(c(math.pi), call("sinpi", a))),
        "sinh": lambda: call("cosh", a),
        "cosh": lambda: call("sinh", a),
        "tanh": lambda: sub(one, mul(fx, fx)),
        "asin": lambda: call("rsqrt", sub(one, sq)),
        "acos": lambda: neg(call("rsqrt", sub(one, sq))),
        "atan": lambda: div(one, add(one, sq)),
        "asinh": lambda: call("rsqrt", add(sq, one)),
        "acosh": lambda: call("rsqrt", sub(sq, one)),
        "atanh": lambda: div(one, sub(one, sq)),
        "sigmoid": lambda: mul(fx, sub(one, fx)),
        "erf": lambda: mul(c(_TWO_OVER_SQRT_PI), call("exp", neg(sq))),
        "erfc": lambda: mul(c(-_TWO_OVER_SQRT_PI), call("exp", neg(sq))),
        "erfcx": lambda: sub(mul(c(2), mul(a, fx)), c(_TWO_OVER_SQRT_PI)),
        "erfinv": lambda: mul(c(_SQRT_PI_OVER_2), call("exp", mul(fx, fx))),
        "erfcinv": lambda: mul(c(-_SQRT_PI_OVER_2), call("exp", mul(fx, fx))),
        "normcdf": lambda: mul(c(_INV_SQRT_2PI), call("exp", mul(c(-0.5), sq))),
        "normcdfinv": lambda: mul(c(_SQRT_2PI), call("exp", mul(c(0.5), mul(fx, fx)))),
        "fabs": lambda: select(compare("ge", a, c(0)), one, c(-1), t),
        "abs": lambda: select(compare("ge", a, c(0)), one, c(-1), t),
        "j0": lambda: neg(call("j1", a)),
        # j1' = j0 - j1/x and i1' = i0 - i1/x: 0/0 at 0, where the limit is 1/2
        "j1": lambda: select(compare("eq", a, c(0)), c(0.5),
                             sub(call("j0", a), div(fx, a)), t),
        "y0": lambda: neg(call("y1", a)),
        "y1": lambda: sub(call("y0", a), div(fx, a)),
        "cyl_bessel_i0": lambda: call("cyl_bessel_i1", a),
        "cyl_bessel_i1": lambda: select(compare("eq", a, c(0)), c(0.5),
                                        sub(call("cyl_bessel_i0", a), div(fx, a)), t),
    }
    rule = rules.get(name)
    return rule() if rule else None
