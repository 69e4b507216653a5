"""Every rule of LANGUAGE.md sections 1-5: one program that follows it, one that breaks it."""

import warnings

import pytest

from tclang.dtypes import DType
from tclang.errors import TCSemanticError, TCSyntaxError, TCWarning
from tclang.lang.frontend import check_source

# (rule, a program that follows it, a program that breaks it, the error class)
RULES = [
    ("1 several definitions and comments",
     "def a(float(N) X) -> (Y) { Y(i) = X(i) }  # one\ndef b(float(N) X) -> (Y) { Y(i) = X(i) }",
     "def a(float(N) X) -> (Y) { Y(i) = X(i) } def a(float(N) X) -> (Y) { Y(i) = X(i) }",
     TCSemanticError),
    ("1 parameters: size names and literals",
     "def f(float(N, 3) A) -> (B) { B(i, j) = A(i, j) }",
     "def f(float(N, -3) A) -> (B) { B(i) = A(i) }", TCSyntaxError),
    ("1 scalar inputs, bare or with ()",
     "def f(float(N) A, float s) -> (B) { B(i) = A(i) * s + s() }",
     "def f(float(N) A, float s) -> (B) { B(i) = A(i) * s(i) }", TCSemanticError),
    ("1 typed outputs are checked",
     "def f(float(N) A) -> (float(N) B) { B(i) = A(i) }",
     "def f(float(N) A) -> (int32(N) B) { B(i) = A(i) }", TCSemanticError),
    ("1 optional semicolons, whitespace separation",
     "def f(float(N) A) -> (B, C) { B(i) = A(i); C(i) = B(i) }",
     "def f(float(N) A) -> (B, C) { B(i) = A(i);; C(i) = B(i) }", TCSyntaxError),
    ("1 type names and aliases",
     "def f(half(N) A, double(N) B, uint8(N) C) -> (D) { D(i) = float(A(i)) + B(i) + C(i) }",
     "def f(float128(N) A) -> (B) { B(i) = A(i) }", TCSyntaxError),
    ("2 left side: distinct index names only",
     "def f(float(N, M) A) -> (B) { B(i, j) = A(i, j) }",
     "def f(float(N) A) -> (B) { B(i + 1) = A(i) }", TCSyntaxError),
    ("2 left side: names, not sizes",
     "def f(float(N) A) -> (B) { B(n) = A(n) }",
     "def f(float(N) A) -> (B) { B(N) = A(0) }", TCSemanticError),
    ("2 `=` may not use a reduction index",
     "def f(float(N, M) A) -> (B) { B(i) +=! A(i, j) }",
     "def f(float(N, M) A) -> (B) { B(i) = A(i, j) }", TCSemanticError),
    ("2 reduction operators",
     "def f(float(N, M) A) -> (B, C, D) { B(i) *=! A(i, j)  C(i) min=! A(i, j)  D(i) max=! A(i, j) }",
     "def f(float(N, M) A) -> (B) { B(i) -=! A(i, j) }", TCSyntaxError),
    ("2 temporaries are neither inputs nor outputs",
     "def f(float(N) A) -> (B) { T(i) = A(i) * 2  B(i) = T(i) }",
     "def f(float(N) A) -> (B) { B(i) = T(i)  T(i) = A(i) }", TCSemanticError),
    ("2 inputs are read-only",
     "def f(float(N) A) -> (B) { B(i) = A(i) }",
     "def f(float(N) A) -> (B) { A(i) = 0.0  B(i) = A(i) }", TCSemanticError),
    ("2 a statement may read its target only at its point or, as a recurrence, earlier",
     "def f(float(N) A) -> (B) { B(i) = A(i)  B(i) = (i > 0) ? B(i - 1) * 2 : B(i) }",
     "def f(float(N) A) -> (B) { B(i) = A(i)  B(i) = B(i + 1) }", TCSemanticError),
    ("2 every output is written",
     "def f(float(N) A) -> (B) { B(i) = A(i) }",
     "def f(float(N) A) -> (B, C) { B(i) = A(i) }", TCSemanticError),
    ("3 comparisons need compatible operands and give bool",
     "def f(float(N) A) -> (B) { B(i) = A(i) > 0 ? 1.0 : 0.0 }",
     "def f(float(N) A) -> (B) { B(i) = A(i) ? 1.0 : 0.0 }", TCSemanticError),
    ("3 && || ! need bool",
     "def f(float(N) A) -> (B) { B(i) = !(A(i) > 0) && A(i) < 1 || false }",
     "def f(float(N) A) -> (B) { B(i) = !A(i) }", TCSemanticError),
    ("3 casts",
     "def f(float(N) A) -> (B) { B(i) = int32(A(i)) }",
     "def f(float(N) A) -> (B) { B(i) = int33(A(i)) }", TCSemanticError),
    ("3 min and max take two arguments",
     "def f(float(N) A) -> (B) { B(i) = min(A(i), 0) + max(A(i), 1) }",
     "def f(float(N) A) -> (B) { B(i) = min(A(i), 0, 1) }", TCSemanticError),
    ("3 builtins: names and arities",
     "def f(float(N) A) -> (B) { B(i) = fma(A(i), 2, 1) + atan2(A(i), 1) + erfinv(A(i)) }",
     "def f(float(N) A) -> (B) { B(i) = atan2(A(i)) }", TCSemanticError),
    ("3 a parameter may not be named after a builtin",
     "def f(float(N) expo) -> (B) { B(i) = exp(expo(i)) }",
     "def f(float(N) exp) -> (B) { B(i) = exp(i) }", TCSemanticError),
    ("3 sizes and indices as int32 values",
     "def f(float(N) A) -> (B) { B(i) = A(i) * i / N }",
     "def f(float(N) A) -> (B) { B(i) = A(i) * N(0) }", TCSemanticError),
    ("3 reads: one subscript per dimension",
     "def f(float(N, M) A) -> (B) { B(i, j) = A(i, j) }",
     "def f(float(N, M) A) -> (B) { B(i) = A(i) }", TCSemanticError),
    ("3 subscripts are integers",
     "def f(float(N) A) -> (B) { B(i) = A(int32(i * 1)) }",
     "def f(float(N) A) -> (B) { B(i) = A(i * 1.0) }", TCSemanticError),
    ("3 gathers read through a tensor",
     "def f(float(E, D) T, int32(B) I) -> (O) { O(b, d) = T(I(b), d) }",
     "def f(float(E, D) T, float(B) I) -> (O) { O(b, d) = T(I(b), d) }", TCSemanticError),
    ("4 where ranges",
     "def f(float(N) A) -> (B) { B(i) +=! A(i) where j in 0:3 }",
     "def f(float(N) A) -> (B) { B(i) = A(i) where i in 0:A(0) }", TCSemanticError),
    ("4 where locals",
     "def f(float(N) A) -> (B) { B(i) = x * x where x = A(i) + 1 }",
     "def f(float(N) A) -> (B) { B(i) = x where x = y, y = x }", TCSemanticError),
    ("4 exists",
     "def f(float(N) A, float c) -> (B) { B(i) = c where exists A(i) }",
     "def f(float(N) A, float c) -> (B) { B(i) = c where exists Q(i) }", TCSemanticError),
    ("5 every index needs a range",
     "def f(float(N) A) -> (B) { B(i) = float(i) where i in 0:N }",
     "def f(float(N) A) -> (B) { B(i) = float(i) }", TCSemanticError),
    ("5 ranges may not be empty",
     "def f(float(N) A) -> (B) { B(i) = A(i) where i in 0:1 }",
     "def f(float(N) A) -> (B) { B(i) = 0.0 where i in 4:2 }", TCSemanticError),
    ("5 output index spaces start at 0",
     "def f(float(N) A) -> (B) { B(i) = A(i - 1) where i in 1:N+1 }",
     "def f(float(N) A) -> (B) { B(i) = A(i + 2) where i in -2:N-2 }", TCSemanticError),
    ("5 reads out of bounds for all sizes",
     "def f(float(N) A) -> (B) { B(i) = A(i) where i in 0:N }",
     "def f(float(N) A) -> (B) { B(i) = A(i + 1) where i in 0:N }", TCSemanticError),
    ("5 guarded reads do not constrain inference",
     "def f(float(N) I) -> (O) { O(i) = (i >= 1 && i <= N) ? I(i - 1) : 0 where i in 0:N+2 }",
     "def f(float(N) I) -> (O) { O(i) = (i >= 1 && i <= N) ? I(i - 1) : 0 }", TCSemanticError),
    ("5 declared output shapes match inference",
     "def f(float(N) A) -> (float(N) B) { B(i) = A(i) }",
     "def f(float(N) A) -> (float(N) B) { B(i) = A(i) where i in 0:N-1 }", TCSemanticError),
]


