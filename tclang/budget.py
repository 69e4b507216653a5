"""One wall-clock budget for a whole compile, a progress bar, and where the time went.

A compile's cost grows with its program (statements, dependences between them), and isl's
worst cases are minutes; a user must never wait hours without knowing why. So every
compile runs under a `Budget`:

    with compiling("mm", options) as budget:   # one per compile; nested compiles share it
        with stages("scop"): ...               # tclang/stages.py checks it between stages
        check()                                # inside a stage's long loops: ~100 ns

- its size: `Options(compile_budget=seconds)`, else TCLANG_COMPILE_BUDGET, else
  DEFAULT_SECONDS, sized so that normal operators never meet it (they compile in 0.3 s,
  the slowest fuzzed programs in about 10 s);
- past it, the compile takes a defined way out (polyhedral/pipeline.py): from the schedule
  stage on, the cheapest legal schedule (program order, or isl's schedule untransformed),
  marked degraded (never stored on disk, compiled again later: polyhedral/scheduler.py);
  before it (passes, scop, dependences), where no schedule exists yet, a `BudgetExceeded`
  (a TCCompileError) that names the stage and what to split. Once a schedule exists (or
  after a fallback) the stages left get a grace (the same budget again, at least
  MIN_GRACE seconds) and then fail the same way, so a compile costs at most about twice
  its budget (plus one isl call that was running: isl is not interrupted), never hours;
  LLVM's optimization runs in its own process, which is killed at what the budget has
  left (backends/llvm/jit.py: `optimizer_limit`), and the module is optimized again
  without LLVM's vectorizers, marked degraded the same way;
- after PROGRESS_AFTER seconds a tqdm bar on stderr names the stage it is in (only when
  stderr is a terminal, or TCLANG_PROGRESS=1 forces it; TCLANG_PROGRESS=0 silences it),
  updated at every check: between stages and inside their loops, not during one long
  isl call (a thread could, but the scheduling process is forked, and forking a process
  with threads is what tclang/locks.py guards against);
- a compile over SLOW_COMPILE seconds writes one line to stderr saying where its time went
  (stage by stage), unless TCLANG_PROGRESS=0.
"""

from __future__ import annotations

import sys
import time
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Iterator

from tclang import environment
from tclang.errors import TCCompileError

ENV = "TCLANG_COMPILE_BUDGET"
PROGRESS_ENV = "TCLANG_PROGRESS"
DEFAULT_SECONDS = 60.0
"""Six times the slowest compile of a fuzzed program (about 10 s: the scheduler's time
limit and its fallback on a loaded machine) and 200 times a benchmark operator's."""
PROGRESS_AFTER = 2.0  # seconds before the bar appears
SLOW_COMPILE = 3.0  # seconds from which a compile says where its time went
REDRAW = 0.25  # seconds between redraws of the bar within one stage
MIN_GRACE = 10.0  # seconds at least for the stages left after a fallback

# what to do about a budget that ran out in a stage that has no fallback
ADVICE = ("split the definition into several smaller ones (statements that share no tensor, "
          "or successive steps of a chain, each in its own definition, called one after "
          "another), or give the compile more time with TCLANG_COMPILE_BUDGET=<seconds> or "
          "Options(compile_budget=<seconds>)")


def seconds_for(options=None) -> float:
    """The budget of a compile under `options`: its compile_budget, else the environment
    variable, else the default. A malformed variable is a TCError that says what it wants
    (not a ValueError from float())."""
    given = getattr(options, "compile_budget", None)
    if given is not None:
        return float(given)
    return environment.positive_number(ENV, DEFAULT_SECONDS)


def _progress_wanted() -> bool:
    """The bar on a terminal, or wherever TCLANG_PROGRESS turns it on."""
    return environment.switch(PROGRESS_ENV, bool(getattr(sys.stderr, "isatty", lambda: False)()))


class BudgetExceeded(TCCompileError):
    """A compile ran past its budget in a stage that has no cheaper way to finish."""

    def __init__(self, budget: "Budget", stage: str):
        self.stage = stage
        self.seconds = budget.seconds
        spent = budget.elapsed()
        super().__init__(f"compiling {budget.kernel} ran past its compile budget of "
                         f"{budget.seconds:g} s in the {stage} stage ({spent:.1f} s; "
                         f"{budget.breakdown() or 'no stage finished'}): {ADVICE}")

    def __reduce__(self):
        """Raised in the middle end's process (tclang/driver/middle_end.py), raised again in the
        compiler's as it was: the message, stage and budget kept (the constructor takes a
        live Budget, which does not travel)."""
        return (_budget_exceeded, (str(self), self.stage, self.seconds, self.__dict__))


