"""Differential testing: one program, every backend and schedule, one oracle.

The oracle is the reference interpreter under the simplest schedule (no fusion, no tiling,
reductions in program order) on the program as written (no passes, tclang/passes). Every
other configuration (CPU with the automatic schedule, with random legal manual options,
shape-generic; the emulated GPU; the reference under the automatic schedule) runs on the
same inputs, bounds-checked, and must agree: exactly for integer and bool outputs, within
a tolerance scaled by the float type and the number of terms reduced for floats. A
mismatch, an exception, an out-of-bounds access or a modified input is a failure; an
illegal manual loop order is not (the compiler refuses it, as it should). `shrink` reduces
a failing program to a small one that fails the same way, and `save_regression` appends it
to tests/fuzzing/regressions.py.

Besides, each program gets the extra checks its `Features` drew (`tclang fuzz` draws them
from the program's seed; `checks=` picks some by name): a module of several definitions
in random layouts through the shared disk cache (modules.py), `tc.grad` against central
differences and `tclang.torch` through gradcheck and gradgradcheck (gradients.py), an
interrupted compile (interrupts.py), and manual options from the tuner's search space.
Their failures carry the check's name and, where the program's text alone does not
reproduce them, a script that does.
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

import tclang
from tclang.lang import program as P
from tclang.errors import TCArgumentError, TCError, TCIndexError, TCScheduleError
from tclang.lang.frontend import check_source
from tclang.fuzzing import running
from tclang.fuzzing.generator import VOLUME_CAP, GeneratedProgram, Model, finish
from tclang.fuzzing.running import (ORACLE, Failure, checked_definition, compare, describe,
                                    first_line, label, quiet, same_values, tolerance)
from tclang.tools.inputs import random_inputs

# Open bugs found by fuzzing, each with a strict-xfail regression in tests/fuzzing. With
# avoid_known, a configuration a bug applies to is skipped when the bug has no signature
# (it kills the process, or fails every run), else run, and a failure whose detail holds
# the signature is counted as the known bug: fuzzing keeps looking for new ones. Remove an
# entry when its bug is fixed. (name, applies(defn, backend, options, sizes), signature)
KNOWN_BUGS: list = [
    # grad-scan-extent-max-bound (the reverse scan of a recurrence whose target's extent
    # is a max/min of sizes wrote that extent into a where range) is fixed:
    # test_fuzz_features.py::test_grad_of_a_scan_whose_extent_is_a_max.
    # The four found before (no-loop-at-all, llvm-abort-unrolled-min-max,
    # tiled-reduction-out-of-order, cuda-block-reduction-rank) are fixed, and so are
    # grad-training-forward-drops-where and guarded-sum-factor-scop (issue 31's fixes);
    # their programs are in tests/fuzzing/regressions.py. grad-shifted-diagonal-keyerror
    # (tc.grad of `O(i) = B(i - 1, i - 1)` raised a bare KeyError) is fixed too: its
    # regression is test_fuzz_features.py::test_grad_of_a_shifted_diagonal; and
    # gradgrad-window-range-bound (the second derivative of `O(i) +=! A(j + i) where j in
    # 0:3` wrote a where bound with a min in it): test_second_derivative_of_a_window.
    # An entry looked like this:
    # ("cuda-block-reduction-rank",
    #  lambda defn, backend, options, sizes: backend.startswith("cuda") and any(
    #      s.reduction_indices and len(s.indices) > 1 for s in defn.statements),
    #  "conver"),  # g++: "cannot convert" (floats) or "invalid conversion" (ints)
]


@dataclass
class Report:
    program: GeneratedProgram
    status: str  # "pass", "fail", "invalid" (front end refused it), "skipped" (sizes)
    failures: list[Failure] = field(default_factory=list)
    ran: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # illegal manual schedules
    why: str = ""
    seconds: float = 0.0  # wall time in the fuzz worker (every configuration)
    peak_rss_mb: float = 0.0  # the fuzz worker's peak resident memory after this program
    features: list[str] = field(default_factory=list)  # what the program exercised
    check_seconds: dict = field(default_factory=dict)  # "differential" or check -> seconds

    @property
    def ok(self) -> bool:
        return self.status != "fail"


def cuda_emulation_available() -> bool:
    try:
        from backends.cuda.emulation.build import available
        return available()
    except Exception:  # noqa: BLE001 - no emulation at all is "not available"
        return False


def random_options(rng: random.Random, defn: P.Definition | None = None) -> tclang.Options:
    """Random manual knobs; the loop order is a permutation as long as some loop nest
    (it may still break a dependence or not fit another nest: then it is skipped)."""
    depth = max((len(s.all_indices) for s in defn.statements), default=1) if defn else 2
    order = None
    if depth > 1 and rng.random() < 0.4:
        order = tuple(rng.sample(range(depth), depth))
    tile = rng.choice((None, (), rng.randint(1, 5), tuple(rng.choice((0, 1, 2, 3, 4, 8))
                                                         for _ in range(rng.randint(1, 3)))))
    return tclang.Options(fusion=rng.choice(("max", "min", "preserve_parallel", None)), tile=tile,
                          unroll=rng.choice((None, 1, 2, 4)), loop_order=order,
                          parallel=rng.choice((None, True, False)),
                          vectorize=rng.choice((None, True, False)),
                          reorder_reductions=rng.choice((None, None, False)),
                          register_tile=rng.choice((None, None, False,
                                                    (rng.randint(1, 6), rng.choice((4, 8, 16))))),
                          pack=rng.choice((None, None, True, False)),
                          passes=rng.choice((None, None, None, False)))


def tuner_options(rng: random.Random, defn: P.Definition, sizes: dict[str, int],
                  backend: str = "cpu") -> tclang.Options:
    """Manual options as the tuner draws them: a random point of the kernel's search
    space (tclang/tuning/space.py: per-member tile sizes up to 512, loop orders by index
    name, unroll up to 16, vector widths, register tiles sized for the machine, packing,
    GPU blocks and memory promotion), with the knobs it leaves alone drawn as well."""
    from tclang.driver.compiler import compile_target
    from tclang.tuning.space import SearchSpace
    target = compile_target(backend, tclang.Options())
    widest = max((t.dtype.bits // 8 for t in defn.inputs), default=4) or 1
    space = SearchSpace.of(defn, sizes, backend, max(1, target.vector_bytes // widest),
                           target.vector_registers)
    candidate = space.random(np.random.default_rng(rng.getrandbits(32)),
                             knobs_set=rng.choice((0.3, 0.5, 0.8)))
    return dataclasses.replace(space.options(candidate),
                               reorder_reductions=rng.choice((None, None, False)),
                               passes=rng.choice((None, None, None, False)))


def default_configs(defn, rng: random.Random, backends, avoid=lambda options: False, *,
                    sizes: dict[str, int] | None = None, tuner: bool = False):
    """"cpu" means its three configurations (also named one by one: "cpu-auto",
    "cpu-manual", "cpu-generic"); any other backend runs with the automatic schedule.
    Random manual options are drawn again (a few times) while `avoid` refuses them. With
    `tuner` (and `sizes`), the manual options and the emulated GPU's come from the
    tuner's search space."""
    def draw(backend="cpu"):
        if tuner and sizes is not None:
            return tuner_options(rng, defn, sizes, backend)
        return random_options(rng, defn)

    def manual():
        options = draw()
        for _ in range(10):
            if not avoid(options):
                break
            options = draw()
        return options
    named = {"cpu-auto": lambda: None, "cpu-manual": manual,
             "cpu-generic": lambda: tclang.Options(specialize=False)}
    configs = []
    for backend in backends:
        parts = list(named) if backend == "cpu" else [backend]
        for p in parts:
            if p in named:
                configs.append(("cpu", named[p]()))
            elif p == "cuda-emulated" and tuner and sizes is not None:
                configs.append((p, draw(p)))
            else:
                configs.append((p, None))
    return configs