@pytest.mark.parametrize("rule,good,bad,error", RULES, ids=[r[0] for r in RULES])
def test_rule(rule, good, bad, error):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TCWarning)
        check_source(good)
        with pytest.raises(error):
            check_source(bad)


def test_accumulating_without_definition_warns():
    with pytest.warns(TCWarning, match="accumulates into B"):
        check_source("def f(float(N) A) -> (B) { B(i) += A(i) }")
    with warnings.catch_warnings():
        warnings.simplefilter("error", TCWarning)
        check_source("def f(float(N) A) -> (B) { B(i) = A(i)  B(i) += A(i) }")


def _types(src, name):
    d = check_source(src).definitions[0]
    return d.tensor(name).dtype


@pytest.mark.parametrize("expr,expected", [
    ("1", DType.INT32), ("1.5", DType.FLOAT32), ("1e3", DType.FLOAT32),
    ("A8(i) + A8(i)", DType.INT8), ("A8(i) + 1", DType.INT32), ("U32(i) + A8(i)", DType.INT32),
    ("U32(i) + U32(i)", DType.UINT32), ("U64(i) + I64(i)", DType.INT64),
    ("I64(i) * 1.0", DType.FLOAT32), ("D(i) + 1.0", DType.FLOAT64), ("H(i) + H(i)", DType.FLOAT16),
    ("H(i) + F(i)", DType.FLOAT32), ("exp(A8(i))", DType.FLOAT32), ("exp(D(i))", DType.FLOAT64),
    ("exp(H(i))", DType.FLOAT32), ("abs(A8(i))", DType.INT8), ("max(A8(i), U32(i))", DType.INT32),
    ("i", DType.INT32), ("N", DType.INT32), ("F(i) > 0", DType.BOOL), ("int64(F(i))", DType.INT64),
    ("F(i) > 0 ? D(i) : 1", DType.FLOAT64), ("sigmoid(F(i))", DType.FLOAT32),
])
def test_promotion(expr, expected):
    src = ("def f(int8(N) A8, uint32(N) U32, uint64(N) U64, int64(N) I64, float(N) F, "
           f"double(N) D, half(N) H) -> (O) {{ O(i) = {expr} where i in 0:N }}")
    assert _types(src, "O") is expected


