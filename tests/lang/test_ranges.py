"""Range inference: symbolic output shapes and index ranges (LANGUAGE.md section 5)."""

import itertools

import pytest

from tclang.lang import sizes as Z
from tclang.errors import TCSemanticError
from tclang.lang.frontend import check_source


def shape_of(source, tensor):
    d = check_source(source).definitions[0]
    return tuple(str(e) for e in d.tensor(tensor).shape)


def ranges_of(source, statement=0):
    s = check_source(source).definitions[0].statements[statement]
    return {r.name: (str(r.lo), str(r.hi)) for r in s.domain}


SHAPES = [
    ("matmul", "def f(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }",
     "C", ("M", "N")),
    ("batched matmul",
     "def f(float(B,N,M) X, float(B,M,K) Y) -> (Z) { Z(b,n,k) +=! X(b,n,m) * Y(b,m,k) }",
     "Z", ("B", "N", "K")),
    ("strided conv",
     "def f(float(N,C,H,W) I, float(M,C,KH,KW) Wt) -> (O) {"
     " O(n,m,h,w) +=! I(n,c,2*h + kh,2*w + kw) * Wt(m,c,kh,kw) }",
     "O", ("N", "M", "(H - KH) / 2 + 1", "(W - KW) / 2 + 1")),
    ("depthwise conv",
     "def f(float(N,C,H,W) I, float(C,KH,KW) Wt) -> (O) {"
     " O(n,c,h,w) +=! I(n,c,h + kh,w + kw) * Wt(c,kh,kw) }",
     "O", ("N", "C", "H - KH + 1", "W - KW + 1")),
    ("group conv",
     "def f(float(N,G,C,H,W) I, float(G,F,C,KH,KW) Wt) -> (O) {"
     " O(n,g,f,h,w) +=! I(n,g,c,h + kh,w + kw) * Wt(g,f,c,kh,kw) }",
     "O", ("N", "G", "F", "H - KH + 1", "W - KW + 1")),
    ("pooling with where",
     "def f(float(N,H,W) I) -> (O) { O(n,h,w) max=! I(n,2*h+kh,2*w+kw) where kh in 0:2, kw in 0:2 }",
     "O", ("N", "H / 2", "W / 2")),
    ("3x3 pooling stride 2",
     "def f(float(H) I) -> (O) { O(h) max=! I(2*h + kh) where kh in 0:3 }", "O", ("(H - 1) / 2",)),
    ("modulo subscript", "def f(float(N) A, float(4) T) -> (O) { O(i) = A(i) * T(i % 4) }",
     "O", ("N",)),
    ("division subscript", "def f(float(N) A) -> (O) { O(i) = A(i / 3) }", "O", ("3*N",)),
    ("reversal with where",
     "def f(float(N) A) -> (O) { O(i) = A(N - 1 - i) where i in 0:N }", "O", ("N",)),
    ("padding with guarded read",
     "def f(float(N) I) -> (O) { O(i) = (i >= 1 && i <= N) ? I(i - 1) : 0 where i in 0:N + 2 }",
     "O", ("N + 2",)),
    ("0-d output", "def f(float(N, M) A) -> (s) { s +=! A(i, j) }", "s", ()),
    ("TC classic", "def f(float(I0, I1, I2) I) -> (O) { O(i) +=! I(j, i + j, k) }",
     "O", ("I1 - I0 + 1",)),
    ("TC stencil", "def f(float(N) B, float(KK) K) -> (A) { A(i) +=! B(i + k) * K(k) }",
     "A", ("N - KK + 1",)),
    ("TC subsample", "def f(float(I) B) -> (A) { A(i) = B(2*i) }", "A", ("(I - 1) / 2 + 1",)),
    ("TC average pool", "def f(float(I) B) -> (A) { A(i) = B(2*i) + B(2*i + 1) }", "A", ("I / 2",)),
    ("TC shifted stencil", "def f(float(N) B, float(N) C) -> (A) { A(i) = B(i) + C(i - 2) }",
     "A", ("N",)),
    ("exists", "def f(float(N) A, float c) -> (B) { B(i) = c where exists A(i) }", "B", ("N",)),
    ("gather", "def f(float(E,D) T, int32(B,L) I) -> (O) { O(b,l,d) = T(I(b,l), d) }",
     "O", ("B", "L", "D")),
    ("max over statements",
     "def f(float(N) A, float(M) B) -> (O) { O(i) = A(i)  O(i) = B(i) }", "O", ("max(M, N)",)),
    ("where local in subscript",
     "def f(float(N) A) -> (O) { O(i) = A(j) where j = 2 * i }", "O", ("(N - 1) / 2 + 1",)),
    ("size arithmetic in range", "def f(float(N,M) A) -> (O) { O(i) = 1.0 where i in 0:N*M }",
     "O", ("M*N",)),
]


@pytest.mark.parametrize("name,source,tensor,expected", SHAPES, ids=[s[0] for s in SHAPES])
def test_inferred_shape(name, source, tensor, expected):
    assert shape_of(source, tensor) == expected


