"""Golden errors: the exact line and column of each error, and what its message says.

Each program's bad spot is on a line of its own, so a wrong line or column is visible.
"""

import pytest

from tclang.errors import TCSemanticError, TCSyntaxError
from tclang.lang.frontend import check_source

HEAD = "def f(float(N, M) A, float(N) V, int32(N) I) -> (B) {\n"

# (name, body lines after HEAD, error class, line, column, words in the message)
GOLDEN = [
    ("missing operand", "  B(i) = A(i, 0) +\n}", TCSyntaxError, 3, 1, "expected an expression"),
    ("square brackets", "  B(i) = A[i, 0]\n}", TCSyntaxError, 2, 11, "unexpected character '['"),
    ("unclosed paren", "  B(i) = (V(i)\n}", TCSyntaxError, 3, 1, "expected ')'"),
    ("no closing brace", "  B(i) = V(i)\n", TCSyntaxError, 2, 14, "end of the source"),
    ("bad character", "  B(i) = V(i) $ 2\n}", TCSyntaxError, 2, 15, "'$'"),
    ("expression on left", "  B(i + 1) = V(i)\n}", TCSyntaxError, 2, 7, "unexpected '+'"),
    ("unknown operator", "  B(i) -= V(i)\n}", TCSyntaxError, 2, 8, "unexpected '-'"),
    ("unknown tensor", "  B(i) = V(i) + Q(i)\n}", TCSemanticError, 2, 17, "unknown tensor"),
    ("wrong rank", "  B(i) = A(i)\n}", TCSemanticError, 2, 10, "rank 2"),
    ("write input", "  A(i, j) = 0.0\n  B(i) = V(i)\n}", TCSemanticError, 2, 3, "read-only"),
    ("reduction index with =", "  B(i) = A(i, j)\n}", TCSemanticError, 2, 15, "index j"),
    ("float subscript", "  B(i) = V(i * 0.5)\n}", TCSemanticError, 2, 12, "integer"),
    ("bool condition", "  B(i) = V(i) ? 1.0 : 0.0\n}", TCSemanticError, 2, 10, "bool"),
    ("not needs bool", "  B(i) = !V(i)\n}", TCSemanticError, 2, 11, "bool"),
    ("builtin arity", "  B(i) = pow(V(i))\n}", TCSemanticError, 2, 10, "2 arguments"),
    ("size as tensor", "  B(i) = V(i) * N(i)\n}", TCSemanticError, 2, 17, "N is a size"),
    ("builtin bare", "  B(i) = V(i) * exp\n}", TCSemanticError, 2, 17, "builtin"),
    ("read before write", "  B(i) = T(i)\n  T(i) = V(i)\n}", TCSemanticError, 2, 10,
     "before any statement writes"),
    ("self read elsewhere", "  B(i) = V(i)\n  B(i) = B(i + 1)\n}", TCSemanticError, 3, 10,
     "another point"),
    ("no range", "  B(i) = float(i)\n}", TCSemanticError, 2, 5, "cannot infer the range of index i"),
    ("two unknowns", "  B(i) +=! V(j + k)\n}", TCSemanticError, 2, 5, "cannot infer the range"),
    ("empty range", "  B(i) = V(i) where i in 3:1\n}", TCSemanticError, 2, 5, "empty range"),
    ("out of bounds", "  B(i) = V(i + 1) where i in 0:N\n}", TCSemanticError, 2, 10,
     "out of bounds for all sizes"),
    ("negative start", "  B(i) = V(i + 3) where i in -1:N-3\n}", TCSemanticError, 2, 5,
     "below 0"),
    ("range bound uses index", "  B(i) = V(i) where i in 0:j\n}", TCSemanticError, 2, 28,
     "only sizes"),
    ("duplicate lhs index", "  B(i, i) = A(i, i)\n}", TCSemanticError, 2, 8, "twice"),
    ("narrowing", "  B(i) = V(i)\n  B(i) = double(V(i))\n}", TCSemanticError, 3, 10, "narrow"),
    ("rank change", "  B(i) = V(i)\n  B(i, j) = A(i, j)\n}", TCSemanticError, 3, 3, "rank 1"),
    ("reduce bools", "  B(i) +=! V(i) > 0\n}", TCSemanticError, 2, 8, "cannot reduce bool"),
    ("let cycle", "  B(i) = x where x = y + V(i), y = x\n}", TCSemanticError, 2, 36,
     "in terms of itself"),
    ("exists non tensor", "  B(i) = 1.0 where exists exp(i)\n}", TCSemanticError, 2, 27,
     "not a tensor"),
    ("gather with float index", "  B(i) = V(V(i))\n}", TCSemanticError, 2, 12, "integer"),
    ("index named like size", "  B(N) = V(0)\n}", TCSemanticError, 2, 5, "N is a size"),
    ("reduce and read target", "  B(i) = V(i)\n  B(i) +=! B(i) * A(i, j)\n}", TCSemanticError,
     3, 12, "reduces into B and also reads it"),
]


@pytest.mark.parametrize("name,body,error,line,column,words", GOLDEN,
                         ids=[g[0] for g in GOLDEN])
def test_golden_error(name, body, error, line, column, words):
    source = HEAD + body
    with pytest.raises(error) as info:
        check_source(source)
    err = info.value
    assert (err.line, err.column) == (line, column), str(err)
    assert words in err.message, str(err)
    shown = str(err)  # the source line with a caret under the spot
    source_line = source.splitlines()[line - 1]
    assert source_line.rstrip() in shown
    caret_line = shown.splitlines()[shown.splitlines().index("    " + source_line.rstrip()) + 1]
    assert caret_line.index("^") == 4 + column - 1


def test_golden_table_is_large_enough():
    assert len({g[0] for g in GOLDEN}) >= 25


def test_error_in_second_definition_reports_its_line():
    source = ("def ok(float(N) A) -> (B) {\n  B(i) = A(i)\n}\n"
              "def bad(float(N) A) -> (B) {\n  B(i) = A(i) + Z(i)\n}\n")
    with pytest.raises(TCSemanticError) as info:
        check_source(source)
    assert (info.value.line, info.value.column) == (5, 17)


def test_output_declared_shape_mismatch_points_at_declaration():
    source = "def f(float(N) A) ->\n  (float(N) B) {\n  B(i) = A(i) where i in 0:N-1\n}"
    with pytest.raises(TCSemanticError) as info:
        check_source(source)
    assert (info.value.line, info.value.column) == (2, 13)
