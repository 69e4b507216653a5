"""Modules of several definitions, in random layouts, through a shared disk cache.

A user's file holds several definitions, laid out as they like: two on a line, Windows
or old-Mac line ends, tabs, comments between them. They edit one definition and run the
file again, in a new process, with the compile cache of the last run. Each definition
must then run its own code: the cache key of `b` in
`def a(...) {...} def b(...) {...}` was made from `a`'s tokens (the key lexed from the
start of b's line), and a bare `\\r` line end did the same, so the edited `b` ran the
kernel cached for the old one. The generic generator wrote one definition per module,
one layout, and nothing was ever compiled twice.

A `ModulePlan` is the program as one definition among one or two others, with a random
layout, and three revisions of the module:

    A  the definitions in layout LA     compiled and run in a forked child process
    B  one definition edited, layout LA  in this process: the disk cache of A's run
    C  A's definitions again, layout LC  in this process: the memory cache of B's run

(LC is LA half the time.) Every definition of every revision is compared with a fresh
compile of the same definition alone in its own module, with the disk cache and call
records off and the memory cache emptied, and that with the oracle (the reference
interpreter): a revision that disagrees with its fresh compile while the fresh compile
agrees with the oracle ran a wrong cached kernel.
"""

from __future__ import annotations

import contextlib
import random
from dataclasses import dataclass, replace

from tclang.fuzzing.generator import VOLUME_CAP, GeneratedProgram, Model, Node, finish
from tclang.fuzzing.running import (ORACLE, Failure, call_kernel, checked_definition, compare,
                                    describe, quiet, tolerance)

# Layout styles: (separators inside a definition: after `{`, between statements, before
# `}`; separators between definitions). "mixed" draws every one from everything.
_BETWEEN = ("", " ", "  ", "\t", "\n", "\r", "\r\n", "\n\n", " # next\n", "\r\n# next\r\n",
            "\t# def x() -> () {}\n", "\r\r", "\n\r\n")
_WITHIN = ("", " ", "\n", "\r", "\r\n", "\t", "\n    ", "\r\n\t", " # c\n", "  # }\r\n")
STYLES = {
    "mixed": (_WITHIN, _BETWEEN),
    "one line": ((" ", "", "\t", "  "), (" ", "", "\t", "  ")),
    "compact": ((" ", ""), ("\n", "\r\n", "\r", " ", "\n# next\n", "")),  # a def a line
    "cr": (("\r", "\r    ", "\r\t", " "), ("\r", "\r\r", " ")),  # old Mac line ends
    "crlf": (("\r\n", "\r\n    ", " # c\r\n"), ("\r\n", "\r\n\r\n", " # next\r\n", " ")),
    "lf": (("\n", "\n    ", " # c\n", "\n\t"), ("\n", "\n\n", " # next\n", " ")),
}
LEADING = ("", "", "\n", "# a module\n", "\r\n", "\t")
NAMES = ("f", "g", "h", "fuzz", "kernel", "k2", "tri", "pad", "masked", "prefix",
         "softmax", "helper")
EDITS = ("({0}) + 1", "({0}) * 2", "!({0})")


@dataclass(frozen=True)
class ModulePlan:
    defs: tuple[GeneratedProgram, ...]  # each definition alone, with its sizes
    main: int  # which of defs is the program being fuzzed (its differential run's)
    edit_at: int  # the definition revision B edits (-1: none could be edited)
    edited: GeneratedProgram | None
    layout_a: int  # layout seeds: revisions A and B share theirs
    layout_c: int
    backend: str = "cpu"

    def revisions(self) -> list[tuple[str, str, tuple[GeneratedProgram, ...]]]:
        """(name, source, definitions) of revisions A, B and C."""
        b = self.defs if self.edited is None else \
            self.defs[:self.edit_at] + (self.edited,) + self.defs[self.edit_at + 1:]
        return [("A", render_module(self.defs, self.layout_a), self.defs),
                ("B", render_module(b, self.layout_a), b),
                ("C", render_module(self.defs, self.layout_c), self.defs)]


def module_plan(rng: random.Random, program: GeneratedProgram, others) -> ModulePlan | None:
    """`program` among one or two other definitions (`others()` makes one: a generic
    program); None if the program has no model to lay out."""
    if program.model is None:
        return None
    taken = {program.entry}
    defs = [replace(program, model=replace(program.model, prelude=""))]
    for _ in range(rng.choice((1, 1, 2))):
        other = others()
        if other.model is None:
            continue
        name = rng.choice([n for n in NAMES if n not in taken])
        taken.add(name)
        defs.append(_renamed(other, name))
    rng.shuffle(defs)
    main = next(k for k, d in enumerate(defs) if d.entry == program.entry)
    # prefer editing a definition that is not the first: one that shares a line with an
    # earlier one is the case a key made from the line's start gets wrong
    order = list(range(1, len(defs))) + [0]
    edit_at, edited = -1, None
    for k in order:
        edited = _edit(defs[k], rng)
        if edited is not None:
            edit_at = k
            break
    layout_a = rng.getrandbits(32)
    layout_c = layout_a if rng.random() < 0.5 else rng.getrandbits(32)
    backend = rng.choices(("cpu", "reference"), (85, 15))[0]
    return ModulePlan(tuple(defs), main, edit_at, edited, layout_a, layout_c, backend)