def test_classic_ranges():
    r = ranges_of("def f(float(I0, I1, I2) I) -> (O) { O(i) +=! I(j, i + j, k) }")
    assert r == {"i": ("0", "I1 - I0 + 1"), "j": ("0", "I0"), "k": ("0", "I2")}


def test_shifted_stencil_starts_at_two():
    r = ranges_of("def f(float(N) B, float(N) C) -> (A) { A(i) = B(i) + C(i - 2) }")
    assert r["i"] == ("2", "N")


def test_reversal_without_where_gives_an_obligation():
    d = check_source("def f(float(N) B) -> (A) { A(i) = B(10 - i) }").definitions[0]
    assert str(d.statements[0].domain[0].lo) == "-N + 11"
    (ob,) = [o for o in d.obligations if "below 0" in o.message]
    assert ob.holds({"N": 11}) and not ob.holds({"N": 12})


def test_declared_shape_obligation_checked_with_sizes():
    d = check_source("def f(float(N) A, float(M) B) -> (float(N) O) { O(i) = B(i) }").definitions[0]
    (ob,) = d.obligations
    assert ob.holds({"N": 5, "M": 5}) and not ob.holds({"N": 5, "M": 6})


def _domain_points(statement, env, grow=None):
    ranges = []
    for r in statement.domain:
        lo, hi = r.lo.evaluate(env), r.hi.evaluate(env)
        if r.name == grow:
            hi += 1
        ranges.append(range(lo, hi))
    names = [r.name for r in statement.domain]
    for values in itertools.product(*ranges):
        yield dict(zip(names, values), **env)


def _reads_in_bounds(definition, statement, point, env):
    for read in statement.reads() + list(statement.exists):
        if read.guard is not None:
            continue
        shape = [e.evaluate(env) for e in definition.tensor(read.tensor).shape]
        for a, extent in zip(read.affine, shape):
            if a is not None and not 0 <= a.evaluate(point) < extent:
                return False
    return True


@pytest.mark.parametrize("name,source,tensor,expected", SHAPES, ids=[s[0] for s in SHAPES])
def test_ranges_are_in_bounds_and_maximal(name, source, tensor, expected):
    """Brute force over small sizes: every point of the inferred domain reads in bounds,
    and growing an inferred left-side range by one would read out of bounds."""
    d = check_source(source).definitions[0]
    s = d.statements[0]
    names = sorted(d.sizes)
    for values in itertools.islice(itertools.product(range(1, 6), repeat=len(names)), 30):
        env = dict(zip(names, values))
        if not all(o.holds(env) for o in d.obligations):
            continue  # compilation refuses these sizes
        assert all(_reads_in_bounds(d, s, p, env) for p in _domain_points(s, env))
        inferred = [i for i in s.indices if i not in _where_ranged(source)]
        for index in inferred:
            grown = list(_domain_points(s, env, grow=index))
            if len(grown) == len(list(_domain_points(s, env))):
                continue  # another range is empty: growing adds no point
            if any(not _reads_in_bounds(d, s, p, env) for p in grown):
                continue
            # nothing bounds it further only when no unguarded read uses it
            assert not any(index in (a.indices() if a else ()) for r in s.reads()
                           if r.guard is None for a in r.affine), (name, env, index)


def _where_ranged(source):
    import re
    return set(re.findall(r"(\w+) in ", source))


def test_min_max_simplify():
    N, M = Z.size("N"), Z.size("M")
    assert Z.minimum(N - 1, N + 1) == N - 1
    assert str(Z.maximum(N, M)) == "max(M, N)"
    assert Z.floordiv(2 * N + 1, 2) == N
    assert str(Z.floordiv(N - 3, 2)) == "(N - 1) / 2 - 1"
    assert str(Z.minimum(Z.floordiv(N - 1, 2), Z.floordiv(N, 2) - 1) + 1) == "N / 2"


@pytest.mark.parametrize("expr", ["(H - KH) / 2 + 1", "min(N, M) - 1", "3*N - M + 2",
                                  "max(N / 3, M) + 2*K"])
def test_size_expressions_evaluate_like_python(expr):
    H, KH, N, M, K = (Z.size(n) for n in ("H", "KH", "N", "M", "K"))
    built = {"(H - KH) / 2 + 1": Z.floordiv(H - KH, 2) + 1, "min(N, M) - 1": Z.minimum(N, M) - 1,
             "3*N - M + 2": 3 * N - M + 2, "max(N / 3, M) + 2*K": Z.maximum(Z.floordiv(N, 3), M)
             + 2 * K}[expr]
    python = expr.replace("/", "//")
    for env in ({"H": 9, "KH": 3, "N": 7, "M": 2, "K": 5}, {"H": 4, "KH": 4, "N": 1, "M": 8, "K": 1}):
        assert built.evaluate(env) == eval(python, {"min": min, "max": max}, dict(env))


def test_unresolvable_index_suggests_where():
    with pytest.raises(TCSemanticError) as info:
        check_source("def f(float(N) A) -> (B) { B(i) +=! A(i + j) * A(j + i) }")
    assert "where" in info.value.hint
