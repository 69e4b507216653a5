"""The passes on the checked program (tclang/passes): each fires where it should and only
there, and a program computes the same with the passes as without them (bit for bit where
the compiler may not contract a product and a sum into one FMA)."""

from __future__ import annotations

import numpy as np
import pytest

import tclang as tc
from tclang.lang import program as P
from tclang.lang.frontend import check_source
from tclang.lang.passes import optimize, passes_text, share_within_statements
from tclang.lang.passes.common import share_across_statements
from tclang.lang.passes.dead_code import eliminate_dead_code
from tclang.lang.passes.folding import fold_constants, simplify_algebra
from tclang.lang.passes.hoisting import hoist_size_expressions
from tclang.lang.program_text import expression_text, statement_text


def definition(body: str, signature: str = "float(N) X, float(N) Y, int32(N) K") -> P.Definition:
    return check_source(f"def f({signature}) -> (O) {{\n{body}\n}}").definitions[0]


def rhs_text(defn: P.Definition, target: str = "O") -> str:
    return expression_text(next(s for s in defn.statements if s.target == target).rhs)


# ---- constant folding ----------------------------------------------------------------------

@pytest.mark.parametrize("expression,folded", [
    ("X(i) + 2.0 * 3.0", "X(i) + 6.0"),
    ("X(i) + float(7 / 2)", "X(i) + 3.0"),              # integer / is floor division
    ("X(i) + float(-7 / 2)", "X(i) + -4.0"),
    ("X(i) + float(7 % 0)", "X(i) + 0.0"),              # a zero divisor gives 0
    ("X(i) + float(int8(100) + int8(100))", "X(i) + -56.0"),  # int8 wraps
    ("(1 < 2) ? X(i) : Y(i) where i in 0:N", "X(i)"),  # the selected branch only
    ("X(i) * (0.1 + 0.2)", "X(i) * 0.30000001192092896"),  # in float32, as at run time
])
def test_constant_folding_fires(expression, folded):
    defn, notes = fold_constants(definition(f"O(i) = {expression}"))
    assert rhs_text(defn) == folded and notes


@pytest.mark.parametrize("expression", [
    "X(i) + exp(1.0)",            # the math library is not correctly rounded: left to run time
    "X(i) + fmod(5.0, 3.0)",
    "X(i) + 1.0 / 0.0",           # not finite
    "X(i) + float(int32(3.0e9))",  # float -> int saturates at run time
    "X(i) * 2.0",
])
def test_constant_folding_leaves_what_could_differ_at_run_time(expression):
    defn, notes = fold_constants(definition(f"O(i) = {expression}"))
    assert not notes and rhs_text(defn) == rhs_text(definition(f"O(i) = {expression}"))


def test_half_arithmetic_is_not_folded():
    defn = definition("O(i) = X(i) + float(half(1.0) + half(2.0))")
    folded, _ = fold_constants(defn)
    assert "+" in rhs_text(folded).split("float(")[1]  # half + half kept: float32 at run time


def test_sizes_are_constants_when_specialized():
    defn = definition("O(i) = X(i) * (1.0 / float(N))")
    generic, _ = fold_constants(defn)
    assert rhs_text(generic) == "X(i) * (1.0 / float(N))"
    specialized, _ = fold_constants(defn, {"N": 4})
    assert rhs_text(specialized) == "X(i) * 0.25"


# ---- algebraic simplification -------------------------------------------------------------

@pytest.mark.parametrize("expression,simplified", [
    ("X(i) * 1.0", "X(i)"), ("1.0 * X(i)", "X(i)"), ("X(i) / 1.0", "X(i)"),
    ("X(i) - 0.0", "X(i)"), ("X(i) + -0.0", "X(i)"), ("X(i) * -1.0", "-X(i)"),
    ("-(-X(i))", "X(i)"), ("float(K(i) + 0)", "float(K(i))"),
    ("float(K(i) * 0)", "float(0)"), ("(!(!(X(i) > 0.0))) ? X(i) : 0.0", "(X(i) > 0.0 ? X(i) : 0.0)"),
])
def test_simplification_fires(expression, simplified):
    defn, notes = simplify_algebra(definition(f"O(i) = {expression}"))
    assert rhs_text(defn) == simplified and notes


