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
from tclang.lang.program_text import definition_text

__all__ = ["optimize", "finish", "passes_text", "PASS_NAMES"]

#: each pass's name, as explain shows it
PASS_NAMES = ("constant folding", "algebraic simplification",
              "common subexpressions across statements", "hoisting of size expressions",
              "dead code elimination", "common subexpressions within statements")

Report = list[tuple[str, list[str]]]


def optimize(defn: P.Definition, sizes: Mapping[str, int] | None = None):
    """`defn` after every pass but the last (see the module docstring), and what each did."""
    notes: dict[str, list[str]] = {name: [] for name in PASS_NAMES[:5]}
    for _ in range(4):  # folding exposes identities and identities expose constants
        defn, folded = fold_constants(defn, sizes)
        defn, simplified = simplify_algebra(defn)
        notes["constant folding"] += folded
        notes["algebraic simplification"] += simplified
        if not folded and not simplified:
            break
    defn, shared = share_across_statements(defn)
    notes["common subexpressions across statements"] += shared
    defn, hoisted = hoist_size_expressions(defn, sizes)
    notes["hoisting of size expressions"] += hoisted
    defn, dead = eliminate_dead_code(defn)
    notes["dead code elimination"] += dead
    return defn, list(notes.items())


def finish(defn: P.Definition, report: Report) -> P.Definition:
    """The last pass, on what the scop is built from: the casts of constants that widening
    index arithmetic made are folded (not reported: the widening's, not the user's), then
    common subexpressions within each statement are bound once."""
    defn, _ = fold_constants(defn)
    defn, within = share_within_statements(defn)
    report.append((PASS_NAMES[-1], within))
    return defn


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