def _renamed(program: GeneratedProgram, name: str) -> GeneratedProgram:
    model = replace(program.model, name=name, prelude="")
    return replace(program, source=model.render(), entry=name, model=model)


def _edit(program: GeneratedProgram, rng: random.Random) -> GeneratedProgram | None:
    """The definition with its last statement writing an output changed (same name,
    inputs and sizes: the same cache key but for the text), or None."""
    model: Model = program.model
    outputs = {o.name for o in model.outputs}
    last = max((k for k, s in enumerate(model.body) if s.target in outputs), default=None)
    if last is None:
        return None
    stmt = model.body[last]
    for fmt in EDITS:
        body = model.body[:last] + (replace(stmt, rhs=Node(fmt, (stmt.rhs,))),) + \
            model.body[last + 1:]
        candidate = finish(replace(model, body=body), rng, dict(program.sizes),
                           cap=program.features.volume_cap or VOLUME_CAP)
        if candidate is not None and candidate.sizes == program.sizes:
            return replace(candidate, features=program.features)
    return None


def render_module(defs, seed: int) -> str:
    """The definitions as one source text in the layout `seed` picks: the same seed lays
    out definitions with the same number of statements the same way."""
    rng = random.Random(seed)
    within, between = STYLES[rng.choice(sorted(STYLES))]
    parts = [rng.choice(LEADING)]
    for k, program in enumerate(defs):
        if k:
            parts.append(rng.choice(between))
        parts.append(render_definition(program.model, rng, within))
    return "".join(parts) + rng.choice(("", "\n", "\r\n", "\r"))


def layout_style(seed: int) -> str:
    return random.Random(seed).choice(sorted(STYLES))


def render_definition(model: Model, rng: random.Random, within=_WITHIN) -> str:
    ins = ", ".join(d.render() for d in model.inputs)
    outs = ", ".join(d.render() for d in model.outputs)
    parts = [f"def {model.name}({ins}) -> ({outs}) {{"]
    for stmt in model.body:
        parts += [_within(rng, parts[-1], within), stmt.render()]
    parts += [_within(rng, parts[-1], within), "}"]
    return "".join(parts)


def _within(rng: random.Random, before: str, within) -> str:
    sep = rng.choice(within)
    # two statements need nothing between them, but a name must not run into the next
    return sep if sep or before.endswith(("{", ";")) else " "


# ---- the check ----------------------------------------------------------------------------

@contextlib.contextmanager
def fresh_compiles():
    """Compile everything anew: no disk cache, no call records, an empty memory cache
    (emptied again afterwards, so that nothing compiled here answers a later lookup)."""
    from tclang.driver.compiler import forget_compiled
    from tclang.environment import set_for_a_while
    with set_for_a_while(TCLANG_DISK_CACHE="0", TCLANG_CALL_RECORDS="0"):
        forget_compiled()
        try:
            yield
        finally:
            forget_compiled()


@dataclass
class Calls:
    """What one revision's definitions returned: outputs, or the error, by name."""

    outputs: dict
    errors: dict


def check_module(plan: ModulePlan, *, seed: int = 0, check_bounds: bool = True):
    """(failures, notes): every definition of revisions A, B and C against its fresh
    compile and the oracle (module docstring). Failures are differential.Failures with
    check="module"; notes say what ran."""
    import numpy as np

    import tclang
    from tclang.tools.inputs import random_inputs
    options = tclang.Options(check_bounds=check_bounds or None)
    revisions = plan.revisions()
    versions = {_version(d): d for _, _, defs in revisions for d in defs}
    inputs = {}
    for k, (key, d) in enumerate(sorted(versions.items())):
        defn = checked_definition(d)
        # an edited definition gets the inputs of the original: the same arguments
        inputs.setdefault(d.entry, random_inputs(defn, d.sizes, np.random.default_rng(seed + k)))
    results = {}
    with quiet():
        name, source, defs = revisions[0]
        results[name] = _in_child(source, defs, inputs, plan.backend, options)
        from tclang.driver.compiler import forget_compiled
        forget_compiled()  # B finds A's kernels on disk only, as a new process would
        for name, source, defs in revisions[1:]:
            results[name] = _run(source, defs, inputs, plan.backend, options)
        with fresh_compiles():
            fresh = {v: _run(d.source, (d,), inputs, plan.backend, options)
                     for v, d in versions.items()}
            oracle = {v: _run(d.source, (d,), inputs, ORACLE[0],
                              _bounds(ORACLE[1], check_bounds)) for v, d in versions.items()}
    failures = []
    label = f"module {plan.backend}"
    # a definition its random inputs do not fit (the oracle refuses them, as the
    # differential run skips such a program) is not compared
    unfit = {v for v, d in versions.items()
             if oracle[v].errors.get(d.entry, "").startswith(("TCArgumentError",
                                                             "TCIndexError"))}
    for v, d in versions.items():
        rtol = tolerance(checked_definition(d), d.sizes)
        problem = None if v in unfit else _error_or_mismatch(fresh[v], oracle[v], d.entry,
                                                             rtol)
        if problem:
            failures.append(Failure(label, None, problem[0], f"{d.entry} alone: {problem[1]}",
                                    check="module"))
    for name, source, defs in revisions:
        for d in (d for d in defs if _version(d) not in unfit):
            v = _version(d)
            rtol = tolerance(checked_definition(d), d.sizes)
            problem = _error_or_mismatch(results[name], fresh[v], d.entry, rtol)
            if problem is None:
                continue
            kind, detail = problem
            if kind == "mismatch" and _error_or_mismatch(fresh[v], oracle[v], d.entry,
                                                         rtol) is None:
                kind = "wrong-cached-kernel"
            failures.append(Failure(label, None, kind,
                                    f"revision {name}, {d.entry}: {detail} (against its "
                                    f"fresh compile)", check="module",
                                    repro=_repro(plan, name, d)))
    return failures, ["module", f"module layout {layout_style(plan.layout_a)}"]


