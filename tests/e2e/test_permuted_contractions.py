"""Contractions of any layout (issue 33 item 1): a seeded family of sums of products whose
operands and result hold their indices in random orders, several free and reduction
indices, checked against np.einsum on every backend, with C-ordered, Fortran-ordered and
strided arguments; and the layouts whose schedules packing and the register tiles changed,
at sizes where those run, on the CPU."""

import numpy as np
import pytest

import tclang as tc

BACKENDS = ["cpu", "reference", "cuda-emulated"]
LETTERS = "abcdefghij"
EXTENTS = (1, 2, 3, 5, 7)  # size-1, even, odd and prime extents


def generated(seed: int):
    """(source, einsum spec, operand shapes) of one random contraction: 1-3 free indices
    of each operand, 1-3 reduction indices, every tensor's indices in a random order."""
    rng = np.random.default_rng(seed)
    free_a, free_b, red = (int(rng.integers(1, 4)) for _ in range(3))
    names = LETTERS[:free_a + free_b + red]
    fa, fb, rd = names[:free_a], names[free_a:free_a + free_b], names[free_a + free_b:]
    size = {n: int(rng.choice(EXTENTS)) for n in names}
    a, b, o = (list(rng.permutation(list(x))) for x in (fa + rd, fb + rd, fa + fb))
    decl = lambda idx: ",".join(i.upper() for i in idx)  # noqa: E731
    source = (f"def f(float({decl(a)}) P, float({decl(b)}) Q) -> (O) {{ "
              f"O({','.join(o)}) +=! P({','.join(a)}) * Q({','.join(b)}) }}")
    spec = f"{''.join(a)},{''.join(b)}->{''.join(o)}"
    return source, spec, (tuple(size[i] for i in a), tuple(size[i] for i in b))


def arranged(x: np.ndarray, how: str) -> np.ndarray:
    """`x`'s values as a C-ordered, Fortran-ordered or strided (every other element of a
    larger array along each dimension) argument."""
    if how == "fortran":
        return np.asfortranarray(x)
    if how == "strided":
        big = np.zeros(tuple(2 * n for n in x.shape), x.dtype)
        view = big[tuple(slice(None, None, 2) for _ in x.shape)]
        view[...] = x
        return view
    return np.ascontiguousarray(x)


def check(source, spec, shapes, backend, how="c", seed=0):
    rng = np.random.default_rng(seed)
    p, q = (rng.standard_normal(s).astype(np.float32) for s in shapes)
    out = tc.define(source, backend=backend).f(arranged(p, how), arranged(q, how))
    expected = np.einsum(spec, p.astype(np.float64), q.astype(np.float64))
    reduced = max(1, p.size * q.size // max(1, expected.size))
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-5 * reduced ** 0.5)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("backend", BACKENDS)
def test_generated_contractions_match_einsum(seed, backend):
    check(*generated(seed), backend, how=("c", "fortran", "strided")[seed % 3], seed=seed)


#: layouts the register tiles and packing handle apart (see polyhedral/packing.py):
#: W read a row apart along the reduction (packed reduction-innermost with AVX2); the
#: result's stride-1 index read with a stride (P packed lanes-first, no dot form); a
#: stride-1 index of 8-15 values (a one-vector tile); X's sliver already contiguous
LAYOUTS = [
    ("def f(float(A,K,C) P, float(K,B) Q) -> (O) { O(a,b,c) +=! P(a,k,c) * Q(k,b) }",
     "akc,kb->abc", ((2, 41, 37), (41, 23))),
    ("def f(float(F,C,E,B,A) P, float(F,D,E) Q) -> (O) { O(a,d,c,b) +=! P(f,c,e,b,a) "
     "* Q(f,d,e) }", "fceba,fde->adcb", ((5, 3, 7, 19, 2), (5, 11, 7))),
    ("def f(float(G,C,B,F,A) P, float(G,D,E,F) Q) -> (O) { O(d,a,b,e,c) +=! "
     "P(g,c,b,f,a) * Q(g,d,e,f) }", "gcbfa,gdef->dabec", ((3, 11, 2, 5, 3), (3, 2, 13, 5))),
    ("def f(float(A,K,C) P, float(K,B) Q) -> (O) { O(a,b,c) +=! P(a,k,c) * Q(k,b) }",
     "akc,kb->abc", ((3, 29, 16), (29, 31))),
]


@pytest.mark.parametrize("case,how", [(k, h) for k in range(len(LAYOUTS))
                                      for h in ("c", ("fortran", "strided")[k % 2])])
def test_packed_layouts_match_einsum_on_the_cpu(case, how):
    check(*LAYOUTS[case], "cpu", how=how, seed=case)


@pytest.mark.parametrize("case", range(len(LAYOUTS)))
def test_packed_layouts_match_einsum_on_the_reference_backend(case):
    check(*LAYOUTS[case], "reference", seed=case)


def test_a_strided_lane_read_that_moves_with_the_rows_gets_no_endless_plan(tmp_path,
                                                                            monkeypatch):
    """The register-tile plan retried without packing chose the unpacked lanes-first
    form again where no dot form exists, and again: a RecursionError after ~50 s in the
    middle end's process (source fuzzer, a max=! over A(m - 1, 2*l - 4, m + 1, l) whose
    second call compiled the variant generic in M, Q and L)."""
    monkeypatch.setenv("TCLANG_CACHE_DIR", str(tmp_path))
    source = ("def helper(float32(M, Q, M, L) A, float16(M, M, Q, M) B) -> (O0) {\n"
              "    O0(j, m, k) max=! ((A(i, j, k, l) * 0.25 + (double(L) + ((!(m - 1 < 0 || "
              "m - 1 >= M) && 2*l - 4 >= 0 && 2*l - 4 <= Q - 1 && m + 1 >= 0 && m + 1 < M)"
              " ? A(m - 1, 2*l - 4, m + 1, l) : 1))) - B(i, k, j, m));\n}\n")
    from tclang.tools.inputs import random_inputs
    kernel = tc.define(source).helper
    oracle = tc.define(source, backend="reference").helper
    for sizes in ({"M": 3, "Q": 5, "L": 4}, {"M": 1, "Q": 1, "L": 1}, {"M": 2, "Q": 3, "L": 3}):
        inputs = random_inputs(kernel.definition, sizes, np.random.default_rng(0))
        np.testing.assert_allclose(kernel(*inputs), oracle(*inputs), rtol=1e-5, atol=1e-5)
