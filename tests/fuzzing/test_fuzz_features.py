"""The fuzzer's reach (issue 31): what `tclang fuzz` draws besides the generic programs,
and that each extra check finds the bug class it is there for.

- programs: a share of guarded, masked and triangular reductions at extents near 32 and
  1024; modules of several definitions in random layouts; `tc.grad`, gradcheck,
  gradgradcheck, the tuner's options and interrupted compiles, all drawn from the seed;
- each check is shown a bug of its class, put in on purpose (a cache key made from the
  definition's line, a gradient off by half, a SIGINT ignored, a child that segfaults)
  and must report it, and must pass where there is none.

The checks run in this process (they fork their own children); every test gets a cache
directory of its own. A run over many programs is `-m slow`.
"""

from __future__ import annotations

import os
import random
import signal
import time
from collections import Counter
from dataclasses import replace

import numpy as np
import pytest

import tclang
from tclang.fuzzing import differential, gradients, interrupts, modules, running
from tclang.fuzzing.features import SHARES, fuzz_program
from tclang.fuzzing.generator import (Decl, Features, GeneratedProgram, Model, Node, Stmt,
                                      finish, generate)
from tclang.tools.inputs import random_inputs
from tclang.lang.frontend import check_source


@pytest.fixture
def cache(tmp_path, monkeypatch):
    path = tmp_path / "cache"
    monkeypatch.setenv("TCLANG_CACHE_DIR", str(path))
    from tclang.driver.compiler import forget_compiled
    forget_compiled()
    yield path
    forget_compiled()


def scaled(name: str, factor: str) -> GeneratedProgram:
    """`Y(i) = X(i) * factor`: two of them differ only in the constant."""
    model = Model(name, (Decl("X", "float", ("N",)),), (Decl("Y", None),),
                  (Stmt("Y", ("i",), "=", Node(f"X(i) * {factor}")),))
    return finish(model, random.Random(0), {"N": 5})


# ---- what is drawn ------------------------------------------------------------------------

def test_every_feature_is_drawn_from_the_seed():
    programs = [fuzz_program(random.Random(f"features:{k}")) for k in range(60)]
    again = fuzz_program(random.Random("features:7"))
    assert again.source == programs[7].source and again.features == programs[7].features
    seen = Counter()
    for p in programs:
        f = p.features
        recurrence = f.family.startswith("recurrence")
        seen.update({"reduction": f.family not in ("generic", "scatter") and not recurrence,
                     "recurrence": recurrence, "scatter": f.family == "scatter",
                     "module": f.module is not None,
                     "gradcheck": f.gradcheck, "gradgradcheck": f.gradgradcheck,
                     "tuner_options": f.tuner_options, "interrupt": f.interrupt is not None,
                     "grad": f.grad})
        if f.family == "generic":  # the generic generator's program, drawn as before
            assert p.source == generate(random.Random(f"features:{programs.index(p)}")).source
    assert seen["grad"] == len(programs)
    for name, share in SHARES.items():
        expected = share * len(programs) * (SHARES["gradcheck"] if name == "gradgradcheck"
                                            else 1)
        assert 0.3 * expected <= seen[name] <= 2.5 * expected + 3, (name, seen)


def test_reduction_programs_reach_the_warp_and_1024():
    from tclang.fuzzing.reductions import KINDS, reduction_program
    programs = [p for p in (reduction_program(random.Random(f"red:{k}")) for k in range(160))
                if p is not None]
    assert len(programs) >= 145
    assert {p.features.family for p in programs} == set(KINDS)
    extents = {v for p in programs for v in p.sizes.values()}
    assert extents & {31, 32, 33} and extents & {1023, 1024, 1025} and extents & {3, 5, 7}
    text = "\n".join(p.source for p in programs)
    for feature in ("(j <= i) ?", "+=!", "max=!", "min=!", "Mk(i, k)", "where", "exp(",
                    "half", "double", "int32", " += "):
        assert feature in text, feature
    # guarded sums past a warp: the emulated GPU's block reduction dropped the guard of
    # `Z(i) +=! (j <= i) ? S(i, j) : 0.0 where i in 0:T, j in 0:T` from T = 33 (and the
    # same triangle as a range, `where j in 0:i + 1`, takes the same path)
    past = [p for p in programs if p.features.family in ("triangular", "prefix", "guarded",
                                                         "ranged")
            and "+=!" in p.source and max(p.sizes.values()) > 32]
    # (0.15 before "permuted" came, 0.13 before "accumulated")
    assert len(past) >= 0.08 * len(programs), len(past)
    # permuted contractions around one and two vectors of lanes (issue 33 item 1)
    permuted = [p for p in programs if p.features.family == "permuted"]
    assert any(8 <= v < 16 for p in permuted for v in p.sizes.values())
    # and reads that are no plain index: a strided lane, an index again a row apart
    assert any(any(form in p.source for form in ("2*", " - 1", " + 1")) for p in permuted)


def test_module_layouts_keep_every_definition():
    plans = [p.features.module for p in (fuzz_program(random.Random(f"layout:{k}"), {
        "module": 1.0, "reduction": 0.3}) for k in range(8))]
    for plan in plans:
        for _, source, defs in plan.revisions():
            module = check_source(source)
            assert list(module.names) == [d.entry for d in defs]
            for d in defs:  # the same definition as alone, whatever the layout
                alone = check_source(d.source)[d.entry]
                assert [s.text for s in module[d.entry].statements] == \
                    [s.text for s in alone.statements]
        assert plan.edited is None or plan.edited.source != plan.defs[plan.edit_at].source
    defs = (scaled("a", "2.0"), scaled("b", "3.0"), scaled("c", "4.0"))
    texts = [modules.render_module(defs, seed) for seed in range(80)]
    assert all(list(check_source(t).names) == ["a", "b", "c"] for t in texts)
    text = "".join(texts)
    assert "\r\n" in text and "} def " in text and "}def " in text and "# " in text
    assert any("\r" in t and "\n" not in t for t in texts)  # old Mac line ends only
    assert {modules.layout_style(seed) for seed in range(80)} == set(modules.STYLES)


