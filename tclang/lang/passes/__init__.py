"""Passes on the checked program, before the polyhedral stage: each a pure function
`Definition -> (Definition, notes)`, exact (the program computes bit for bit what it did),
shown by `tclang explain --stage passes`, and all off with `Options(passes=False)`.

    defn, report = optimize(defn, sizes)     # sizes: a specialized compile's, else None
    ...                                      # half sums widened, scales factored, indices
    defn = finish(defn, report)              # widened (polyhedral/pipeline.py), then

In order: constant folding (sizes are constants when specialized) and algebraic
simplification until neither changes anything, common subexpressions across statements,
hoisting of size-only expressions (shape-generic kernels), dead code elimination. Common
subexpressions within a statement come last, on exactly what the scop is built from, so
the program rewrites between never meet its `Let`s. What each pass does and does not do is
in its module and in docs/passes.md.
"""

from __future__ import annotations

from typing import Mapping

from tclang.lang import program as P
from tclang.lang.passes.common import share_across_statements, share_within_statements
from tclang.lang.passes.dead_code import eliminate_dead_code
from tclang.lang.passes.folding import fold_constants, simplify_algebra
from tclang.lang.passes.hoisting import hoist_size_expressions
from tclang.lang.passes.rewrite import check_names
from tclang.lang.program_text import definition_text

__all__ = ["optimize", "finish", "passes_text", "PASS_NAMES"]

#: each pass's name, as explain shows it
PASS_NAMES = ("constant folding", "algebraic simplification",
              "common subexpressions across statements", "hoisting of size expressions",
              "dead code elimination", "common subexpressions within statements")

Report = list[tuple[str, list[str]]]


def optimize(defn: P.Definition, sizes: Mapping[str, int] | None = None, *,
             verify: bool = False):
    """`defn` after every pass but the last (see the module docstring), and what each did.
    `verify`: each pass's output is checked to name only what its statements have
    (`check_names`: a `TCCompileError` naming the pass that broke it)."""
    notes: dict[str, list[str]] = {name: [] for name in PASS_NAMES[:5]}

    def run(name: str, result) -> P.Definition:
        defn, done = result
        notes[name] += done
        return check_names(defn, name) if verify else defn

    for _ in range(4):  # folding exposes identities and identities expose constants
        count = len(notes["constant folding"]) + len(notes["algebraic simplification"])
        defn = run("constant folding", fold_constants(defn, sizes))
        defn = run("algebraic simplification", simplify_algebra(defn))
        if len(notes["constant folding"]) + len(notes["algebraic simplification"]) == count:
            break
    defn = run("common subexpressions across statements", share_across_statements(defn))
    defn = run("hoisting of size expressions", hoist_size_expressions(defn, sizes))
    defn = run("dead code elimination", eliminate_dead_code(defn))
    return defn, list(notes.items())


def finish(defn: P.Definition, report: Report, *, verify: bool = False) -> P.Definition:
    """The last pass, on what the scop is built from: the casts of constants that widening
    index arithmetic made are folded (not reported: the widening's, not the user's), then
    common subexpressions within each statement are bound once (`verify`: as optimize's)."""
    defn, _ = fold_constants(defn)
    if verify:
        check_names(defn, PASS_NAMES[0])
    defn, within = share_within_statements(defn)
    report.append((PASS_NAMES[-1], within))
    return check_names(defn, PASS_NAMES[-1]) if verify else defn


def passes_text(defn: P.Definition, report: Report) -> str:
    """What `tclang explain --stage passes` prints: the program the polyhedral stage gets,
    then what each pass changed."""
    lines = [definition_text(defn), ""]
    if not report:
        return "\n".join(lines + ["(passes off: Options(passes=False))"])
    for name, notes in report:
        lines.append(f"{name}: {'nothing to do' if not notes else ''}".rstrip())
        lines += [f"    {note}" for note in notes]
    return "\n".join(lines)
