"""The builtins, computed with NumPy and Python's math on scalars: the reference's math.

Functions without a NumPy or `math` counterpart (Bessel functions, erfinv, erfcx, ...)
are computed in float64 from standard series, rational approximations and a Newton step,
then rounded to the call's type. They are the oracle the compiled kernels are checked
against, within a few ulp.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

SQRT2 = math.sqrt(2.0)
SQRT2_LO = -9.667293313452913e-17  # sqrt(2) - SQRT2, so that SQRT2 + SQRT2_LO is exact to 2^-106
TWO_OVER_SQRTPI = 2.0 / math.sqrt(math.pi)


def _f64(fn):
    """Lift a float64 scalar function to a scalar of any float type."""
    def lifted(x, dtype):
        with np.errstate(all="ignore"):
            return dtype.type(fn(float(x)))
    return lifted


def _round(x: float) -> float:
    """C's round: halfway cases away from zero."""
    if not math.isfinite(x):
        return x
    t = math.trunc(x)
    if abs(x - t) >= 0.5:
        t += math.copysign(1.0, x)
    return float(t)


def _logb(x: float) -> float:
    if x == 0:
        return -math.inf
    if not math.isfinite(x):
        return abs(x) if not math.isnan(x) else x
    return float(math.frexp(x)[1] - 1)


def _sinpi(x: float) -> float:
    """sin(pi x), reduced exactly to |r| <= 1/2 first so that pi * r loses nothing near
    the integers (sin(pi * fmod(x, 2)) is off by ~1e-16 absolute there)."""
    if not math.isfinite(x):
        return math.nan
    r = math.fmod(x, 2.0)  # exact, in (-2, 2)
    if r == int(r):
        return math.copysign(0.0, x) if r in (0.0, 1.0, -1.0) else 0.0
    sign = math.copysign(1.0, r)
    a = abs(r)
    if a > 1.0:  # sin(pi a) = -sin(pi (a - 1)); a - 1 is exact
        a, sign = a - 1.0, -sign
    if a > 0.5:  # sin(pi a) = sin(pi (1 - a)); 1 - a is exact (Sterbenz)
        a = 1.0 - a
    return sign * math.sin(math.pi * a)


def _cospi(x: float) -> float:
    if not math.isfinite(x):
        return math.nan
    a = math.fmod(abs(x), 2.0)
    if a > 1.0:
        a = 2.0 - a  # exact; cos(pi a) = cos(pi (2 - a))
    if a == 0.5:
        return 0.0
    if a < 0.25:
        return math.cos(math.pi * a)
    return _sinpi(0.5 - a)  # 0.5 - a is exact for a in [1/4, 1]


def _erfinv(y: float) -> float:
    """Inverse error function. For |y| <= 1/2, Giles' single-precision approximation and
    two Newton steps on erf; beyond, erfcinv(1 - |y|) (1 - |y| is exact there), because
    erf(x) - y cancels near |y| = 1 and Newton on erf would stall far from the root."""
    if math.isnan(y) or abs(y) > 1:
        return math.nan
    if y == 1:
        return math.inf
    if y == -1:
        return -math.inf
    if abs(y) > 0.5:
        return math.copysign(_erfcinv(1.0 - abs(y)), y)
    x = _erfinv_guess(y)
    for _ in range(2):
        err = math.erf(x) - y
        x -= err / (TWO_OVER_SQRTPI * math.exp(-x * x))
    return x


def _erfinv_guess(y: float) -> float:
    """Giles' single-precision erfinv, the starting point of the Newton steps."""
    w = -math.log((1.0 - y) * (1.0 + y))
    if w < 5.0:
        w -= 2.5
        p = 2.81022636e-08
        for c in (3.43273939e-07, -3.5233877e-06, -4.39150654e-06, 0.00021858087,
                  -0.00125372503, -0.00417768164, 0.246640727, 1.50140941):
            p = c + p * w
    else:
        w = math.sqrt(w) - 3.0
        p = -0.000200214257
        for c in (0.000100950558, 0.00134934322, -0.00367342844, 0.00573950773,
                  -0.0076224613, 0.00943887047, 1.00167406, 2.83297682):
            p = c + p * w
    return p * y