# ---- modules through the shared cache ----------------------------------------------------

def one_line_plan() -> modules.ModulePlan:
    """`def a ... def b ...` on one line; revision B edits b's constant."""
    seed = next(s for s in range(1000) if modules.layout_style(s) == "one line")
    a, b = scaled("a", "2.0"), scaled("b", "3.0")
    return modules.ModulePlan((a, b), 0, 1, scaled("b", "5.0"), seed, seed)


def test_the_module_check_finds_a_key_made_from_the_line(cache, monkeypatch):
    """bug 1: b's key made from the start of its line (a's tokens): the edited b runs the
    old b's kernel from the disk cache and from memory."""
    def from_the_line(defn):
        from tclang.lang.parser import _lark_parser
        text = "\n".join(defn.source.split("\n")[defn.span.line - 1:])
        tokens, depth = [], 0
        for tok in _lark_parser().lex(text):
            tokens.append(str(tok))
            depth += (tok == "{") - (tok == "}")
            if tok == "}" and depth == 0:
                break
        return " ".join(tokens)
    monkeypatch.setattr("tclang.driver.cachekey.canonical_source", from_the_line)
    monkeypatch.setattr("tclang.driver.compiler.canonical_source", from_the_line)  # the door
    failures, notes = modules.check_module(one_line_plan())
    wrong = [f for f in failures if f.kind == "wrong-cached-kernel"]
    assert wrong == failures and "revision B" in {f.detail.split(",")[0] for f in wrong}
    assert all(", b: " in f.detail and f.check == "module" for f in wrong)
    assert "REVISIONS" in wrong[0].repro and notes[0] == "module"


def test_the_module_check_passes_with_a_key_of_the_definition_alone(cache, monkeypatch):
    alone = lambda defn: repr((defn.name, defn.statements))  # noqa: E731
    monkeypatch.setattr("tclang.driver.cachekey.canonical_source", alone)
    monkeypatch.setattr("tclang.driver.compiler.canonical_source", alone)
    failures, _ = modules.check_module(one_line_plan())
    assert failures == []


# ---- gradients ----------------------------------------------------------------------------

CUBE = GeneratedProgram("def f(float(N) X, float(N) W) -> (Y) {\n"
                        "    Y(i) = X(i) * X(i) * X(i) + tanh(W(i))\n}\n", "f", {"N": 6})


def test_the_grad_check_finds_a_wrong_gradient(cache, monkeypatch):
    assert gradients.check_grad(CUBE) == ([], ["grad"])
    from tclang.autodiff import Gradient
    real = Gradient.backward
    monkeypatch.setattr(Gradient, "backward", lambda self, *a: tuple(
        g * 1.5 for g in real(self, *a)))
    failures, _ = gradients.check_grad(CUBE)
    assert [(f.kind, f.detail[:4]) for f in failures] == [("grad-mismatch", "d/dX"),
                                                          ("grad-mismatch", "d/dW")]


def test_a_wrong_forward_is_not_blamed_on_the_gradient(cache, monkeypatch):
    """The differences are taken of the compiled float64 forward: where that is wrong
    (here: every call after the first half as large again), the forward is reported."""
    from tclang.runtime.kernels import Kernel
    real, calls = Kernel.__call__, []

    def off(self, *args, **kwargs):
        calls.append(1)
        out = real(self, *args, **kwargs)
        wrong = self.name == "f" and self.module.backend == "cpu" and len(calls) > 1
        return out * 1.5 if wrong else out
    monkeypatch.setattr(Kernel, "__call__", off)
    failures, _ = gradients.check_grad(CUBE)
    assert [f.kind for f in failures] == ["mismatch"], failures
    assert "the float64 form's forward" in failures[0].detail


def test_the_grad_check_seeds_a_float32_output_with_float32(cache):
    """Only literals compute O: it stays float32 in the float64 form, and so must the
    output gradient the check passes (a float64 one was refused: TCArgumentError)."""
    program = GeneratedProgram("def f(float(N) B) -> (O) { O(i) = (B(i) > 0.0) ? 1.5 : -0.5 }",
                               "f", {"N": 5})
    assert gradients.check_grad(program) == ([], ["grad"])


SCATTER_MAX = GeneratedProgram(
    "def hist(int32(N) Ids, float(N, D) X, float(E, D) Tab) -> (float(E, D) O) {\n"
    "    O(e0, e1) = Tab(e0, e1)\n"
    "    O(Ids(i), d) max= X(i, d) * 0.5\n}\n", "hist", {"N": 11, "D": 3, "E": 7})


