"""Golden errors of scatters (tclang/lang/scatters.py): the refused forms, each at its
exact line and column, with a message that says why and a hint that says what to write."""

import pytest

from tclang.errors import TCSemanticError, TCSyntaxError
from tclang.lang.frontend import check_source

HEAD = "def f(int32(N) Ids, float(N) X, float(E) Like, float(N, D) Y) -> (float(E) H) {\n"

# (name, body lines after HEAD, error class, line, column, words in the message, in the hint)
GOLDEN = [
    ("assignment", "  H(Ids(i)) = X(i)\n}", TCSemanticError, 2, 13, "`=` cannot scatter",
     "+=!"),
    ("product", "  H(Ids(i)) *=! X(i)\n}", TCSemanticError, 2, 13, "`*=!` cannot scatter",
     "+="),
    ("unknown shape", "  H(i) = Like(i)\n  T(Ids(i)) +=! X(i)\n}", TCSemanticError, 3, 3,
     "T's shape cannot be inferred", "declare it"),
    ("float subscript", "  H(X(i)) +=! 1.0\n}", TCSemanticError, 2, 5, "must be an integer",
     "int32"),
    ("reads its target", "  H(e) = Like(e)\n  H(Ids(i)) += H(i)\n}", TCSemanticError, 3, 16,
     "updates H and also reads it", "another tensor"),
    ("rank", "  H(Ids(i), d) +=! Y(i, d)\n}", TCSemanticError, 2, 3, "rank 1", None),
    ("size on the left", "  H(Ids(i)) +=! 1.0\n  H(N) +=! 1.0\n}", TCSemanticError, 3, 5,
     "N is a size", None),
    ("triangular range", "  H(Ids(i)) +=! Y(i, j) where j in 0:i + 1\n}", TCSemanticError,
     2, 31, "only sizes and integer literals", "mask"),
    ("expression not a call", "  H(Ids(i) + 1) +=! 1.0\n}", TCSyntaxError, 2, 12,
     "unexpected '+'", None),
]


@pytest.mark.parametrize("name,body,error,line,column,words,hint", GOLDEN,
                         ids=[g[0] for g in GOLDEN])
def test_scatter_golden_error(name, body, error, line, column, words, hint):
    with pytest.raises(error) as info:
        check_source(HEAD + body)
    err = info.value
    assert (err.line, err.column) == (line, column), str(err)
    assert words in str(err)
    if hint is not None:
        assert hint in (err.hint or "")


def test_a_scatter_checks_and_infers_its_ranges():
    program = check_source(HEAD + "  H(Ids(i)) +=! X(i)\n}")
    reset, scatter = program["f"].statements
    assert reset.indices == ("s0",) and reset.op == "=" and scatter.is_scatter
    assert scatter.indices == () and scatter.reduction_indices == ("i",)
    assert str(scatter.range_of("i").hi) == "N"