@pytest.mark.parametrize("expression", [
    "X(i) + 0.0",     # -0.0 + 0.0 is +0.0
    "X(i) * 0.0",     # NaN, inf and -0.0
    "X(i) - X(i)",    # inf - inf is NaN
    "X(i) - -0.0",
])
def test_simplification_leaves_what_ieee_does_not_allow(expression):
    defn, notes = simplify_algebra(definition(f"O(i) = {expression}"))
    assert not notes


def test_integer_times_zero_keeps_a_gather():
    defn = definition("O(i) = float(K(K(i)) * 0)")
    simplified, notes = simplify_algebra(defn)
    assert not notes  # K(K(i)) may be out of bounds: its error must still come


# ---- common subexpressions ----------------------------------------------------------------

def test_cse_across_statements_reads_the_stored_value():
    defn = definition("T(i) = exp(X(i)) * Y(i)\nO(j) = exp(X(j)) * Y(j) + 1.0")
    shared, notes = share_across_statements(defn)
    assert rhs_text(shared) == "T(j) + 1.0" and notes


@pytest.mark.parametrize("body", [
    "T(i) +=! exp(X(i)) * Y(i)\nO(j) = exp(X(j)) * Y(j)",                 # a reduction
    "T(i) = exp(X(i)) * Y(i)\nT(i) = T(i) * 2.0\nO(j) = exp(X(j)) * Y(j)",  # written again
    "T(i) = exp(X(i)) * Y(i)\nO(j) = (X(j) > 0.0) ? exp(X(j)) * Y(j) : 0.0",  # in a branch
    "T(i) = exp(X(i)) * Y(i) where i in 0:2\nO(j) = exp(X(j)) * Y(j)",    # fewer points
    "T(i) = X(i) * Y(i)\nO(j) = X(j) * Y(j + 0)",                         # same, other read
])
def test_cse_across_statements_does_not_fire_where_the_value_may_differ(body):
    defn = definition(body)
    shared, notes = share_across_statements(defn)
    assert not notes


def test_cse_across_statements_respects_writes_in_between():
    source = ("def f(float(N) X, float(N) Y) -> (O, U) {\n"
              "  T(i) = exp(X(i))\n  U(i) = T(i) * 2.0\n  O(j) = exp(X(j))\n}\n")
    defn = check_source(source).definitions[0]
    shared, notes = share_across_statements(defn)
    assert notes  # nothing writes X between T and O
    source = source.replace("U(i) = T(i) * 2.0", "U(i) = T(i) * 2.0\n  W(i) = X(i)")
    assert share_across_statements(check_source(source).definitions[0])[1]


def _pair_loop_sharing(defn: P.Definition):
    """share_across_statements as a plain loop over every pair (its former form, cubic in
    the statements): the specification the indexed pass must meet."""
    from collections import Counter
    from dataclasses import replace
    from tclang.lang.passes.common import _provides, _replace_matches
    from tclang.lang.passes.rewrite import renumber_reads
    writers = Counter(s.target for s in defn.statements)
    statements = list(defn.statements)
    notes = []
    provides = [_provides(defn, s, writers) for s in statements]
    for j in range(len(statements)):
        for i in range(j):
            earlier, later = statements[i], statements[j]
            if not provides[i]:
                continue
            written = {s.target for s in statements[i + 1:j + 1]}
            if written & {r.tensor for r in earlier.reads()}:
                continue
            found = []
            rhs = _replace_matches(later.rhs, earlier, later, found)
            if found:
                statements[j] = replace(later, rhs=renumber_reads(rhs))
                provides[j] = _provides(defn, statements[j], writers)
                notes += [f"{later.target}: {text}  ->  reads {earlier.target}, which "
                          "holds it" for text in found]
    return replace(defn, statements=tuple(statements)) if notes else defn, notes


def _sharing_program(rng, n: int) -> P.Definition:
    """Statements that recompute what earlier ones computed, whole or in part, at renamed
    indices, some written again in between: sharing fires often, in chains."""
    values = ["exp(X(i))", "X(i) * Y(i)", "Y(i) + 1.0"]
    body = []
    for k in range(n):
        a, b = rng.choice(values), rng.choice(values)
        value = rng.choice([f"({a}) * ({b})", f"({a}) + 2.0", f"sqrt(({a}) + ({b}))", a])
        target = rng.choice([f"T{k}", f"T{k}", "W"]) if k < n - 1 else "O"
        line = f"{target}(i) = {value}"
        body.append(line.replace("(i)", "(j)") if k % 2 else line)  # renamed indices
        if rng.random() < 0.1:
            body.append("W(i) = X(i) + 3.0")
        values.append(value)
    return definition("\n".join(body))