def test_the_grad_check_checks_scatters_by_max_and_min(cache, monkeypatch):
    """tc.grad refused them ("not differentiable"); the scatter family's max=/min= draws
    are checked now, and a wrong gradient of one is found. Elements a `!` scatter never
    updates keep -inf: left out of the objective, not a point "not smooth"."""
    assert gradients.check_grad(SCATTER_MAX) == ([], ["grad"])
    bang = GeneratedProgram("def f(int32(N) Ids, float(N) X, float(E) Tab) -> (float(E) O) "
                            "{ O(Ids(i)) min=! tanh(X(i)) + Tab(Ids(i)) }", "f",
                            {"N": 3, "E": 17})
    assert gradients.check_grad(bang) == ([], ["grad"])
    from tclang.fuzzing.scatters import scatter_program
    drawn = Counter()
    for k in range(300):
        program = scatter_program(random.Random(f"scatter-grad:{k}"))
        if program is None or "float" not in program.source or \
                not any(op in program.source for op in (" max=", " min=")):
            continue
        failures, notes = gradients.check_grad(program, seed=k)
        assert failures == [], (program.source, failures)
        drawn[notes[0]] += 1
        if sum(drawn.values()) == 6:
            break
    assert drawn["grad"] >= 5, drawn
    from tclang.autodiff import Gradient
    real = Gradient.backward
    monkeypatch.setattr(Gradient, "backward", lambda self, *a: tuple(
        g * 1.5 for g in real(self, *a)))
    failures, _ = gradients.check_grad(SCATTER_MAX)
    assert [(f.kind, f.detail[:6]) for f in failures] == [("grad-mismatch", "d/dX: "),
                                                          ("grad-mismatch", "d/dTab")]


def test_the_grad_check_counts_what_has_no_gradient(cache):
    floor = GeneratedProgram("def f(float(N) X) -> (Y) { Y(i) = floor(X(i)) }", "f", {"N": 3})
    assert gradients.check_grad(floor) == ([], ["grad: not differentiable"])
    kink = GeneratedProgram("def f(float(N) X) -> (Y) { Y(i) = fmax(X(i), 0.0) }", "f",
                            {"N": 4})
    # |x| with its kink within the step of x: the differences do not settle
    assert gradients.directional(lambda xs: float(np.abs(xs[0]).sum()), [np.full(1, 1e-7)],
                                 0, np.ones(1), 1.0, 1e-16) == "not smooth"
    assert gradients.check_grad(kink)[0] == []


@pytest.mark.skipif(not gradients.torch_available(), reason="PyTorch is not installed")
def test_the_torch_checks_agree_with_the_truth(cache):
    """gradgradcheck through tclang.torch on x^3: the check fails exactly when PyTorch's
    second derivative there is not 6x (it was 0: the backward recorded nothing)."""
    import torch

    import tclang.torch as tct
    fn = tct.function(gradients.float64_source(CUBE.source), "f")
    x = torch.linspace(0.5, 2.0, 6, dtype=torch.float64, requires_grad=True)
    w = torch.zeros(6, dtype=torch.float64, requires_grad=True)
    (gx,) = torch.autograd.grad(fn(x, w).sum(), x, create_graph=True)
    second = torch.autograd.grad(gx.sum(), x, allow_unused=True)[0] \
        if gx.requires_grad else None
    right = second is not None and torch.allclose(second, 6 * x.detach())
    first, _ = gradients.check_torch(CUBE, "gradcheck")
    assert first == []
    failures, _ = gradients.check_torch(CUBE, "gradgradcheck")
    assert (failures == []) == right, failures
    assert all(f.kind == "grad-mismatch" and "confirmed" in f.detail for f in failures)


@pytest.mark.skipif(not gradients.torch_available(), reason="PyTorch is not installed")
def test_gradcheck_finds_a_wrong_first_derivative(cache, monkeypatch):
    """A wrong first derivative planted where tclang.torch's backward runs (its backward
    definition, run as a tclang function of its own: `_differentiate`)."""
    import tclang.torch as tct
    real = tct._differentiate
    monkeypatch.setattr(tct, "_differentiate", lambda *a: tuple(
        g * 1.5 for g in real(*a)))
    failures, _ = gradients.check_torch(CUBE, "gradcheck")
    assert [f.kind for f in failures] == ["grad-mismatch"], failures


def test_a_gradient_that_cannot_be_built_is_a_crash(cache, monkeypatch):
    """Not a TCGradError: tc.grad (and tclang.torch, with PyTorch) must not raise it."""
    from tclang.autodiff import Gradient

    def broken(self, kernel, wrt=None):
        raise KeyError("k")
    monkeypatch.setattr(Gradient, "__init__", broken)
    failures, _ = gradients.check_grad(CUBE)
    assert [(f.kind, f.check) for f in failures] == [("crash", "grad")]
    assert "KeyError" in failures[0].detail and "tc.grad" in failures[0].repro
    if gradients.torch_available():
        failures, _ = gradients.check_torch(CUBE, "gradcheck")
        assert [(f.kind, f.check) for f in failures] == [("crash", "gradcheck")]


HALF = GeneratedProgram("def f(half(N) X, float(N) W) -> (Y) {\n"
                        "    Y(i) = X(i) * X(i) * W(i)\n}\n", "f", {"N": 7})


def test_the_grad_check_sees_a_half_gradient_that_fails_its_own_type_check(cache,
                                                                          monkeypatch):
    """The float64 form cannot see this class: a half input's backward assigned float32
    contributions to its half gradient ("would narrow it"), for any program. The check
    also runs tc.grad in the program's own types; with the rounding planted away again it
    reports a crash, and passes with it."""
    assert gradients.check_grad(HALF) == ([], ["grad"])
    from tclang.autodiff import adjoint
    from tclang.lang import program as P
    real = adjoint._Builder._emit

    def unrounded(self, *args, **kwargs):
        real(self, *args, **kwargs)
        e = self.emitted[-1]
        if isinstance(e.expr, P.Cast) and e.expr.dtype.is_narrow_float:
            e.expr = e.expr.operand
    monkeypatch.setattr(adjoint._Builder, "_emit", unrounded)
    failures, _ = gradients.check_grad(HALF)
    assert [(f.kind, f.check) for f in failures] == [("crash", "grad")], failures
    assert "own types" in failures[0].detail and "half" in failures[0].repro