def _erfcinv(y: float) -> float:
    if math.isnan(y) or y < 0 or y > 2:
        return math.nan
    if y == 0:
        return math.inf
    if y == 2:
        return -math.inf
    if y == 1:
        return 0.0
    if y > 1.0:  # erfcinv(y) = -erfcinv(2 - y); 2 - y is exact for y in [1, 2]
        return -_erfcinv(2.0 - y)
    if 0.5 <= y:  # near the origin: Newton on erf of 1 - y (exact), no cancellation
        x = _erfinv_guess(1.0 - y)
        for _ in range(2):
            x -= (math.erf(x) - (1.0 - y)) / (TWO_OVER_SQRTPI * math.exp(-x * x))
        return x
    if y > 0.0625:
        x = _erfinv_guess(1.0 - y)
    else:  # small y: start from the asymptotic form
        t = math.sqrt(-math.log(y))
        x = t - math.log(t * math.sqrt(math.pi)) / (2 * t)
    # Newton on log erfc: the relative residual keeps its precision even when erfc(x)
    # underflows toward the subnormals
    for _ in range(6):
        e = math.erfc(x)
        if e == 0.0:
            x *= 0.99
            continue
        step = math.log(e / y) * e / (TWO_OVER_SQRTPI * math.exp(-x * x)) \
            if math.exp(-x * x) > 0.0 else math.log(e / y) / (2.0 * x)
        x += step
        if abs(step) <= 1e-17 * abs(x):
            break
    return x


def _erfcx(x: float) -> float:
    if math.isnan(x):
        return x
    if x < 25.0:
        square = x * x  # exp(x^2) needs x^2 beyond double precision: add back the error
        if square > 710.0:  # x far below 0: erfcx(x) ~ 2 exp(x^2) overflows
            return math.inf
        error = float(Fraction(x) * Fraction(x) - Fraction(square))
        try:
            return math.exp(square) * math.erfc(x) * math.exp(error)
        except OverflowError:
            return math.inf
    # asymptotic series: sum of (-1)^n (2n-1)!! / (2 x^2)^n, summed until it stops mattering
    v = 0.5 / (x * x)
    total, term = 1.0, 1.0
    for n in range(1, 40):
        term *= -(2 * n - 1) * v
        total += term
        if abs(term) < 1e-18:
            break
    return total / (x * math.sqrt(math.pi))


def _bessel_series(x: float, order: int, modified: bool) -> float:
    """J_n or I_n (n = 0, 1) by their power series; fine for |x| below about 25."""
    half = x / 2.0
    term = 1.0 if order == 0 else half
    total = term
    sign = 1.0 if modified else -1.0
    for k in range(1, 300):
        term *= sign * half * half / (k * (k + order))
        total += term
        if abs(term) < 1e-17 * abs(total):
            break
    return total