def _version(d: GeneratedProgram) -> tuple:
    return (d.entry, d.source)


def _bounds(options, check_bounds: bool):
    from dataclasses import replace as _replace
    return _replace(options, check_bounds=True) if check_bounds else options


def _run(source: str, defs, inputs, backend: str, options) -> Calls:
    """Each definition of `source` (in `defs`) called on its inputs, in this process."""
    import tclang
    calls = Calls({}, {})
    try:
        module = tclang.define(source, backend=backend, options=options)
    except Exception as err:  # noqa: BLE001 - a module that does not define is reported
        calls.errors = {d.entry: f"define: {describe(err)}" for d in defs}
        return calls
    for d in defs:
        try:
            calls.outputs[d.entry] = call_kernel(module[d.entry], inputs[d.entry])
        except Exception as err:  # noqa: BLE001 - every call's error is reported
            calls.errors[d.entry] = describe(err)
    return calls


def _in_child(source: str, defs, inputs, backend: str, options) -> Calls:
    """`_run` in a forked child process (its own memory cache, the same disk cache): what
    the previous run of the user's file left behind."""
    import multiprocessing
    ctx = multiprocessing.get_context("fork")
    parent, child = ctx.Pipe(duplex=False)
    process = ctx.Process(target=_child, args=(child, source, defs, inputs, backend,
                                               options))
    process.start()
    child.close()
    calls = Calls({}, {d.entry: "the child process sent nothing" for d in defs})
    try:
        if parent.poll(90):
            calls = parent.recv()
    except (EOFError, OSError):
        pass
    process.join(5)
    if process.is_alive():
        process.kill()
        process.join()
    if process.exitcode:
        calls.errors = {**{d.entry: f"the child process died (exit code "
                                    f"{process.exitcode})" for d in defs}, **calls.errors}
    return calls


def _child(conn, source, defs, inputs, backend, options) -> None:
    from tclang.driver.compiler import forget_compiled
    forget_compiled()  # the parent's kernels are not this "process's"
    conn.send(_run(source, defs, inputs, backend, options))
    conn.close()


def _error_or_mismatch(got: Calls, want: Calls, entry: str, rtol: float):
    """None, ("crash", what) or ("mismatch", what) for one definition."""
    if entry in got.errors:
        return "crash", got.errors[entry]
    if entry in want.errors:
        return None  # the reference side failed: reported where it is the subject
    for k, (a, e) in enumerate(zip(got.outputs[entry], want.outputs[entry])):
        problem = compare(a, e, rtol)
        if problem:
            return "mismatch", f"output {k}: {problem}"
    return None


def _repro(plan: ModulePlan, revision: str, d: GeneratedProgram) -> str:
    """A script reproducing a failure: run it with A, then B (then C), each a new process
    with the same TCLANG_CACHE_DIR; revision B is A with one definition edited."""
    revisions = {name: source for name, source, _ in plan.revisions()}
    return "\n".join([
        f"# python repro.py A; python repro.py B; python repro.py C (one TCLANG_CACHE_DIR):"
        f" {d.entry} of revision {revision} ran a wrong kernel",
        "import sys, numpy as np, tclang as tc",
        "from tclang.tools.inputs import random_inputs",
        f"REVISIONS = {revisions!r}",
        f"kernel = tc.define(REVISIONS[sys.argv[1]], backend={plan.backend!r})[{d.entry!r}]",
        f"print(kernel(*random_inputs(kernel.definition, {d.sizes!r}, "
        f"np.random.default_rng(0))))", ""])
