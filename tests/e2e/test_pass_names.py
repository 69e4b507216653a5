"""No rewrite before the scop moves a name where it means nothing (issue 31 follow-up).

kronecker_literal's second derivative (tc.grad of its backward) did not compile on any
backend: factoring a sum's scale out (tclang/lang/reduction_scales.py) took `B(s0 % 2,
s1 % 3)` out of a sum restricted to `m == s0 / 2` (tclang/lang/guarded_sums.py) into the
assignment after it, guard and all, and isl met `m` as an unknown name in the scop's text
(a TCCompileError with isl's "syntax error"). The guard is metadata of the read, not a node
of the tree, so a walk of the factor never met `m`. Here: that program and its relatives
against NumPy where the guard is needed (reads it keeps in bounds, rows with no term), the
check that closes the class (`check_names`, tclang/lang/passes/rewrite.py) blaming a pass
that breaks it, and every rewrite of every corpus program and of the second-order
gradients of the corpus checked by it.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

import tclang as tc
from polyhedral.pipeline import run_passes, scop_definition
from tclang.lang import program as P
from tclang.lang.affine import Compare, condition_and
from tclang.lang.frontend import check_source
from tclang.lang.guarded_sums import restrict_guarded_sums
from tclang.lang.passes.rewrite import check_names
from tclang.lang.reduction_scales import factor_out_scales
from tests.corpus import CASES

KRONECKER_DD = (
    "def k(double(M,N) A, double(2,3) B, double(S0,S1) dO, double(M,N) ddA) -> "
    "(double(S0,S1) ddO) { ddO(s0,s1) +=! s0 >= 0 && s0 < 2*M && m == s0 / 2 ? "
    "B(s0 % 2, s1 % 3) * ddA(m, n) : 0.0 where s0 in 0:S0, s1 in 0:S1, m in 0:M, n in 0:N }")


def test_kronecker_second_derivative_matches_numpy():
    """The reproducer, at the sizes gradgradcheck used (M=1, N=7: S0=2, S1=21), and with
    rows past 2*M that have no term (0 there)."""
    rng = np.random.default_rng(0)
    for M, N, S0, S1 in ((1, 7, 2, 21), (2, 2, 6, 6)):
        A, ddA = rng.standard_normal((M, N)), rng.standard_normal((M, N))
        B, dO = rng.standard_normal((2, 3)), rng.standard_normal((S0, S1))
        s0, s1 = np.indices((S0, S1))
        rows = ddA.sum(1)[np.minimum(s0 // 2, M - 1)]
        want = np.where(s0 < 2 * M, B[s0 % 2, s1 % 3] * rows, 0.0)
        for backend in ("cpu", "reference"):
            got = tc.define(KRONECKER_DD, backend=backend).k(A, B, dO, ddA)
            np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


# guarded sums whose factor reads a tensor and the guard names the reduction index m; the
# NumPy value of each for X (M) and W (S), S > 2M so that some rows have no term
GUARDED = {
    # an equality guard with a division (the kronecker shape)
    "equality": ("O(s) +=! m == s / 2 ? W(s) * X(m) : 0.0",
                 lambda s, m, X, W: np.where(m == s // 2, W[s] * X[m], 0.0)),
    # a range: the divisor W(s), taken out, would make the rows with no term 0 / 0
    "range": ("O(s) +=! m <= s && s < m + 2 ? X(m) / W(s) : 0.0",
              lambda s, m, X, W: np.where((m <= s) & (s < m + 2), X[m] / W[s], 0.0)),
    # a modulo
    "modulo": ("O(s) +=! (s - m) % 3 == 0 ? X(m) * W(s) : 0.0",
               lambda s, m, X, W: np.where((s - m) % 3 == 0, X[m] * W[s], 0.0)),
    # the guard keeps W(s - 1) in bounds: never W(-1) at s = 0
    "shifted": ("O(s) +=! s >= 1 && m == (s - 1) / 2 ? X(m) * W(s - 1) : 0.0",
                lambda s, m, X, W: np.where((s >= 1) & (m == (s - 1) // 2),
                                            X[m] * W[s - 1], 0.0)),
}


@pytest.mark.parametrize("backend", ["cpu", "reference"])
@pytest.mark.parametrize("name", GUARDED)
def test_guarded_sums_whose_factor_reads_match_numpy(name, backend):
    body, reference = GUARDED[name]
    source = (f"def f(double(M) X, double(S) W) -> (double(S) O) {{ {body} "
              "where s in 0:S, m in 0:M }")
    M, S = 3, 9
    X = np.array([2.0, -1.5, 4.0])
    W = np.array([1.0, 1.0, -2.0, 3.0, 0.5, 7.0, 0.0, 0.0, 0.0])  # rows 6-8: no term
    s, m = np.indices((S, M))
    with np.errstate(divide="ignore", invalid="ignore"):
        want = reference(s, m, X, W).sum(1)
    for options in (None, tc.Options(specialize=False)):
        got = tc.define(source, backend=backend, options=options).f(X, W)
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_a_factor_whose_guard_names_a_reduction_index_stays_in_the_sum():
    """factor_out_scales's own test of invariance: a read whose guard names a reduction
    index varies along it, even with no `?:` left in the tree and no condition on the
    statement (before, only index values in the factor counted)."""
    defn = restrict_guarded_sums(check_source(KRONECKER_DD).definitions[0])
    sizes = dict(M=1, N=7, S0=2, S1=21)
    assert factor_out_scales(defn, sizes) == defn  # a guarded sum keeps its factors
    bare = replace(defn, statements=tuple(replace(s, condition=None)
                                          for s in defn.statements))
    assert factor_out_scales(bare, sizes) == bare


def _hide_a_guard(defn: P.Definition) -> P.Definition:
    """A broken rewrite: the first read gets a guard naming an index `ghost` that no
    statement has, as reduction_scales.py's factor did."""
    from tclang.lang.affine import Affine

    def guard(e):
        if type(e) is P.Read:
            return replace(e, guard=condition_and(e.guard, Compare(">=", Affine.index("ghost"))))
        return P.with_children(e, tuple(guard(c) for c in P.children(e)))

    first = defn.statements[0]
    return replace(defn, statements=(replace(first, rhs=guard(first.rhs)),)
                   + defn.statements[1:])


