"""Index and size expressions as C: what an exported library's wrapper computes without
Python (sizes bound from the arguments, output shapes, the definition's obligations, the
sizes that make a read leave its tensor).

Every value is an `int64_t`. Division and remainder follow the loop IR's meaning (floor
division, the divisor's sign for a remainder), through the small helpers `PRELUDE` defines.
A name `p__M__N` (the scop's product of sizes) is the product of the sizes it names.
"""

from __future__ import annotations

from polyhedral import loop_ir as L
from polyhedral.subscripts import size_index
from tclang.lang import sizes as Z
from tclang.dtypes import DType

#: static helpers every generated C file that prints index expressions starts with
PRELUDE = """\
static inline int64_t tcx_floordiv(int64_t a, int64_t b) {
    int64_t q = a / b;
    return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}
static inline int64_t tcx_floormod(int64_t a, int64_t b) {
    int64_t r = a % b;
    return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}
static inline int64_t tcx_min(int64_t a, int64_t b) { return a < b ? a : b; }
static inline int64_t tcx_max(int64_t a, int64_t b) { return a > b ? a : b; }
"""

#: index operators: C's, and PRELUDE's helpers for the rest (and for a remainder)
_OPERATORS = {**L.C_OPERATORS, "floordiv": "tcx_floordiv({0}, {1})",
              "floormod": "tcx_floormod({0}, {1})", "rem": "tcx_floormod({0}, {1})",
              "min": "tcx_min({0}, {1})", "max": "tcx_max({0}, {1})"}

#: the C type an exported function takes for each element type (float16: its IEEE bits,
#: bfloat16: its bits, the upper half of a float32's)
C_TYPES = {
    DType.BOOL: "uint8_t", DType.UINT8: "uint8_t", DType.UINT16: "uint16_t",
    DType.UINT32: "uint32_t", DType.UINT64: "uint64_t", DType.INT8: "int8_t",
    DType.INT16: "int16_t", DType.INT32: "int32_t", DType.INT64: "int64_t",
    DType.FLOAT16: "uint16_t", DType.BFLOAT16: "uint16_t", DType.FLOAT32: "float", DType.FLOAT64: "double",
}


def size_variable(name: str) -> str:
    """The C variable holding size `name` in a wrapper."""
    return f"size_{name}"


def index_c(e: L.IExpr) -> str:
    """`e` as a C expression over the wrappers' size variables."""
    return L.render_index(e, _variable, _integer, _OPERATORS)


def _variable(name: str) -> str:
    if name.startswith("p__"):
        return "(" + " * ".join(size_variable(n) for n in name[3:].split("__")) + ")"
    return size_variable(name)


def _integer(value: int) -> str:
    return f"INT64_C({value})" if value >= 0 else f"(-INT64_C({-value}))"


def size_c(e: Z.SizeExpr) -> str:
    """A size expression of the definition (an extent, an obligation) as C."""
    return index_c(size_index(e, None))


def c_string(text: str) -> str:
    """`text` as a C string literal (one line; quotes, backslashes and controls escaped)."""
    out = []
    for ch in text:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ch == "\n":
            out.append("\\n")
        elif ord(ch) < 32 or ord(ch) > 126:
            out.append("".join(f"\\{b:03o}" for b in ch.encode()))
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'
