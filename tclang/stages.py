"""The compile stages by name: one name per stage for its timing, its error message, its
dump (TCLANG_DUMP) and `tclang explain --stage`.

    stages = Stages("mm", failures=(isl.Error, ValueError))
    with stages("scop"):                      # timed as "scop"; a failure inside becomes
        scop = build_scop(...)                # "the polyhedral scop stage failed for mm"
    stages.show("scop", lambda: text(scop))   # printed if TCLANG_DUMP names it

Each stage also enters the compile's budget (tclang/budget.py): past it, a stage that has no
cheaper way out fails with a TCCompileError naming the stage that spent it, and after ~2 s
a progress bar names the stage running.

TCLANG_DUMP=scop,schedule,loops,llvm-opt (or "all") writes each named stage's text to
stderr as it is made, headed by the kernel's name; with TCLANG_DUMP_DIR set, to the file
<dir>/<kernel>.<stage>.txt instead.
"""

from __future__ import annotations

import os
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

from tclang import budget as _budget
from tclang.errors import TCCompileError, TCConfigError, TCError

#: every stage, in order, with what its text shows
STAGES = {
    "passes": "the definition after the passes on the checked program, and what each did",
    "scop": "the statements' iteration domains, reads and writes (isl)",
    "dependences": "flow, false and reduction dependences (isl)",
    "schedule": "the isl schedule tree the scheduler chose",
    "transform": "the schedule tree after loop order, tiling or GPU mapping (isl)",
    "loops": "the loop IR as pseudo-C, with parallel/vector marks",
    "code": "the backend's generated code (its steps follow)",
    "llvm": "LLVM IR as generated (cpu)",
    "llvm-opt": "LLVM IR after O3, where vectorized loops show (cpu)",
    "cuda": "CUDA C (cuda, cuda-emulated)",
    "python": "the interpreter's Python code (reference)",
}


def requested() -> frozenset[str]:
    """The stages TCLANG_DUMP names ("all" for every one); a name that is no stage is a
    TCConfigError (it was ignored: a typo dumped nothing, silently)."""
    names = {n.strip() for n in os.environ.get("TCLANG_DUMP", "").split(",") if n.strip()}
    if "all" in names:
        return frozenset(STAGES)
    unknown = sorted(n for n in names if n not in STAGES)
    if unknown:
        raise TCConfigError(f"TCLANG_DUMP names {_unknown(unknown)}; the stages are "
                            f"{', '.join(STAGES)}, or all")
    return frozenset(names)


def check_names(names) -> None:
    unknown = [n for n in names if n not in STAGES]
    if unknown:
        raise TCError(f"unknown stage {unknown[0]!r}; the stages are {', '.join(STAGES)}")


def _unknown(names: list[str]) -> str:
    quoted = ", ".join(repr(n) for n in names)
    return f"no stage {quoted}" if len(names) == 1 else f"no stages {quoted}"


class Stages:
    """One compile's stages: their timings, their errors, their texts."""

    def __init__(self, kernel: str, failures: tuple[type[BaseException], ...] = (),
                 collect: dict[str, str] | None = None):
        """`failures`: exceptions of the libraries a stage calls that mean "this stage
        failed" (isl's, say). `collect`: a dict that receives every stage's text."""
        self.kernel = kernel
        self.failures = failures
        self.timings: dict[str, float] = {}
        self.collect = collect
        self.dump = requested()

    @contextmanager
    def __call__(self, name: str, check: bool = True) -> Iterator[None]:
        """Time, name and guard one stage. `check=False`: a stage that has its own way out
        of a spent budget (the schedule stage's cheapest schedule) starts even past it."""
        budget = _budget.current()
        if budget is not None:
            budget.enter(name, check)
        start = time.perf_counter()
        try:
            yield
        except TCError:
            raise
        except self.failures as err:
            first = str(err).splitlines()[0] if str(err) else type(err).__name__
            raise TCCompileError(f"the polyhedral {name} stage failed for {self.kernel}: "
                                 f"{first}") from err
        spent = time.perf_counter() - start
        self.timings[name] = self.timings.get(name, 0.0) + spent
        if budget is not None:
            budget.leave(name, spent)

    def wanted(self, name: str) -> bool:
        return self.collect is not None or name in self.dump

    def show(self, name: str, text: str | Callable[[], str]) -> None:
        """Hand a stage's text to whoever asked for it (made only then, if a callable)."""
        if not self.wanted(name):
            return
        if callable(text):
            text = text()
        if self.collect is not None:
            self.collect[name] = text
        if name in self.dump:
            write_dump(self.kernel, name, text)


def write_dump(kernel: str, stage: str, text: str) -> None:
    folder = os.environ.get("TCLANG_DUMP_DIR")
    if folder:
        path = Path(folder)
        path.mkdir(parents=True, exist_ok=True)
        (path / f"{kernel}.{stage}.txt").write_text(text.rstrip() + "\n")
        return
    sys.stderr.write(f"== {kernel}: {stage} " + "=" * max(0, 60 - len(kernel) - len(stage))
                     + "\n" + text.rstrip() + "\n")