def test_a_pass_that_misplaces_a_name_is_named(monkeypatch, fresh_middle_end):
    """With TCLANG_VERIFY=1 (the tests' setting) the pass is blamed by name; without it the
    check on what the scop is built from still says what is wrong. Never isl's syntax
    error, which names neither the statement nor the index."""
    import tclang.lang.passes as passes
    real = passes.hoist_size_expressions
    monkeypatch.setattr(passes, "hoist_size_expressions",
                        lambda defn, sizes: (_hide_a_guard(real(defn, sizes)[0]), []))
    x = np.arange(4.0)
    for verify, blamed in (("1", "hoisting of size expressions"),
                           ("0", "the rewrites before the scop")):
        monkeypatch.setenv("TCLANG_VERIFY", verify)
        source = f"def g{verify}(double(N) X) -> (O) {{ O(i) = X(i) * 2.0 }}"
        with pytest.raises(tc.TCCompileError) as info:
            tc.define(source).__getattr__(f"g{verify}")(x)
        message = str(info.value)
        assert blamed in message and "ghost" in message and "guard" in message
        assert "syntax error" not in message and "passes=False" in message


# ---- every rewrite of every corpus program and of its second derivatives -----------------

def _rewrites_name_only_what_they_have(defn: P.Definition, sizes) -> None:
    """Runs each rewrite of polyhedral/pipeline.py on `defn` with every output checked
    (`verify=True`: a TCCompileError naming the rewrite), for the configurations that
    choose between them."""
    configurations = [tc.Options(), tc.Options(reorder_reductions=False),
                      tc.Options(passes=False)]
    for options in configurations:
        store = sizes is not None and options.passes is not False
        rewritten, report, _ = run_passes(defn, sizes, options, store, verify=True)
        scop_definition(rewritten, sizes, options, report, verify=True)


def _second_order_sources(case, sizes: dict) -> list[tuple[str, dict]]:
    """The case's backward and, where tc.grad takes that, the backward of its backward
    (what tclang.torch's double backward compiles), with their training forwards, each
    with its sizes (a backward's own, S0 = 2*M and so on, evaluated)."""
    try:
        g = tc.grad(tc.define(case.source)[case.entry])
    except (tc.TCGradError, TypeError):
        return []
    first = {**sizes, **{k: v.evaluate(sizes) for k, v in g.plan.added_sizes.items()}}
    sources = [(g.forward_source, sizes), (g.source, first)]
    try:
        gg = tc.grad(tc.define(g.source)[g.plan.backward_name])
    except tc.TCGradError:
        return sources
    second = {**first, **{k: v.evaluate(first) for k, v in gg.plan.added_sizes.items()}}
    return sources + [(gg.forward_source, first), (gg.source, second)]


@pytest.mark.filterwarnings("ignore::tclang.TCWarning")  # the corpus's own, tested elsewhere
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_every_rewrite_of_the_corpus_and_its_gradients_names_only_what_it_has(case):
    for source, sizes in [(case.source, case.shapes[0]),
                          *_second_order_sources(case, case.shapes[0])]:
        for defn in check_source(source).definitions:
            check_names(defn, "the front end")
            _rewrites_name_only_what_they_have(defn, None)
            if set(defn.sizes) <= set(sizes):  # (not a def the entry does not call)
                _rewrites_name_only_what_they_have(defn, {n: sizes[n] for n in defn.sizes})