def test_the_own_types_grad_check_calls_a_bfloat16_program_as_the_runner_does(cache):
    """Where NumPy has no bfloat16 the gradient comes back through torch tensors (the
    check reported "returns bfloat16 (dB), which NumPy has no type for": its own fault)."""
    program = GeneratedProgram("def f(bfloat16(N) X, float(N) W) -> (Y) "
                               "{ Y(i) = X(i) * W(i) }", "f", {"N": 5})
    assert gradients.native_grad(program) is None


def test_the_grad_checks_say_which_where_clauses_and_guards_they_reached(cache):
    """Each kind of `where` clause and guard a gradient was checked on is counted."""
    program = GeneratedProgram(
        "def f(float(N, N) S, float(N) X) -> (Z) {\n"
        "    T(i) +=! S(i, j) * s where j in 0:i + 1, s = 2.0\n"
        "    U(i) +=! X(j) * T(i) where exists X(j)\n"
        "    Z(i) = (i >= 1) ? U(i - 1) : 0.0 where i in 0:N\n}\n", "f", {"N": 5})
    failures, notes = gradients.check_grad(program)
    assert failures == [] and notes[0] == "grad", (failures, notes)
    assert set(notes[1:]) == {"grad of a where-local", "grad of a where range",
                              "grad of a range bounded by an index", "grad of where exists",
                              "grad of a guarded read"}, notes
    from tclang.fuzzing.driver import feature_summary
    line = feature_summary(Counter(notes + ["gradcheck of a guarded read"]))
    assert "tc.grad: a guarded read 1, a range bounded by an index 1" in line, line
    assert "torch gradcheck: a guarded read 1" in line, line


def test_generated_programs_reach_the_grad_of_where_clauses_and_guards():
    """Of the generic and reduction programs, some of each form get a gradient check."""
    want = {f"grad of {x}" for x in ("a where-local", "a where range", "where exists",
                                     "a range bounded by an index", "a guarded read")}
    forms: Counter = Counter()
    for k in range(300):  # (all are found within the first ~50 programs)
        program = fuzz_program(random.Random(f"where:{k}"), {"reduction": 0.5})
        if program.features.grad:
            try:
                forms.update(gradients.grad_forms(program.source, program.entry))
            except tclang.TCError:
                continue
        if want <= set(forms):
            break
    assert want <= set(forms), forms


# ---- interrupted compiles -----------------------------------------------------------------

REAL_CALL = running.call_program


def interrupted(program, delay: float, check_bounds: bool = False):
    defn = check_source(program.source)[program.entry]
    inputs = random_inputs(defn, program.sizes, np.random.default_rng(0))
    expected = REAL_CALL(program, *differential.ORACLE, inputs, check_bounds)
    return interrupts.check_interrupt(program, "cpu", None, inputs, expected, 1e-5, delay,
                                      check_bounds)


def misbehave_in_child(monkeypatch, child, parent=None):
    """`running.call_program` replaced: `child(real, *args)` in a forked child, `parent` (or
    the real call) here."""
    here, real = os.getpid(), running.call_program

    def call(*args, **kwargs):
        if os.getpid() != here:
            return child(real, *args, **kwargs)
        return (parent or real)(*args, **kwargs)
    monkeypatch.setattr(running, "call_program", call)
    monkeypatch.setattr(interrupts, "WAIT_AFTER", 1.0)


def slow(real, *args, **kwargs):
    time.sleep(3)  # the Ctrl-C lands here, inside the call
    return real(*args, **kwargs)


def test_an_interrupted_compile_that_recovers_passes(cache, monkeypatch):
    program = scaled("f", "2.0")
    misbehave_in_child(monkeypatch, slow)
    assert interrupted(program, 0.5) == ([], ["interrupt",
                                              "interrupt landed during the compile"])


def test_the_interrupt_check_finds_a_lost_interrupt(cache, monkeypatch):
    def deaf(real, *args, **kwargs):
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        return slow(real, *args, **kwargs)
    misbehave_in_child(monkeypatch, deaf)
    failures, _ = interrupted(scaled("f", "2.0"), 0.5)
    assert [f.kind for f in failures] == ["lost-interrupt"], failures


def test_the_interrupt_check_finds_an_interrupt_turned_into_an_error(cache, monkeypatch):
    def converts(real, *args, **kwargs):
        try:
            return slow(real, *args, **kwargs)
        except KeyboardInterrupt:
            raise tclang.TCCompileError("the optimizer process died") from None
    misbehave_in_child(monkeypatch, converts)
    failures, _ = interrupted(scaled("f", "2.0"), 0.5)
    assert [f.kind for f in failures] == ["lost-interrupt"]
    assert "came out as TCCompileError" in failures[0].detail


def test_the_interrupt_check_finds_a_crash(cache, monkeypatch):
    def segfault(real, *args, **kwargs):
        time.sleep(0.5)
        import faulthandler
        faulthandler.disable()  # pytest's dump of the child's stack says nothing here
        os.kill(os.getpid(), signal.SIGSEGV)
    misbehave_in_child(monkeypatch, segfault)
    failures, _ = interrupted(scaled("f", "2.0"), 0.2)
    assert [f.kind for f in failures] == ["crash"] and "SIGSEGV" in failures[0].detail