def known_bug(defn, backend: str, options, sizes, failure=None) -> str | None:
    """The open bug (KNOWN_BUGS) that this configuration would run into (no `failure`
    given: the bugs that cannot even be run), or that explains `failure`."""
    for name, applies, signature in KNOWN_BUGS:
        if (signature is None) == (failure is None) and \
                (failure is None or signature in failure.detail) and \
                applies(defn, backend, options, sizes):
            return name
    return None


EXTRA_CHECKS = ("interrupt", "module", "grad", "gradcheck", "gradgradcheck")


def run_differential(program: GeneratedProgram, *, backends=("cpu", "reference"),
                     options_sets=None, check_bounds: bool = True, seed: int = 0,
                     avoid_known: bool = False, checks=None) -> Report:
    """Run `program` on random inputs under each backend (with each of `options_sets`,
    default: automatic, random manual and shape-generic for the CPU) against the oracle,
    then the extra checks its features drew (`checks`: only those of EXTRA_CHECKS).
    `avoid_known` skips the configurations that would only hit a known open bug."""
    import time
    start = time.monotonic()
    report = _differential(program, backends, options_sets, check_bounds, seed, avoid_known,
                           checks)
    report.check_seconds["differential"] = time.monotonic() - start - \
        sum(report.check_seconds.values())
    if report.status in ("invalid", "skipped") and not report.failures:
        return report
    drawn = program.features.names()
    for check in (c for c in EXTRA_CHECKS if c in drawn and c != "interrupt"
                  and (checks is None or c in checks)):
        if check in ("gradcheck", "gradgradcheck"):
            from tclang.fuzzing.gradients import torch_available
            torch_available()  # PyTorch's import, seconds once a process, is not the check's
        began = time.monotonic()
        failures, notes = _extra_check(check, program, seed, check_bounds)
        report.check_seconds[check] = time.monotonic() - began
        report.features += notes
        for failure in failures:
            bug = known_bug(checked_definition(program), failure.backend, None, program.sizes,
                            failure) if avoid_known else None
            if bug:
                report.skipped.append(f"{failure.config} (known bug: {bug})")
            else:
                report.failures.append(failure)
    report.status = "fail" if report.failures else "pass"
    return report


