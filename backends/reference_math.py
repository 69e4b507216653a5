"""The builtins, computed with NumPy and Python's math on scalars: the reference's math.

Functions without a NumPy or `math` counterpart (Bessel functions, erfinv, erfcx, ...)
are computed in float64 from standard series, rational approximations and a Newton step,
then rounded to the call's type. They are the oracle the compiled kernels are checked
against, within a few ulp.
"""

from __future__ import annotations

import math

import numpy as np

SQRT2 = math.sqrt(2.0)


def _f64(fn):
    """Lift a float64 scalar function to a scalar of any float type."""
    def lifted(x, dtype):
        with np.errstate(all="ignore"):
            return dtype.type(fn(float(x)))
    return lifted


def _safe(fn):
    def guarded(v: float) -> float:
        try:
            return fn(v)
        except (ValueError, OverflowError):
            return math.nan
    return guarded


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
    if not math.isfinite(x):
        return math.nan
    r = math.fmod(x, 2.0)
    if r == int(r):
        return math.copysign(0.0, x) if r in (0.0, 1.0, -1.0) else 0.0
    return math.sin(math.pi * r)


def _cospi(x: float) -> float:
    if not math.isfinite(x):
        return math.nan
    r = math.fmod(abs(x), 2.0)
    if r == 0.5 or r == 1.5:
        return 0.0
    return math.cos(math.pi * r)


def _erfinv(y: float) -> float:
    """Inverse error function: Giles' single-precision approximation, then two Newton
    steps in float64 on erf."""
    if math.isnan(y) or abs(y) > 1:
        return math.nan
    if y == 1:
        return math.inf
    if y == -1:
        return -math.inf
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
    x = p * y
    for _ in range(2):
        err = math.erf(x) - y
        x -= err / (2.0 / math.sqrt(math.pi) * math.exp(-x * x))
    return x


def _erfcinv(y: float) -> float:
    if math.isnan(y) or y < 0 or y > 2:
        return math.nan
    if y == 0:
        return math.inf
    if y == 2:
        return -math.inf
    if y > 0.0625:
        x = _erfinv(1.0 - y)
    else:  # small y: start from the asymptotic form, refine on erfc directly
        t = math.sqrt(-math.log(y))
        x = t - math.log(t * math.sqrt(math.pi)) / (2 * t)
    for _ in range(3):
        err = math.erfc(x) - y
        x += err / (2.0 / math.sqrt(math.pi) * math.exp(-x * x))
    return x


def _erfcx(x: float) -> float:
    if math.isnan(x):
        return x
    if x < 25.0:
        try:
            return math.exp(x * x) * math.erfc(x)
        except OverflowError:
            return math.inf
    inv = 1.0 / (x * x)  # asymptotic series
    return (1.0 - 0.5 * inv + 0.75 * inv * inv - 1.875 * inv ** 3) / (x * math.sqrt(math.pi))


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
    if order == 0:
        total, term, harmonic = 0.0, 1.0, 0.0
        for k in range(1, 300):
            harmonic += 1.0 / k
            term *= -half * half / (k * k)
            total += term * harmonic
            if abs(term * harmonic) < 1e-17 * max(abs(total), 1e-300):
                break
        return (2.0 / math.pi) * ((math.log(half) + gamma) * _bessel_series(x, 0, False)
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
    return (2.0 / math.pi) * (math.log(half) + gamma) * _bessel_series(x, 1, False) \
        - 2.0 / (math.pi * x) - total / math.pi


def _bessel_i(order: int):
    def i(x: float) -> float:
        if math.isnan(x):
            return x
        ax = abs(x)
        if ax > 700:
            return math.inf if order == 0 or x > 0 else -math.inf
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
    return math.exp(x) / math.sqrt(2 * math.pi * x) * total


def _normcdf(x: float) -> float:
    return 0.5 * math.erfc(-x / SQRT2)


def _normcdfinv(p: float) -> float:
    return -SQRT2 * _erfcinv(2.0 * p)


def _tgamma(x: float) -> float:
    if x == 0:
        return math.copysign(math.inf, x)
    if x < 0 and x == int(x):
        return math.nan
    if math.isinf(x):
        return x if x > 0 else math.nan
    try:
        return math.gamma(x)
    except OverflowError:
        return math.inf


def _lgamma(x: float) -> float:
    if x <= 0 and x == int(x):
        return math.inf
    try:
        return math.lgamma(x)
    except (ValueError, OverflowError):
        return math.inf


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
    "erfcinv": _erfcinv, "erfcx": _erfcx, "exp10": _safe(lambda v: 10.0 ** v),
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
                return t(np.float64(a[0]) * np.float64(a[1]) + np.float64(a[2])) \
                    if dtype != np.float64 else t(math.fsum((a[0] * a[1], a[2])))
            case "norm3d" | "norm4d" | "rnorm3d" | "rnorm4d":
                norm = math.sqrt(math.fsum(float(v) * float(v) for v in a))
                return t(norm if name.startswith("norm") else 1.0 / norm if norm else math.inf)
    raise KeyError(f"no reference implementation of builtin {name}")


def _remainder(a: float, b: float) -> float:
    try:
        return math.remainder(a, b)
    except ValueError:
        return math.nan