def test_the_interrupt_check_finds_a_wrong_cache_afterwards(cache, monkeypatch):
    def wrong(program, backend, options, inputs, check_bounds, twice=False):
        return tuple(o + 1 for o in real(program, backend, options, inputs, check_bounds))
    real = running.call_program
    misbehave_in_child(monkeypatch, slow, parent=wrong)
    failures, _ = interrupted(scaled("f", "2.0"), 0.5)
    assert [f.kind for f in failures] == ["wrong-cached-kernel"], failures


# ---- options, the runner and the command ---------------------------------------------------

def test_manual_options_come_from_the_tuners_space():
    from tclang.tuning.space import SearchSpace
    defn = check_source("def mm(float(M,K) A, float(K,N) B) -> (C) "
                        "{ C(m,n) +=! A(m,k) * B(k,n) }")["mm"]
    sizes = {"M": 24, "K": 40, "N": 17}
    rng = random.Random(3)
    configs = [differential.default_configs(defn, rng, ("cpu",), sizes=sizes,
                                            tuner=True)[1][1] for _ in range(40)]
    space = SearchSpace.of(defn, sizes, "cpu")
    for options in configs:
        point = dict(space.candidate(options))
        assert point["loop_order"] is None or set(point["loop_order"]) == {"m", "n", "k"}
    assert any(o.register_tile not in (None, False) for o in configs)
    assert any(o.tile and max(o.tile) >= 16 for o in configs)
    assert any(o.vector_width for o in configs) and any(o.unroll == 16 for o in configs)


def test_the_runner_runs_the_drawn_checks_and_says_so(cache):
    program = replace(scaled("f", "2.0"), features=Features(grad=True, tuner_options=True))
    report = differential.run_differential(program, backends=("cpu",), seed=1)
    assert report.status == "pass", report.failures
    assert {"grad", "options", "tuner options"} <= set(report.features)
    assert {"differential", "grad"} <= set(report.check_seconds)
    plain = differential.run_differential(program, backends=("cpu-auto",), checks=())
    assert "grad" not in plain.check_seconds


def test_the_summary_counts_each_feature():
    from tclang.fuzzing.driver import feature_summary
    line = feature_summary(Counter({"module": 4, "module layout cr": 3, "module layout lf": 1,
                                    "family triangular": 5, "family masked": 2,
                                    "family triangular on cuda-emulated": 2, "grad": 9,
                                    "grad: not differentiable": 3, "gradcheck": 2,
                                    "gradgradcheck": 1, "options": 10, "tuner options": 6,
                                    "interrupt": 2,
                                    "interrupt landed during the compile": 1}))
    for part in ("multi-def modules: 4 (cr 3, lf 1)", "guarded reductions: 7 (cuda-emulated "
                 "2; masked 2, triangular 5)", "grad: 9 (not differentiable 3)",
                 "torch gradcheck: 2", "gradgradcheck: 1", "options: 10 (tuner's space 6)",
                 "interrupted compiles: 2 (landed during the compile 1)"):
        assert part in line, line


def test_the_fuzz_command_shares_one_cache_and_prints_the_features(tmp_path, capsys,
                                                                   monkeypatch):
    import argparse

    from tclang.fuzzing.driver import add_command
    parser = argparse.ArgumentParser(prog="tclang")
    add_command(parser.add_subparsers())
    args = parser.parse_args(["fuzz", "--programs", "2", "--seed", "3", "--backends",
                              "cpu-auto", "--out", str(tmp_path / "out"), "--share",
                              "tuner_options=1", "--share", "reduction=1", "--share",
                              "gradcheck=0", "--share", "module=0", "--share",
                              "interrupt=0", "--cache-dir", str(tmp_path / "cache")])
    assert args.run(args) == 0, capsys.readouterr()
    out = capsys.readouterr().out
    assert "guarded reductions: 2" in out and "grad: " in out and "programs a minute" in out
    assert os.listdir(tmp_path / "cache")  # the workers' shared disk cache
    with pytest.raises(tclang.TCArgumentError, match="--share takes FEATURE=P"):
        args = parser.parse_args(["fuzz", "--share", "modules=1"])
        args.run(args)


def test_the_fuzz_loop_survives_a_dead_worker_on_the_first_program(tmp_path, capsys,
                                                                 monkeypatch):
    """A worker that died reports 0 s: the loop compared (0.0, None) with (0.0, 0) and
    ended with a TypeError instead of reporting the crash."""
    from tclang.fuzzing.driver import Worker, run_fuzz

    def died(self, program, **kwargs):
        return differential.Report(program, "fail", [differential.Failure(
            "cpu", None, "crash", "the worker process died (exit code -11)")])
    monkeypatch.setattr(Worker, "run", died)
    assert run_fuzz(2, None, 0, ("cpu-auto",), tmp_path, jobs=1, shrink_failures=False,
                    generate=lambda rng: scaled("f", "2.0")) == 1
    assert capsys.readouterr().out.strip().endswith("0 passed, 2 failed")


# ---- open bugs the extra checks found ----------------------------------------------------

def test_grad_keeps_where_clauses(cache):
    """Causal attention's pattern: a temporary summed under a triangle, read again.
    tc.grad raised TCSemanticError: its training forward dropped the where clause (fixed:
    the training forward keeps each statement's where clause, tclang/autodiff/adjoint.py)."""
    program = GeneratedProgram(
        "def f(float(N, N) S) -> (Z) {\n"
        "    T(i) +=! (j <= i) ? S(i, j) : 0.0 where i in 0:N, j in 0:N\n"
        "    Z(i) = T(i) * T(i)\n}\n", "f", {"N": 5})
    assert gradients.check_grad(program) == ([], ["grad", "grad of a where range",
                                                  "grad of a guarded read"])