def _extra_check(check: str, program: GeneratedProgram, seed: int, check_bounds: bool):
    """(failures, notes) of one extra check; an exception escaping the check itself is
    the runner's crash, reported as the check's."""
    try:
        if check == "module":
            from tclang.fuzzing.modules import check_module
            return check_module(program.features.module, seed=seed,
                                check_bounds=check_bounds)
        if check == "grad":
            from tclang.fuzzing.gradients import check_grad
            return check_grad(program, seed)
        from tclang.fuzzing.gradients import check_torch
        return check_torch(program, check, seed)
    except Exception as err:  # noqa: BLE001
        return [Failure("runner", None, "crash", f"{check}: {describe(err)}",
                        check=check)], [check]


def _differential(program, backends, options_sets, check_bounds, seed, avoid_known, checks):
    report = Report(program, "pass")
    try:
        defn = checked_definition(program)
    except TCError as err:
        report.status, report.why = "invalid", first_line(err)
        return report
    sizes = {s: program.sizes[s] for s in defn.sizes if s in program.sizes}
    if avoid_known and known_bug(defn, *ORACLE, sizes):
        report.status, report.why = "skipped", f"known bug: {known_bug(defn, *ORACLE, sizes)}"
        return report
    inputs = random_inputs(defn, sizes, np.random.default_rng(seed))
    saved = [np.copy(a) for a in inputs]
    rng = random.Random(seed)
    avoid = (lambda options: known_bug(defn, "cpu", options, sizes)) if avoid_known else \
        (lambda options: False)
    features = program.features
    configs = default_configs(defn, rng, backends, avoid, sizes=sizes,
                              tuner=features.tuner_options) \
        if options_sets is None else [(b, o) for b in backends for o in options_sets]
    with quiet():
        try:
            expected = running.call_program(program, *ORACLE, inputs, check_bounds)
        except (TCArgumentError, TCIndexError) as err:  # sizes break a read: not a bug
            report.status, report.why = "skipped", first_line(err)
            return report
        except Exception as err:  # noqa: BLE001 - the oracle itself failing is a bug too
            report.failures.append(Failure(*ORACLE, "crash", describe(err)))
            report.status = "fail"
            return report
        rtol = tolerance(defn, sizes)
        if features.interrupt is not None and (checks is None or "interrupt" in checks):
            _interrupted(report, program, configs, inputs, expected, rtol, check_bounds,
                         avoid_known, defn)
        for n, (backend, options) in enumerate(configs):
            bug = known_bug(defn, backend, options, sizes) if avoid_known else None
            checked = check_bounds and not unchecked_config(options, n)
            failure = "skipped" if bug else \
                _one(program, backend, options, inputs, expected, rtol, checked)
            if failure == "skipped":
                report.skipped.append(label(backend, options) + (f" (known bug: {bug})"
                                                                 if bug else ""))
                continue
            report.ran.append(label(backend, options))
            if failure is None and any(not same_values(a, b) for a, b in zip(inputs, saved)):
                failure = Failure(backend, options, "modified-input", "an input changed")
                inputs = tuple(np.copy(a) for a in saved)
            bug = known_bug(defn, backend, options, sizes, failure) \
                if avoid_known and isinstance(failure, Failure) else None
            if bug:
                report.skipped.append(f"{label(backend, options)} (known bug: {bug})")
            elif failure is not None:
                report.failures.append(failure)
    report.features += _exercised(program, report)
    report.status = "fail" if report.failures else "pass"
    return report