@pytest.mark.filterwarnings("ignore::tclang.errors.TCWarning")
def test_indexed_sharing_is_the_pair_loop():
    """The same rewrites and notes as the loop over every pair, on the corpus, on
    generated programs, and on programs made for sharing."""
    import random
    from tclang.fuzzing.generator import generate
    from tests.corpus import CASES
    rng = random.Random(7)
    defs = [d for case in CASES for d in check_source(case.source).definitions]
    defs += [next(d for d in check_source(p.source).definitions if d.name == p.entry)
             for p in (generate(rng) for _ in range(60))]
    defs += [_sharing_program(rng, rng.randint(3, 25)) for _ in range(60)]
    fired = 0
    for defn in defs:
        ours, expected = share_across_statements(defn), _pair_loop_sharing(defn)
        assert ours[1] == expected[1] and ours[0] == expected[0], defn.name
        fired += bool(ours[1])
    assert fired >= 40


def _cpu(function, *args) -> float:
    import time
    best = float("inf")
    for _ in range(2):
        start = time.process_time()
        function(*args)
        best = min(best, time.process_time() - start)
    return max(best, 1e-3)


def test_sharing_and_dead_code_grow_linearly():
    """Four times the statements, about four times the time (at most eight: CPU time on
    a shared machine). Before, sharing tried every pair of statements and scanned the
    statements between them (1,000 temporaries each read by the next: 115 s, x64 for x4
    the statements), and dead code elimination went over every statement once per
    temporary found live (x16)."""
    from benchmarks.many_statements import source
    small, large = (check_source(source(n, "temporaries")).definitions[0] for n in (150, 600))
    for function in (share_across_statements, eliminate_dead_code):
        ratio = _cpu(function, large) / _cpu(function, small)
        assert ratio < 8, f"{function.__name__}: x{ratio:.1f}"


def test_cse_within_a_statement_binds_once():
    defn = definition("O(i) = exp(X(i) - Y(i)) / (1.0 + exp(X(i) - Y(i)))")
    shared, notes = share_within_statements(defn)
    assert rhs_text(shared) == "let cse0 = exp(X(i) - Y(i)) in cse0 / (1.0 + cse0)"
    assert notes == ["O: exp(X(i) - Y(i)) computed once"]
    refs = [r.ref for r in P.reads_of(shared.statements[0].rhs)]
    assert refs == list(range(len(refs)))  # reads numbered again, no duplicate


def test_cse_within_a_statement_leaves_branches_alone():
    defn = definition("O(i) = (X(i) > 0.0) ? exp(Y(i)) : exp(Y(i)) * 2.0")
    assert not share_within_statements(defn)[1]


def test_cse_within_orders_nested_bindings():
    defn = definition("O(i) = (exp(X(i)) * 2.0) + (exp(X(i)) * 2.0) + exp(X(i))")
    shared, _ = share_within_statements(defn)
    assert rhs_text(shared) == ("let cse1 = exp(X(i)) in let cse0 = cse1 * 2.0 in "
                                "(cse0 + cse0) + cse1")


# ---- hoisting and dead code ---------------------------------------------------------------

def test_hoisting_of_a_size_expression_in_generic_code():
    defn = definition("O(i) = X(i) * (1.0 / float(N))")
    hoisted, notes = hoist_size_expressions(defn, None)
    assert [statement_text(s) for s in hoisted.statements] == [
        "size_value0 = 1.0 / float(N)", "O(i) = X(i) * size_value0"]
    assert hoisted.tensor("size_value0").rank == 0 and notes
    assert not hoist_size_expressions(defn, {"N": 4})[1]  # specialized: folding's job


@pytest.mark.parametrize("expression", ["X(i) * float(N)", "X(i) + float(N * 2)",
                                        "float(K(i) / N)"])
def test_hoisting_leaves_cheap_or_integer_expressions(expression):
    assert not hoist_size_expressions(definition(f"O(i) = {expression}"), None)[1]