def test_grad_of_a_shifted_diagonal(cache):
    """A shifted diagonal read: tc.grad raised a bare KeyError (adjoint.py), neither a
    gradient nor a TCGradError (FIXED grad-shifted-diagonal-keyerror: the second subscript,
    i - 1 with i := k + 1 solved from the first, is the left-side index k, an equality
    guard: dB(k, k2) = k2 == k ? dO(k + 1))."""
    program = GeneratedProgram("def f(float(K, K) B) -> (O) { O(i) = B(i - 1, i - 1) }",
                               "f", {"K": 4})
    assert gradients.check_grad(program) == ([], ["grad"])
    for body, shape, k in [("O(i) = B(i, i - 1)", "K, K", 4),
                           ("O(i) = B(i - 1, i + 1, i - 1)", "K, K, K", 5),
                           ("O(i, j) +=! B(i - 1, i - 1) * B(j, j)", "K, K", 4)]:
        source = f"def f(float({shape}) B) -> (O) {{ {body} }}"
        assert gradients.check_grad(GeneratedProgram(source, "f", {"K": k})) == ([], ["grad"])


def test_grad_of_a_max_of_a_product_with_a_quotient(cache):
    """max=!'s gradient goes to the candidates equal to the max, counted by recomputing
    each candidate; tc.grad printed `a * (b / c)` as `a * b / c`, which rounds otherwise,
    so rows whose max was not found again lost their gradient (or got NaN). FIXED
    grad-max-ties-reprinted: source_text keeps the parentheses of a right operand at the
    same level (tests/lang/test_grad_source_text.py)."""
    program = GeneratedProgram("def f(double(N, K) C, double(K) D) -> (O) {\n"
                               "    O(j) max=! C(j, k) * (D(k) / 3.0)\n}\n", "f",
                               {"N": 4, "K": 7})
    assert gradients.check_grad(program) == ([], ["grad"])


def test_grad_of_a_max_whose_candidates_round_otherwise_when_recomputed(cache):
    """max=!'s gradient goes to the candidates equal to the max. The backward recomputed
    each candidate, but a product feeding a sum may become one FMA and a division by a
    loop-invariant value a product with its reciprocal (docs/language.md) in one kernel
    and not in another, so a recomputed max was not equal to the saved one and its row
    lost its gradient (seed 1, program 86: 0.643 where the differences give 0.918).
    FIXED: a candidate that does such arithmetic is saved by the training forward, and the
    backward compares the saved candidates with the result."""
    source = ("def f(double(M, Q) X, double(2, Q) D) -> (O) {\n"
              "    O(j, k) max=! (X(j, k) * 0.5 + X(j, n)) / (D(m, k) + 3.0)\n}\n")
    program = GeneratedProgram(source, "f", {"M": 5, "Q": 2})
    for seed in range(3):
        assert gradients.check_grad(program, seed) == ([], ["grad"]), seed
    g = tclang.grad(tclang.define(source).f)
    assert "O_candidates(j, k, n, m) = " in g.forward_source, g.forward_source
    assert "O_candidates(j, k, n, m) == O(j, k)" in g.source, g.source


def test_grad_of_a_hypot_of_zeros(cache):
    """hypot's derivative (a x' + b y') / hypot(a, b) is 0/0 where a = b = 0: NaN, where
    hypot(A(i) * T(i), T(i)) with T = 0 (A < 9) does not move with A at all (seed 0, program 329,
    and seed 1, program 176). FIXED: 0 at the origin (docs/autodiff.md)."""
    program = GeneratedProgram("def f(double(N) A) -> (O) {\n"
                               "    T(i) = A(i) > 9.0 ? A(i) : 0.0\n"
                               "    O(i) = hypot(A(i) * T(i), T(i))\n}\n", "f", {"N": 4})
    assert gradients.check_grad(program) == ([], ["grad"])


def test_second_derivative_of_a_window(cache):
    """A windowed sum's second derivative through tclang.torch: tc.grad of the backward
    wrote a range bound that is a `max`/`min` of sizes, which the language refuses, so
    the double backward raised TCGradError ("does not check ... please report"). FIXED
    gradgrad-window-range-bound: a backward statement whose inferred range has a min or
    max in it gets its where range written out (tclang/autodiff/adjoint.py)."""
    pytest.importorskip("torch")
    program = GeneratedProgram("def f(float(Q) A) -> (O0, O1) {\n"
                               "    O0(i) +=! A(j + i) where j in 0:3\n"
                               "    O1(i) = O0(i) * O0(i)\n}\n", "f", {"Q": 5})
    assert gradients.check_torch(program, "gradgradcheck")[0] == []


@pytest.mark.parametrize("sizes", [dict(N=4, M=6), dict(N=1, M=3), dict(N=7, M=11)])
def test_grad_of_a_window_whose_output_index_is_also_a_value(cache, sizes):
    """The backward of a window reads dO padded (a transposed convolution written as a
    convolution), which drops the solved output index k; `k <= j` used k as a value too,
    so the backward named an index with no range ("please report"; fuzz seed 2029,
    program 221). Such a window keeps the guarded form."""
    program = GeneratedProgram("def f(float(N, M) A) -> (O) {\n    O(j, k) +=! ((k <= j) ? "
                               "2.0 : 0.5) * A(j, k + l) where l in 0:3\n}\n", "f", sizes)
    assert gradients.check_grad(program)[0] == []


@pytest.mark.parametrize("sizes", [dict(I=1, J=1, K=16, L=1, W=1), dict(I=3, J=2, K=5, L=2, W=7),
                                   dict(I=2, J=3, K=7, L=1, W=3)])