def test_float_literal_with_double_tensor_is_exact():
    d = check_source("def f(double(N) A) -> (B) { B(i) = A(i) * 0.1 }").definitions[0]
    const = d.statements[0].rhs.rhs
    assert const.dtype is DType.FLOAT64 and const.value == 0.1


def test_precedence_and_associativity():
    d = check_source("def f(int32(N) A) -> (B) { B(i) = A(i) - 2 - 3 * 4 % 5 }").definitions[0]
    rhs = d.statements[0].rhs  # (A(i) - 2) - ((3 * 4) % 5)
    assert rhs.op == "sub" and rhs.lhs.op == "sub" and rhs.rhs.op == "mod"
    assert rhs.rhs.lhs.op == "mul"
    d = check_source("def f(float(N) A) -> (B) { B(i) = A(i) > 0 ? 1.0 : A(i) < 0 ? -1.0 : 0.0 }")
    rhs = d.definitions[0].statements[0].rhs
    assert rhs.other.__class__.__name__ == "Select"  # right associative


def test_reduction_classification():
    d = check_source("def f(float(N, M, K) A) -> (B) { B(i) +=! A(i, j, k) }").definitions[0]
    s = d.statements[0]
    assert s.indices == ("i",) and s.reduction_indices == ("j", "k")
    assert s.op == "+" and s.reset


def test_temporaries_and_outputs():
    src = "def f(float(N) A) -> (B) { T(i) = A(i)  U(i) = T(i)  B(i) = U(i) }"
    d = check_source(src).definitions[0]
    assert [t.name for t in d.temporaries] == ["T", "U"]
    assert [t.name for t in d.outputs] == ["B"]