def _exercised(program: GeneratedProgram, report: Report) -> list[str]:
    """What the differential run itself exercised, for `tclang fuzz`'s summary."""
    features = program.features
    notes = []
    if features.family != "generic":
        notes.append(f"family {features.family}")
        notes += [f"family {features.family} on cuda-emulated"
                  for r in report.ran if r.startswith("cuda-emulated")][:1]
    manual = [r for r in report.ran if not r.endswith("automatic")
              and "specialize=False" not in r]
    if manual:
        notes.append("options")
        if features.tuner_options:
            notes.append("tuner options")
    return notes


def _interrupted(report, program, configs, inputs, expected, rtol, check_bounds,
                 avoid_known, defn) -> None:
    """The interrupted compile (interrupts.py) of the program's first CPU configuration,
    before anything else compiles it."""
    import time

    from tclang.fuzzing.interrupts import check_interrupt
    backend, options = next(((b, o) for b, o in configs if b == "cpu"), ("cpu", None))
    began = time.monotonic()
    failures, notes = check_interrupt(program, backend, options, inputs, expected, rtol,
                                      program.features.interrupt, check_bounds)
    report.check_seconds["interrupt"] = time.monotonic() - began
    report.features += notes
    for failure in failures:
        bug = known_bug(defn, failure.backend, options, program.sizes, failure) \
            if avoid_known else None
        if bug:
            report.skipped.append(f"{failure.config} (known bug: {bug})")
        else:
            report.failures.append(failure)


def unchecked_config(options, n: int) -> bool:
    """Whether configuration `n` runs without bounds checks. The oracle ran with them, so
    every read of the program at these sizes is in bounds: the automatic configuration
    runs the code users run, unchecked, and every other configuration alternates. Until
    this, every configuration was checked, and checked code is other code: two wrong
    results of the unchecked CPU code (a lane split summing lane 0's element, a call of a
    function the process lacks) were out of every generated program's reach."""
    return options is None or n % 2 == 1


def _one(program, backend, options, inputs, expected, rtol, check_bounds):
    try:
        first = running.call_program(program, backend, options, inputs, check_bounds, twice=True)
    except TCScheduleError as err:
        if options is not None and options.loop_order is not None and \
                ("breaks" in str(err) or "loop_order" in str(err)):
            return "skipped"
        if options is not None and options.register_tile and "vector registers" in str(err):
            return "skipped"  # a random (mr, nr) too large for this CPU and element type
        return Failure(backend, options, "crash", describe(err))
    except TCIndexError as err:
        return Failure(backend, options, "out-of-bounds", first_line(err))
    except Exception as err:  # noqa: BLE001 - anything else escaping is a crash
        return Failure(backend, options, "crash", describe(err))
    for run, outputs in enumerate(first):
        for k, (a, e) in enumerate(zip(outputs, expected)):
            problem = compare(a, e, rtol)
            if problem:
                call = " (second call)" if run else ""
                return Failure(backend, options, "mismatch", f"output {k}{call}: {problem}")
    return None


# ---- shrinking ----------------------------------------------------------------------------

def shrink(program: GeneratedProgram, still_fails: Callable[[GeneratedProgram], bool], *,
           budget: int = 300) -> GeneratedProgram:
    """Greedy delta debugging: take the first smaller program that still fails, repeat
    until none does (or `budget` candidates were tried)."""
    tried = 0
    improved = True
    while improved and tried < budget:
        improved = False
        for candidate in _candidates(program):
            tried += 1
            if still_fails(candidate):
                program, improved = candidate, True
                break
            if tried >= budget:
                break
    return program