def test_grad_of_a_read_whose_index_range_is_a_min(cache, sizes):
    """k's range is 1:min(K - 1, W) + 1; the backward guarded its read of P by
    `k2 < min(K - 1, W) + 1`, a call the language does not read as a bound, so the read
    counted as unguarded and out of bounds ("please report"; fuzz seed 2029, program 20,
    drawn by the permuted family's new non-plain reads). The bound is written as the
    conjunction `k2 < K && k2 < W + 1` (sizes.pieces)."""
    program = GeneratedProgram("def permuted(float(L, W, K, I) P, float(L, K, J) Q) -> (Z) {\n"
                               "    Z(j, i) +=! P(l, k - 1, k, i - 1) * Q(l, k, j)\n}\n",
                               "permuted", sizes)
    assert gradients.check_grad(program)[0] == []


@pytest.mark.parametrize("sizes", [{"P": 2, "L": 4}, {"P": 3, "L": 5}, {"P": 1, "L": 1}])
def test_second_derivative_of_a_shifted_diagonal_read(cache, sizes):
    """The backward reads dT0(l + (l2 - l) / 2, (l2 - l) / 2); the backward of that solved
    the first subscript for l, which also stands inside its floor division, so l was
    defined by itself and left without a range: "cannot infer the range of index l ...
    please report" (fuzz seed 36, program 52). An index inside a division is not solved
    for: an equality guard and a sum over it instead (adjoint._pick)."""
    pytest.importorskip("torch")
    program = GeneratedProgram(
        "def fuzz(double(P) A, double(L, L) B) -> (O1) {\n"
        "    T0(i, j) = B(j, j) - 1.0 / (fabs((i - j >= 0 && i - j < L && j + i >= 0 && "
        "j + i <= L - 1) ? B(i - j, j + i) : 0.0) + 1.0) + A(i)\n"
        "    O1(j, i) = T0(i, j)\n}\n", "fuzz", sizes)
    assert gradients.check_torch(program, "gradgradcheck")[0] == []


@pytest.mark.parametrize("source, sizes", [
    # seed 2027, program 8: O's extent is max(N - 1, min(1, N - 1)) + 1, which is N
    ("O(i) = (i >= 2) ? tanh(0.5 * O(i - 2) + X(i)) : X(i)", {"N": 9}),
    # a read past i: the extent max(0, N - 2) + 1 is a max that stays one
    ("O(i) = (i >= 1) ? O(i - 1) * X(i) + X(i + 1) : X(i)", {"N": 7}),
    ("O(i) = (i >= 1) ? O(i - 1) * X(i) + X(i + 1) : X(i)", {"N": 1}),
    # two inputs: min(N, M), and the other statements' guards must read the same name
    ("O(i) = (i >= 1) ? tanh(O(i - 1)) + X(i) * Y(i) : X(i)", {"N": 7, "M": 5}),
    ("O(i) = (i >= 2) ? O(i - 2) * X(2*i) : X(i)", {"N": 9}),
])
def test_grad_of_a_scan_whose_extent_is_a_max(cache, source, sizes):
    """The reverse scan ran over its target's inferred extent written out, a max or min of
    sizes, in a `where` range, which a range bound cannot be (tc.grad raised "please
    report"): it now runs over a size name the backward's header binds (seed 2027)."""
    inputs = "float(N) X, float(M) Y" if "M" in sizes else "float(N) X"
    program = GeneratedProgram(f"def scan({inputs}) -> (O) {{\n    {source}\n}}\n",
                               "scan", sizes)
    assert gradients.check_grad(program)[0] == []


def test_grad_of_a_linear_scan_of_an_intermediate_with_such_an_extent_is_refused_clearly():
    """Nothing the backward takes has the intermediate's shape, so the size name cannot be
    bound: a TCGradError that says what to write instead, not "please report". (With Z(i)
    = T(i) * 2.0 instead, dZ has T's extent and binds it: covered by the fuzzer.)"""
    k = tclang.define("def f(float(N) X) -> (Z) {\n"
                  "    T(i) = (i >= 1) ? T(i - 1) + X(i + 1) : X(i)\n"
                  "    Z +=! T(j) * 2.0\n}\n")["f"]
    with pytest.raises(tclang.TCGradError) as err:
        tclang.grad(k)
    assert "where i in" in str(err.value) and "please report" not in str(err.value)


# ---- a run of many ------------------------------------------------------------------------

@pytest.mark.slow
def test_many_programs_with_every_feature(tmp_path, capsys):
    from tclang.fuzzing.driver import run_fuzz
    code = run_fuzz(200, None, 31, None, tmp_path / "out", jobs=2, shrink_failures=False,
                    program_seconds=60)  # correctness here; a loaded machine is slow
    out = capsys.readouterr().out
    assert code == 0, out + "\n".join(p.read_text()[:2000] for p in
                                      sorted((tmp_path / "out").glob("*.tc")))


def test_recurrence_programs_cover_every_kind_and_agree_with_the_oracle(cache):
    """Issue 35 item 2: the fuzzer draws recurrences (tclang/fuzzing/recurrences.py), valid
    by construction, of every kind, some long enough to leave a vector loop; a few run on
    the CPU and the reference against the oracle, with their gradients checked."""
    from tclang.fuzzing.recurrences import KINDS, recurrence_program
    programs = [p for p in (recurrence_program(random.Random(f"rec:{k}")) for k in range(80))
                if p is not None]
    assert len(programs) == 80
    assert {p.features.family for p in programs} == {f"recurrence {k}" for k in KINDS}
    assert max(max(p.sizes.values()) for p in programs) > 64
    drawn = [fuzz_program(random.Random(f"share:{k}"), {"recurrence": 1.0})
             for k in range(3)]
    assert all(p.features.family.startswith("recurrence") for p in drawn)
    small = [replace(p, sizes={s: min(v, 9) for s, v in p.sizes.items()},
                     features=replace(p.features, grad=True))
             for p in programs if p.features.family in ("recurrence scan",
                                                        "recurrence after")][:3]
    for program in small:
        report = differential.run_differential(program, backends=("cpu", "reference"),
                                               seed=1)
        assert report.status == "pass", (program.source, report.failures)