class Budget:
    """The deadline of one compile, the stage it is in, and its progress bar."""

    def __init__(self, kernel: str, seconds: float):
        self.kernel = kernel
        self.seconds = seconds
        self.start = time.monotonic()
        self.deadline = self.start + seconds
        self.stage = "start"
        self._stage_start: float | None = None  # time.monotonic() the running stage began
        self.timings: dict[str, float] = {}
        self.fell_back: str | None = None  # why a cheaper schedule was taken, if one was
        self.scheduled = False  # a schedule exists (the pipeline says so): finish it
        self._graced = False
        self._bar = None
        self._bar_stage, self._drawn = None, 0.0
        self._progress = None  # decided when first needed (the environment at that time)

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def remaining(self) -> float:
        return self.deadline - time.monotonic()

    def exceeded(self) -> bool:
        return time.monotonic() >= self.deadline

    def check(self) -> None:
        """The cheap deadline check: BudgetExceeded past the deadline; the bar updated
        once the compile has run PROGRESS_AFTER seconds."""
        now = time.monotonic()
        if now - self.start >= PROGRESS_AFTER:
            self._show(now)
        if now >= self.deadline:
            raise BudgetExceeded(self, self.stage)

    def enter(self, stage: str, check: bool = True) -> None:
        """A stage begins; with `check`, a budget spent in the stage before (which had no
        fallback of its own) fails the compile, naming that stage."""
        if check and self.scheduled and not self._graced and self.exceeded():
            self._grace()  # a schedule exists: the stages left finish it, in the grace
        if check:
            self.check()
        self.stage, self._stage_start = stage, time.monotonic()
        if time.monotonic() - self.start >= PROGRESS_AFTER:
            self._show(time.monotonic())

    def leave(self, stage: str, seconds: float) -> None:
        self.timings[stage] = self.timings.get(stage, 0.0) + seconds
        self._stage_start = None

    def fall_back(self, why: str) -> None:
        """The compile took its cheaper way out: the stages left get a grace period."""
        self.fell_back = why
        if not self._graced:
            self._grace()

    def _grace(self) -> None:
        self._graced = True
        self.deadline = time.monotonic() + max(MIN_GRACE, self.seconds)

    def breakdown(self) -> str:
        """Where the time went: "dependences 4.1 s, schedule 0.8 s" (largest first), the
        stage running counted so far."""
        spent = dict(self.timings)
        if self._stage_start is not None:
            spent[self.stage] = spent.get(self.stage, 0.0) + time.monotonic() - self._stage_start
        parts = sorted(spent.items(), key=lambda kv: -kv[1])
        return ", ".join(f"{name} {t:.2f} s" for name, t in parts)

    def _show(self, now: float) -> None:
        if self._progress is None:
            self._progress = _progress_wanted()
        if not self._progress or (self._bar is not None and self._bar_stage == self.stage
                                  and now - self._drawn < REDRAW):
            return  # (a check runs per loop step: redrawn a few times a second at most)
        self._bar_stage, self._drawn = self.stage, now
        if self._bar is None:
            from tqdm import tqdm

            class Bar(tqdm):  # no monitor thread: the scheduling process is forked
                monitor_interval = 0

            self._bar = Bar(total=round(self.seconds, 1), unit="s", file=sys.stderr,
                             leave=False, dynamic_ncols=True,
                             bar_format="{desc}: {bar} {n:.1f} s of {total:g} s budget")
        self._bar.set_description_str(f"compiling {self.kernel}: {self.stage}", refresh=False)
        self._bar.n = round(min(now - self.start, self.seconds), 1)
        self._bar.refresh()

    def close(self) -> None:
        """End of the compile: the bar goes, and a slow compile says where its time went."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        spent = self.elapsed()
        if spent >= SLOW_COMPILE and environment.switch(PROGRESS_ENV, True):
            way_out = f"; took the cheaper way out: {self.fell_back}" if self.fell_back else ""
            sys.stderr.write(f"tclang: compiling {self.kernel} took {spent:.1f} s: "
                             f"{self.breakdown()}{way_out}\n")


def _budget_exceeded(message, stage, seconds, state) -> BudgetExceeded:
    error = BudgetExceeded.__new__(BudgetExceeded)
    TCCompileError.__init__(error, message)
    error.__dict__.update(state)
    error.stage, error.seconds = stage, seconds
    return error


_current: ContextVar[Budget | None] = ContextVar("tclang_compile_budget", default=None)


def current() -> Budget | None:
    return _current.get()


def check() -> None:
    """The deadline check for a stage's long loops: a no-op outside a compile."""
    budget = _current.get()
    if budget is not None:
        budget.check()


def handed_over() -> tuple | None:
    """The running compile's budget as plain values, for the middle end's process
    (tclang/driver/middle_end.py): the same deadline there (time.monotonic is one clock for
    every process of the machine)."""
    budget = _current.get()
    if budget is None:
        return None
    return (budget.kernel, budget.seconds, budget.start, budget.deadline, budget._graced)


@contextmanager
def continuing(state: tuple | None) -> Iterator[Budget | None]:
    """In the middle end's process: the compiler's budget, continued (its deadline, its
    bar on the same stderr); the note on where the time went stays the compiler's, which
    gets this part's timings back with the schedule."""
    if state is None:
        yield None
        return
    kernel, seconds, start, deadline, graced = state
    budget = Budget(kernel, seconds)
    budget.start, budget.deadline, budget._graced = start, deadline, graced
    token = _current.set(budget)
    try:
        yield budget
    finally:
        _current.reset(token)
        if budget._bar is not None:
            budget._bar.close()
            budget._bar = None


def take_back(scheduled) -> None:
    """In the compiler's process, after the middle end answered: its stage timings and
    any cheaper way out it took, on this compile's budget (its grace, its note)."""
    budget = _current.get()
    if budget is None:
        return
    for stage, spent in scheduled.timings.items():
        budget.timings[stage] = budget.timings.get(stage, 0.0) + spent
    budget.scheduled = True
    if scheduled.retry_at is not None and budget.fell_back is None and scheduled.fallback:
        budget.fall_back(scheduled.fallback)


@contextmanager
def compiling(kernel: str, options=None) -> Iterator[Budget]:
    """The budget of this compile: a new one, or the one of the compile this is part of
    (the compile driver opens it around scheduling and code generation; the pipeline
    opens its own when called alone, by explain or a tool)."""
    outer = _current.get()
    if outer is not None:
        yield outer
        return
    budget = Budget(kernel, seconds_for(options))
    token = _current.set(budget)
    try:
        yield budget
    finally:
        _current.reset(token)
        budget.close()