def _bessel_asymptotic(x: float, order: int, kind: str) -> float:
    """Hankel's asymptotic expansion of J_n or Y_n for large x."""
    mu = 4.0 * order * order
    p, q, term = 1.0, 0.0, 1.0
    for k in range(1, 30):
        term *= (mu - (2 * k - 1) ** 2) / (k * 8.0 * x)
        if k % 2 == 1:
            q += term if (k // 2) % 2 == 0 else -term
        else:
            p += -term if (k // 2) % 2 == 1 else term
        if abs(term) < 1e-17:
            break
    chi = x - (order / 2.0 + 0.25) * math.pi
    amp = math.sqrt(2.0 / (math.pi * x))
    if kind == "j":
        return amp * (p * math.cos(chi) - q * math.sin(chi))
    return amp * (p * math.sin(chi) + q * math.cos(chi))


def _j(order: int):
    def j(x: float) -> float:
        if not math.isfinite(x):
            return 0.0 if math.isinf(x) else x
        sign = -1.0 if (order == 1 and x < 0) else 1.0
        ax = abs(x)
        if ax < 25.0:
            return sign * _bessel_series(ax, order, False)
        return sign * _bessel_asymptotic(ax, order, "j")
    return j


def _y(order: int):
    def y(x: float) -> float:
        if math.isnan(x) or x < 0:
            return math.nan
        if x == 0:
            return -math.inf
        if math.isinf(x):
            return 0.0
        if x >= 25.0:
            return _bessel_asymptotic(x, order, "y")
        return _y_series(x, order)
    return y


def _y_series(x: float, order: int) -> float:
    """Y_0 and Y_1 from their power series around 0 (A&S 9.1.13 and 9.1.11)."""
    gamma = 0.5772156649015329
    half = x / 2.0
    log_half = math.log(x) - math.log(2.0)  # x / 2 may underflow to 0 for subnormal x
    if order == 0:
        total, term, harmonic = 0.0, 1.0, 0.0
        for k in range(1, 300):
            harmonic += 1.0 / k
            term *= -half * half / (k * k)
            total += term * harmonic
            if abs(term * harmonic) < 1e-17 * max(abs(total), 1e-300):
                break
        return (2.0 / math.pi) * ((log_half + gamma) * _bessel_series(x, 0, False)
                                  - total)
    total = 0.0
    term = half  # (x/2)^(2k+1) / (k! (k+1)!)
    h_k, h_k1 = 0.0, 1.0
    for k in range(0, 300):
        if k > 0:
            term *= -half * half / (k * (k + 1))
            h_k += 1.0 / k
            h_k1 += 1.0 / (k + 1)
        piece = term * (h_k + h_k1)
        total += piece
        if k > 2 and abs(piece) < 1e-17 * max(abs(total), 1e-300):
            break
    return (2.0 / math.pi) * (log_half + gamma) * _bessel_series(x, 1, False) \
        - 2.0 / (math.pi * x) - total / math.pi


def _bessel_i(order: int):
    def i(x: float) -> float:
        if math.isnan(x):
            return x
        ax = abs(x)
        value = _bessel_series(ax, order, True) if ax < 30 else _i_asymptotic(ax, order)
        return -value if (order == 1 and x < 0) else value
    return i


def _i_asymptotic(x: float, order: int) -> float:
    mu = 4.0 * order * order
    total, term = 1.0, 1.0
    for k in range(1, 30):
        term *= -(mu - (2 * k - 1) ** 2) / (k * 8.0 * x)
        total += term
        if abs(term) < 1e-17:
            break
    if x > 1420.0:
        return math.inf
    half = math.exp(x / 2)  # e^x in two halves: finite up to I's own overflow near 713.99
    return half / math.sqrt(2 * math.pi * x) * total * half


def _normcdf(x: float) -> float:
    """0.5 erfc(-x / sqrt 2). Rounding -x / sqrt 2 costs ~x^2 ulp in the tail, so the
    quotient's error is carried and applied as a first-order correction."""
    if not math.isfinite(x):
        return 0.5 * math.erfc(-x / SQRT2)
    t = -x / SQRT2
    exact = -Fraction(x) / (Fraction(SQRT2) + Fraction(SQRT2_LO))
    t_lo = float(exact - Fraction(t))
    e = math.erfc(t)
    return 0.5 * (e - t_lo * TWO_OVER_SQRTPI * math.exp(-t * t))


def _normcdfinv(p: float) -> float:
    z = _erfcinv(2.0 * p)
    return -(SQRT2 * z + SQRT2_LO * z) if math.isfinite(z) else -z


def _tgamma(x: float) -> float:
    if math.isnan(x):
        return x
    if math.isinf(x):
        return x if x > 0 else math.nan
    if x == 0:
        return math.copysign(math.inf, x)
    if x < 0 and x == int(x):
        return math.nan
    try:
        return math.gamma(x)
    except OverflowError:  # near 0 gamma(x) ~ 1/x keeps x's sign; large x: +inf
        return math.copysign(math.inf, x) if abs(x) < 1 else math.inf


def _lgamma(x: float) -> float:
    if math.isnan(x):
        return x
    if math.isinf(x) or (x <= 0 and x == int(x)):
        return math.inf
    try:
        return math.lgamma(x)
    except (ValueError, OverflowError):
        return math.inf


def _exp10(x: float) -> float:
    try:
        return 10.0 ** x
    except OverflowError:  # as C's exp10: overflow is +inf, not an error
        return math.inf


def _fma(a: float, b: float, c: float) -> float:
    """a * b + c rounded once, as C's fma: exact rational arithmetic for finite operands."""
    if all(map(math.isfinite, (a, b, c))):
        try:
            return float(Fraction(a) * Fraction(b) + Fraction(c))
        except OverflowError:
            return math.copysign(math.inf, Fraction(a) * Fraction(b) + Fraction(c))
    if math.isinf(c) and math.isfinite(a) and math.isfinite(b):
        return c
    return a * b + c


def _norm(values: list, reciprocal: bool) -> float:
    """sqrt of the sum of squares (or its reciprocal), scaled by the largest magnitude so
    that squaring neither overflows nor underflows; NaN if any argument is NaN."""
    if any(math.isnan(v) for v in values):
        return math.nan
    largest = max(abs(v) for v in values)
    if largest == 0.0:
        return math.inf if reciprocal else 0.0
    if math.isinf(largest):
        return 0.0 if reciprocal else math.inf
    scaled = math.hypot(*(v / largest for v in values))
    return (1.0 / largest) / scaled if reciprocal else largest * scaled


def _div(a, b):
    return a / b


# name -> function(scalars..., dtype) returning a scalar of dtype (a NumPy float type)
UNARY = {
    "acos": np.arccos, "acosh": np.arccosh, "asin": np.arcsin, "asinh": np.arcsinh,
    "atan": np.arctan, "atanh": np.arctanh, "cbrt": np.cbrt, "ceil": np.ceil, "cos": np.cos,
    "cosh": np.cosh, "exp": np.exp, "exp2": np.exp2, "expm1": np.expm1, "fabs": np.fabs,
    "floor": np.floor, "log": np.log, "log10": np.log10, "log1p": np.log1p, "log2": np.log2,
    "sin": np.sin, "sinh": np.sinh, "sqrt": np.sqrt, "tan": np.tan, "tanh": np.tanh,
    "trunc": np.trunc,
}
FLOAT64 = {
    "cospi": _cospi, "sinpi": _sinpi, "erf": math.erf, "erfc": math.erfc, "erfinv": _erfinv,
    "erfcinv": _erfcinv, "erfcx": _erfcx, "exp10": _exp10,
    "lgamma": _lgamma, "tgamma": _tgamma, "logb": _logb, "round": _round,
    "j0": _j(0), "j1": _j(1), "y0": _y(0), "y1": _y(1), "cyl_bessel_i0": _bessel_i(0),
    "cyl_bessel_i1": _bessel_i(1), "normcdf": _normcdf, "normcdfinv": _normcdfinv,
}


def call(name: str, args: tuple, dtype: np.dtype):
    """Evaluate builtin `name` on NumPy scalars already of type `dtype`."""
    t = dtype.type
    with np.errstate(all="ignore"):
        if name in UNARY:
            return t(UNARY[name](args[0]))
        if name in FLOAT64:
            return _f64(FLOAT64[name])(args[0], dtype)
        a = args
        match name:
            case "abs":
                return t(np.abs(a[0]))
            case "min":
                return t(np.fmin(a[0], a[1]))
            case "max":
                return t(np.fmax(a[0], a[1]))
            case "sigmoid":
                return t(t(1) / (t(1) + np.exp(-a[0])))
            case "rsqrt":
                return t(t(1) / np.sqrt(a[0]))
            case "rcbrt":
                return t(t(1) / np.cbrt(a[0]))
            case "atan2":
                return t(np.arctan2(a[0], a[1]))
            case "copysign":
                return t(np.copysign(a[0], a[1]))
            case "fdim":
                return t(a[0] - a[1]) if a[0] > a[1] else (t(0) if a[0] <= a[1] else t(np.nan))
            case "fdivide":
                return t(a[0] / a[1])
            case "fmax":
                return t(np.fmax(a[0], a[1]))
            case "fmin":
                return t(np.fmin(a[0], a[1]))
            case "fmod":
                return t(np.fmod(a[0], a[1]))
            case "hypot":
                return t(np.hypot(a[0], a[1]))
            case "rhypot":
                return t(1.0 / np.hypot(np.float64(a[0]), np.float64(a[1])))
            case "nextafter":
                return t(np.nextafter(a[0], a[1]))
            case "pow":
                return t(np.power(a[0], a[1]))
            case "remainder":
                return t(_remainder(float(a[0]), float(a[1])))
            case "fma":
                if dtype == np.float64:
                    return t(_fma(*map(float, a)))
                # float32 operands: the float64 product is exact, one rounding in the sum
                return t(np.float64(a[0]) * np.float64(a[1]) + np.float64(a[2]))
            case "norm3d" | "norm4d" | "rnorm3d" | "rnorm4d":
                return t(_norm(list(map(float, a)), reciprocal=name.startswith("r")))
    raise KeyError(f"no reference implementation of builtin {name}")


def _remainder(a: float, b: float) -> float:
    try:
        return math.remainder(a, b)
    except ValueError:
        return math.nan