def test_dead_code_removes_unused_temporaries_and_chains():
    defn = definition("A(i) = exp(X(i))\nB(i) = A(i) * 2.0\nC(i) = Y(i)\nO(i) = C(i) + 1.0")
    alive, notes = eliminate_dead_code(defn)
    assert [s.target for s in alive.statements] == ["C", "O"]
    assert {t.name for t in alive.temporaries} == {"C"} and len(notes) == 2
    assert [s.position for s in alive.statements] == [0, 1]


def test_dead_code_keeps_everything_an_output_reads():
    defn = definition("A(i) = exp(X(i))\nO(i) = A(i)")
    assert not eliminate_dead_code(defn)[1]


def test_the_dead_temporary_is_gone_from_the_loops():
    source = ("def f(float(N) X) -> (O) {\n  unused(i) = exp(X(i))\n  O(i) = X(i) * 2.0\n}\n")
    x = np.arange(5, dtype=np.float32)
    on = tc.define(source).f.compile(x)
    off = tc.define(source, options=tc.Options(passes=False)).f.compile(x)
    assert "unused" not in on.loops and "unused" in off.loops
    text = on.stage_text("passes")
    assert "unused: no output depends on it; 1 statement removed" in text
    assert "(passes off" in off.stage_text("passes")


def test_optimize_reports_every_pass():
    defn = definition("O(i) = X(i) * 1.0")
    optimized, report = optimize(defn)
    names = [name for name, _ in report]
    assert names[:2] == ["constant folding", "algebraic simplification"]
    assert "algebraic simplification:\n    X(i) * 1.0  ->  X(i)" in passes_text(optimized, report)


# ---- the same results with and without the passes ----------------------------------------

PROGRAMS = {
    "all passes": ("def f(float(N, D) I, float(D) w) -> (O, S) {\n"
                   "  dead(n) +=! I(n, d)\n"
                   "  t(n, d) = exp(I(n, d) * 1.0) * w(d)\n"
                   "  O(n, d) = exp(I(n, d)) * w(d) / (1.0 + exp(I(n, d)) * w(d)) + 2.0 * 3.0\n"
                   "  S(n) +=! tanh(I(n, d) - w(d)) * tanh(I(n, d) - w(d)) / float(D)\n}\n"),
    "guards": ("def f(float(N, D) I, float(D) w) -> (O) {\n"
               "  O(n, d) = (1 > 2) ? I(n, d) : ((d >= 1) ? I(n, d - 1) * (1.0 / float(N)) "
               ": -(-w(d))) where n in 0:N, d in 0:D\n}\n"),
    "integers": ("def f(int32(N, D) I, float(D) w) -> (O) {\n"
                 "  O(n, d) = float(I(n, d) * 1 + 0) * w(d) + float(7 / 2)\n}\n"),
}


@pytest.mark.parametrize("backend", ["cpu", "reference", "cuda-emulated"])
@pytest.mark.parametrize("specialize", [True, False], ids=["specialized", "generic"])
@pytest.mark.parametrize("name", list(PROGRAMS))
def test_passes_change_no_result(name, specialize, backend):
    if backend == "cuda-emulated":
        import shutil
        if shutil.which("g++") is None:
            pytest.skip("no g++ for the emulated GPU")
        if name == "integers":
            pytest.skip("folding and sharing are covered on the emulated GPU by the others")
    source = PROGRAMS[name]
    exact = tc.Options(specialize=specialize, reorder_reductions=False)
    rng = np.random.default_rng(1)
    for n, d in ((1, 7), (13, 11)):
        first = (rng.integers(-5, 5, (n, d)).astype(np.int32) if name == "integers"
                 else rng.uniform(-2, 2, (n, d)).astype(np.float32))
        inputs = (first, rng.uniform(-2, 2, d).astype(np.float32))
        with_passes = tc.define(source, backend=backend, options=exact).f(*inputs)
        without = tc.define(source, backend=backend,
                            options=tc.Options(specialize=specialize, reorder_reductions=False,
                                               passes=False)).f(*inputs)
        with_passes = with_passes if isinstance(with_passes, tuple) else (with_passes,)
        without = without if isinstance(without, tuple) else (without,)
        for a, b in zip(with_passes, without):
            np.testing.assert_array_equal(a, b)  # bit for bit