@pytest.mark.skipif(not gradients.torch_available(), reason="PyTorch is not installed")
def test_gradcheck_of_a_program_with_a_bool_output(cache):
    """gradcheck took differences of the bool output too, and PyTorch refused them
    ("Subtraction ... with two bool tensors is not supported"): a crash reported against
    tclang (seed 36, program 40). Only the floating-point outputs are checked."""
    program = GeneratedProgram(
        "def kernel(bool(L, P) A, float(L, L) B, int32 gamma, int32(P, L) G) -> "
        "(O0, O1, O2) {\n"
        "    O0(i, j) +=! (x ? B(i, j) : float(gamma)) where x = (B(i, j) <= 0.0)\n"
        "    O1(j, i) = (A(i, j) != x) where x = (gamma() != 0);\n"
        "    O2(i, j) max=! ((O0(i, i) < 1e30) ? (A(i, G(0, i)) ? 1.5 : -0.5) : O0(i, i)) "
        "where exists B(j, j);\n}\n", "kernel", {"L": 3, "P": 1})
    assert gradients.check_torch(program, "gradcheck")[0] == []


def test_scatter_draws_reach_the_threaded_cpu_path(cache):
    """The CPU runs a scatter with many updates into a small target on threads, into
    private copies (polyhedral/scatter_loops.py); the fuzzer's scatter draws were all too
    small for that path (VOLUME 20,000 instances) until a quarter of them drew many updates.
    One of those runs through the differential check, threads and all."""
    import math
    from polyhedral import scatter_loops
    from tclang.fuzzing import scatters
    assert scatters.PARALLEL_UPDATES == scatter_loops.PARALLEL_UPDATES
    programs = [p for p in (scatters.scatter_program(random.Random(f"scmany:{k}"))
                            for k in range(120)) if p is not None]

    def updates(p):
        s = next(s for s in check_source(p.source)[p.entry].statements if s.is_scatter)
        return math.prod((r.hi - r.lo).evaluate(p.sizes) for r in s.domain)
    # and half targets (their sums' float32-accumulator rewrite broke scatters: seed
    # 2030, program 724)
    assert any("half(E" in p.source for p in programs)
    many = [p for p in programs if updates(p) >= scatters.PARALLEL_UPDATES]
    assert len(many) >= 0.15 * len(programs), (len(many), len(programs))
    report = differential.run_differential(many[0], backends=("cpu", "reference"))
    assert report.status == "pass", report.failures


_HALF_BACKWARD = r'''
import numpy as np, tclang as tc, warnings
warnings.simplefilter("ignore")
from tclang.tools.inputs import random_inputs
source = SOURCE
k = tc.define(source)["kernel"]
g = tc.grad(k)
inputs = random_inputs(k.definition, {"Q": 3, "M": 3}, np.random.default_rng(0))
outs, saved = g.forward(*inputs)
args = list(inputs) + [saved[s.name] for s in g.plan.saved] + [np.ones(o.shape) for o in outs]
tc.define(g.plan.backward)[g.plan.backward_name](*args)
'''


def test_backward_of_a_half_window_in_a_parallel_vector_loop_runs(tmp_path):
    """tc.grad's backward kernel of this program (half A; a window `A(i + j) where j in
    0:3`; guarded reads) died with SIGSEGV on the CPU (fuzz seed 2030, program 323). Its
    `half(...)` of a double became, in LLVM's code generator, one double-to-half truncation
    lowered to a call of `__truncdfhf2`, which the process does not have: the ELF loader
    refused the object, and MCJIT linked the call to address 0 without a word. Casts of
    doubles to half now round to odd in float first (backends/llvm/types.py: no such call,
    and one rounding, as NumPy's), and both loaders refuse an object calling a function
    nobody has, by name (tests/backends/test_elf_loader.py). Run in a child process, so
    that a crash fails this test, not the test run."""
    import subprocess
    import sys
    source = ("def kernel(half(Q) A, float32(M, M) B, int32(M, M) C) -> (O1, O2) {\n"
              "    T0(i) min=! (int32(((Q - i >= 0 && Q - i < Q) ? A(Q - i) : 1)) % -3 - "
              "C(i, i))\n"
              "    O1(k, i) +=! (A(i + j) + fmax(((float(((M - k >= 0 && M - k < M) ? "
              "T0(M - k) : 0)) * float32(i)) * hypot(((j - 1 >= 0 && j - 1 <= Q - 1) ? "
              "A(j - 1) : 1), 0.5)), ((-double(k)) * ((false || (k >= Q)) ? ((Q - i >= 0 && "
              "Q - i < Q) ? A(Q - i) : 1) : double(((!(k - 2 < 0 || k - 2 >= M) && "
              "!(k - 2 < 0 || k - 2 >= M)) ? C(k - 2, k - 2) : 0)))))) where j in 0:3, "
              "k in 0:2*M\n"
              "    O2(i, j) = O1(i, j)\n}\n")
    env = dict(os.environ, TCLANG_CACHE_DIR=str(tmp_path))
    result = subprocess.run([sys.executable, "-c",
                             _HALF_BACKWARD.replace("SOURCE", repr(source))],
                            env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