def _candidates(p: GeneratedProgram):
    rng = random.Random(0)
    if p.model is not None:
        cap = p.features.volume_cap or VOLUME_CAP
        for model in _smaller_models(p.model):
            candidate = finish(model, rng, dict(p.sizes), cap=cap)
            if candidate is not None and candidate.sizes == p.sizes:
                yield dataclasses.replace(candidate, features=p.features)
    else:
        yield from _smaller_sources(p)
    for name, value in sorted(p.sizes.items()):
        for smaller in sorted({1, value // 2, value - 1} - {value}):
            if smaller >= 1:
                yield dataclasses.replace(p, sizes={**p.sizes, name: smaller})


def _smaller_models(m: Model):
    replace = dataclasses.replace
    if m.prelude:
        yield replace(m, prelude="")
    for k, s in enumerate(m.body):  # drop a statement
        body = m.body[:k] + m.body[k + 1:]
        written = {t.target for t in body}
        outputs = tuple(o for o in m.outputs if o.name in written)
        if outputs and body:
            yield replace(m, body=body, outputs=outputs)
    for k, s in enumerate(m.body):  # simplify an expression or drop a where clause
        for rhs in _smaller_nodes(s.rhs):
            yield replace(m, body=m.body[:k] + (replace(s, rhs=rhs),) + m.body[k + 1:])
        for j in range(len(s.where)):
            smaller = replace(s, where=s.where[:j] + s.where[j + 1:])
            yield replace(m, body=m.body[:k] + (smaller,) + m.body[k + 1:])
    text = "\n".join(s.render() for s in m.body)
    for k, d in enumerate(m.inputs):  # drop an input no statement reads
        if not _mentions(text, d.name):
            yield replace(m, inputs=m.inputs[:k] + m.inputs[k + 1:])
    for k, o in enumerate(m.outputs):
        if o.type is not None:
            yield replace(m, outputs=m.outputs[:k] + (replace(o, type=None, dims=None),)
                          + m.outputs[k + 1:])


def _smaller_nodes(node):
    """The node replaced by one of its kids or a literal, or one kid made smaller."""
    from tclang.fuzzing.generator import Node
    for kid in node.kids:
        yield kid
    if node.fmt not in ("0", "1", "1.0"):
        yield from (Node("0"), Node("1.0"))
    for k, kid in enumerate(node.kids):
        for smaller in _smaller_nodes(kid):
            yield Node(node.fmt, node.kids[:k] + (smaller,) + node.kids[k + 1:])


def _smaller_sources(p: GeneratedProgram):
    lines = p.source.split("\n")
    for k, line in enumerate(lines):
        if line.strip() and not line.lstrip().startswith(("def ", "}")):
            source = "\n".join(lines[:k] + lines[k + 1:])
            try:
                check_source(source)[p.entry]
            except (TCError, KeyError):
                continue
            yield dataclasses.replace(p, source=source)


def _mentions(text: str, name: str) -> bool:
    import re
    return re.search(rf"\b{re.escape(name)}\b", text) is not None


def fails_like(failure: Failure, *, run=None, check_bounds: bool = True, seed: int = 0):
    """A `still_fails` for `shrink`: the configuration that failed fails again in the same
    way (same kind; for a crash, the same exception). `run` is `run_differential` or a
    `Worker.run` (a crash of the candidate must not end the shrinking)."""
    run = run or run_differential

    def still_fails(candidate: GeneratedProgram) -> bool:
        report = run(candidate, backends=(failure.backend,), options_sets=[failure.options],
                     check_bounds=check_bounds, seed=seed, checks=())
        return any(f.kind == failure.kind and (f.kind != "crash" or f.detail.split(":")[0]
                                               == failure.detail.split(":")[0])
                   for f in report.failures)
    return still_fails


# ---- regressions --------------------------------------------------------------------------

REGRESSIONS_FILE = Path(__file__).resolve().parents[2] / "tests" / "fuzzing" / "regressions.py"


def save_regression(program: GeneratedProgram, reason: str, path=None,
                    options: tclang.Options | None = None) -> Path:
    """Append the program to the regression list (a strict xfail until the fix: reasons
    that start with "OPEN" are expected to fail), with the failing manual options."""
    path = Path(path or REGRESSIONS_FILE)
    if not path.exists():
        path.write_text('"""Saved failing programs: (source, entry, sizes, reason[, '
                        'options])."""\n\nREGRESSIONS: list[tuple] = []\n')
    entry = (program.source, program.entry, dict(program.sizes), reason)
    if options is not None:
        entry += ({f.name: getattr(options, f.name) for f in dataclasses.fields(options)
                   if getattr(options, f.name) != getattr(tclang.Options(), f.name)},)
    with path.open("a") as f:
        f.write(f"\nREGRESSIONS.append({entry!r})\n")
    return path
