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
    ("self read later", "  B(i) = V(i)\n  B(i) = B(i + 1)\n}", TCSemanticError, 3, 10,
     "at the same time or later"),
    ("recurrence read later", "  B(i) = i < N - 1 ? B(i + 1) : V(i)\n}", TCSemanticError,
     2, 22, "only earlier points"),
    ("recurrence with += reads later", "  B(i) = V(i)\n  B(i) += i < N - 1 ? B(i + 1) : 0.0\n}",
     TCSemanticError, 3, 23, "only earlier points"),
    ("recurrence gathered", "  B(i) = V(i)\n  B(i) = B(I(i))\n}", TCSemanticError, 3, 10,
     "data-dependent point"),
    ("recurrence same point first", "  B(i) = B(i) + V(i)\n}", TCSemanticError, 2, 10,
     "before any statement writes it"),
    ("no range", "  B(i) = float(i)\n}", TCSemanticError, 2, 5, "cannot infer the range of index i"),
    ("two unknowns", "  B(i) +=! V(j + k)\n}", TCSemanticError, 2, 5, "cannot infer the range"),
    ("empty range", "  B(i) = V(i) where i in 3:1\n}", TCSemanticError, 2, 5, "empty range"),
    ("out of bounds", "  B(i) = V(i + 1) where i in 0:N\n}", TCSemanticError, 2, 10,
     "out of bounds for all sizes"),
    ("negative start", "  B(i) = V(i + 3) where i in -1:N-3\n}", TCSemanticError, 2, 5,
     "below 0"),
    ("range bound uses index", "  B(i) = V(i) where i in 0:j\n}", TCSemanticError, 2, 28,
     "uses j, which is not an index of this statement"),
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


@pytest.mark.parametrize("ending", ["\r\n", "\r"], ids=["CRLF", "bare CR"])
@pytest.mark.parametrize("name,body,error,line,column,words", GOLDEN,
                         ids=[g[0] for g in GOLDEN])
def test_golden_error_with_other_line_endings(name, body, error, line, column, words, ending):
    """Lines ended by "\\r\\n" or a bare "\\r" are numbered as with "\\n", and the caret
    stands under the same spot (a bare "\\r" once made the whole source line 1)."""
    source = (HEAD + body).replace("\n", ending)
    with pytest.raises(error) as info:
        check_source(source)
    err = info.value
    assert (err.line, err.column) == (line, column), str(err)
    shown = str(err)
    assert "\r" not in shown
    source_line = (HEAD + body).split("\n")[line - 1].rstrip()
    caret_line = shown.splitlines()[shown.splitlines().index("    " + source_line) + 1]
    assert caret_line.index("^") == 4 + column - 1


# (name, body lines after HEAD, error class, line, column, words): literals whose value the
# program cannot hold, each at its own token with a caret (issue 31, item 13)
LITERALS = [
    ("float literal past float64", "  B(i) = V(i) * 1e400\n}", TCSyntaxError, 2, 17,
     "too large: it would be infinite"),
    ("long float literal", "  B(i) = V(i) * " + "9" * 5000 + ".0\n}", TCSyntaxError, 2, 17,
     "(5002 characters) is too large"),
    ("5,000-digit integer literal", "  B(i) = V(i) * " + "7" * 5000 + "\n}", TCSyntaxError, 2,
     17, "(5000 characters) does not fit in 64 bits"),
    ("integer literal past 64 bits", "  B(i) = V(i) * 0009223372036854775808\n}",
     TCSyntaxError, 2, 17, "does not fit in 64 bits"),
    ("float literal past float32 in float32", "  B(i) = V(i) * 1e39\n}", TCSemanticError, 2,
     17, "too large for float32"),
    ("negated float literal past float32", "  B(i) = V(i) * -1e39\n}", TCSemanticError, 2,
     18, "too large for float32"),
    ("float32 literal through a where-local", "  B(i) = V(i) * x where x = 2e39\n}",
     TCSemanticError, 2, 29, "too large for float32"),
    ("literal cast past half", "  B(i) = V(i) + float(half(70000.0))\n}", TCSemanticError, 2,
     23, "the constant 70000 is too large for float16"),
]
DIMENSIONS = [  # a literal dimension of a parameter
    ("5,000-digit dimension", "def f(float(" + "3" * 5000 + ") A) -> (B) {\n  B(i) = A(i)\n}",
     1, 13),
    ("dimension past 64 bits", "def f(float(2, 99999999999999999999) A) -> (B) {\n"
     "  B(i, j) = A(i, j)\n}", 1, 16),
]


@pytest.mark.parametrize("name,body,error,line,column,words", LITERALS,
                         ids=[g[0] for g in LITERALS])
def test_literal_errors(name, body, error, line, column, words):
    """Once, 1e400 became inf silently and a 5,000-digit integer was an "internal error"
    with no location (Python refuses to convert more than 4,300 digits)."""
    test_golden_error(name, body, error, line, column, words)


@pytest.mark.parametrize("name,source,line,column", DIMENSIONS, ids=[d[0] for d in DIMENSIONS])
def test_dimension_literal_errors(name, source, line, column):
    with pytest.raises(TCSyntaxError, match="does not fit in 64 bits") as info:
        check_source(source)
    assert (info.value.line, info.value.column) == (line, column)


def test_float_literals_promoted_to_float64_keep_their_value():
    """A literal past float32's range is fine where it is computed in float64, negated or
    not (negation once rounded a literal to float32 first: -0.1 was float32's 0.1 in float64
    arithmetic, -1e39 was -inf)."""
    from tclang.lang import program as P
    source = ("def f(double(N) A) -> (B, C, D) {\n  B(i) = A(i) * -1e39\n"
              "  C(i) = A(i) * -0.1\n  D(i) = double(1e39) + A(i) * 0\n}")
    constants = [node.value for s in check_source(source)["f"].statements
                 for node in P.walk(s.rhs) if isinstance(node, P.Const)]
    assert constants[:3] == [-1e39, -0.1, 1e39]


@pytest.mark.parametrize("source", ["", "  \n\n", "# only a comment\n\n  # and another\n"],
                         ids=["empty", "blank lines", "comments"])
def test_a_source_without_definitions_is_an_error(source):
    """tc.define("") once gave a module with no kernels, and the mistake showed only at the
    first `mod.name`."""
    with pytest.raises(TCSyntaxError, match="no definition") as info:
        check_source(source)
    assert info.value.line is not None and "def name(" in info.value.hint
