"""The builtin functions of the language: names, arities and result types.

Only what the checker needs lives here; each backend maps the names to its own code.
"""

from __future__ import annotations

from dataclasses import dataclass

from tclang.dtypes import DType, promote


@dataclass(frozen=True)
class Builtin:
    name: str
    arity: int
    kind: str  # "math": computes in float32/float64; "generic": keeps the argument type

    def result_type(self, args: tuple[DType, ...]) -> DType:
        """The type the call computes in and returns, from its argument types."""
        joined = args[0]
        for a in args[1:]:
            joined = promote(joined, a)
        if self.kind == "generic":
            return DType.INT32 if joined is DType.BOOL else joined.compute
        return DType.FLOAT64 if joined is DType.FLOAT64 else DType.FLOAT32


_MATH_1 = """acos acosh asin asinh atan atanh cbrt ceil cos cosh cospi cyl_bessel_i0
cyl_bessel_i1 erf erfc erfcinv erfcx erfinv exp exp10 exp2 expm1 fabs floor j0 j1 lgamma log
log10 log1p log2 logb normcdf normcdfinv rcbrt round rsqrt sin sinh sinpi sqrt tan tanh tgamma
trunc y0 y1 sigmoid""".split()
_MATH_2 = "atan2 copysign fdim fdivide fmax fmin fmod hypot nextafter pow remainder rhypot".split()
_MATH_3 = "fma norm3d rnorm3d".split()
_MATH_4 = "norm4d rnorm4d".split()

BUILTINS: dict[str, Builtin] = {}
for _arity, _names in ((1, _MATH_1), (2, _MATH_2), (3, _MATH_3), (4, _MATH_4)):
    for _name in _names:
        BUILTINS[_name] = Builtin(_name, _arity, "math")
BUILTINS["abs"] = Builtin("abs", 1, "generic")
BUILTINS["min"] = Builtin("min", 2, "generic")
BUILTINS["max"] = Builtin("max", 2, "generic")
