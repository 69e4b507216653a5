"""`tc.autotune`: search the options of one kernel for its arguments' shapes, keep the best.

The search is evolutionary and guided by a cost model learned online (tclang.tuning.model),
as TVM's Ansor does it: the first batch is the automatic schedule and random points; after
that each batch is chosen from a few hundred children of the fastest points so far
(mutations of one or two knobs, crossovers, some random points), ranked by the model
fitted to every time measured; one point per batch is a random child, so the search keeps
exploring where the model is wrong. `strategy="random"` draws every batch at random
(the baseline a search must beat at equal budget: docs/tuning.md has the table).

Trials run in parallel on `executor` (a concurrent.futures Executor or a
dask.distributed Client; by default a local pool of `jobs` threads, each driving one forked
trial process, or on a GPU backend one spawned worker per device: tclang.tuning.workers):
compiles overlap, timings never do (tclang.tuning.trials). The few fastest
points are timed again at the end, beside the automatic schedule, and the best is chosen
on those times; the winner is then timed against the automatic schedule alternately, and
kept only where it is still faster (else a noisy sample would be stored as the best).
Ctrl-C stops the search and keeps what it found.
"""

from __future__ import annotations

import concurrent.futures
import math
import statistics
import time
from dataclasses import dataclass, field

import numpy as np

from tclang.errors import TCError
from tclang.options import Options
from tclang.tuning import trials as T
from tclang.driver.tuning_database import TuningDatabase, kernel_key, machine_id
from tclang.tuning.model import BoostedTrees
from tclang.tuning.space import Candidate, SearchSpace, describe

STRATEGIES = ("evolution", "random")
RETIMED = 3  # the fastest points timed again at the end
CONFIRM_ROUNDS = 2  # then the winner and the automatic schedule, alternately, this often
CONFIRM_MARGIN = 1.02  # the winner's median must beat automatic's by this factor
MODEL_AFTER = 6  # timed points before the cost model ranks candidates
CHILDREN = 256  # candidates the model ranks for each batch


@dataclass
class TuningResult:
    """What a tuning found: the best options, their time and the automatic schedule's
    (both from the final re-timing), every trial, and whether the database got them."""

    entry: str
    best: Options
    best_seconds: float
    automatic_seconds: float
    trials: list = field(default_factory=list)
    interrupted: bool = False
    stored: bool = False
    database: str | None = None
    strategy: str = "evolution"

    @property
    def speedup(self) -> float:
        return self.automatic_seconds / self.best_seconds if self.best_seconds else 1.0

    def counts(self) -> dict[str, int]:
        counts = {status: 0 for status in T.STATUSES}
        for t in self.trials:
            counts[t.status] += 1
        return counts

    def best_after(self, n: int) -> float:
        """The fastest time among the first `n` timed trials (for search comparisons)."""
        timed = [t.seconds for t in self.trials if t.ok][:n]
        return min(timed) if timed else math.inf

    def __str__(self) -> str:
        counts = ", ".join(f"{v} {k}" for k, v in self.counts().items() if v)
        lines = [f"tuned {self.entry}: {self.speedup:.2f}x the automatic schedule "
                 f"({self.automatic_seconds * 1e3:.3f} ms -> {self.best_seconds * 1e3:.3f} ms)",
                 f"  best options: {_describe_options(self.best)}",
                 f"  trials: {counts}" + (" (interrupted)" if self.interrupted else "")]
        if self.stored:
            lines.append(f"  stored in {self.database}")
        wrong = [t for t in self.trials if t.status == "wrong"]
        for t in wrong[:3]:
            lines.append(f"  COMPILER BUG: {describe(t.candidate)}: {t.message}")
        return "\n".join(lines)


def _describe_options(options: Options) -> str:
    return options.describe()  # the knob grammar: what --options and --manual read


def check_seconds(name: str, value) -> None:
    """A time a caller gives: a finite number of seconds above 0."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or \
            not math.isfinite(value) or value <= 0:
        raise TCError(f"{name} must be a finite number of seconds above 0, not {value!r}")


def autotune(kernel, *args, budget: int = 64, time_limit: float = 60.0,
             executor=None, jobs: int | None = None, seed: int = 0,
             strategy: str = "evolution", database=None, store: bool = True,
             progress: bool = True, min_time: float = 0.2,
             reproducer_dir: str | None = None,
             time_budget: float | None = None) -> TuningResult:
    """Tune `kernel` (a `Kernel`, e.g. `mod.mm`) for the shapes and dtypes of `args`.

    budget: timed trials (refused candidates are counted but not timed, and do not count).
    time_limit: seconds per trial (compile, check, timing) before it is killed.
    executor: None (local: `jobs` trials at once, default 2; on a GPU backend one trial
    per device, in a spawned worker that holds the device's context: `jobs` caps the
    devices used), a concurrent.futures Executor, or a dask.distributed Client. store: keep the best in the tuning database
    (`database`: a path, default TCLANG_TUNING_DB or the cache directory's tuning.sqlite),
    where `tc.define(..., options="tuned")` finds it. time_budget: seconds of searching
    (None: no limit): no trial starts after it, and the final re-timing of the best few
    follows (a trial in flight may take up to `time_limit` more).
    """
    from tclang.runtime.arguments import bind_arguments
    from tclang.driver.cachekey import canonical_source
    from tclang.driver.compiler import compile_target

    if strategy not in STRATEGIES:
        raise TCError(f"strategy must be one of {', '.join(STRATEGIES)}, not {strategy!r}")
    if budget < 1:
        raise TCError(f"budget must be at least 1 trial, not {budget}")
    check_seconds("time_limit", time_limit)  # nan: each trial failed in the executor
    check_seconds("min_time", min_time)
    if time_budget is not None:
        check_seconds("time_budget", time_budget)
    if jobs is not None and (not isinstance(jobs, int) or jobs < 1):
        raise TCError(f"jobs must be None (the default) or at least 1, not {jobs!r}")
    budget = min(budget, max_trials() or budget)
    module = kernel.module
    definition = kernel.definition
    binding = bind_arguments(definition, args)
    shapes = binding.shape_key()
    target = compile_target(module.backend, Options())
    key = kernel_key(canonical_source(definition), kernel.name, shapes, module.backend)
    machine = machine_id(target)
    db = TuningDatabase(database)
    inputs = tuple(np.asarray(a) for a in binding.arrays)
    reference = kernel_outputs(module.program.source, module.backend, kernel.name, inputs)
    lanes = max(1, target.vector_bytes // max(a.dtype.itemsize for a in inputs)) \
        if inputs else 8
    space = SearchSpace.of(definition, dict(binding.sizes), module.backend, lanes,
                           target.vector_registers)
    task = T.Task(module.program.source, kernel.name, module.backend, inputs, reference,
                  time_limit=time_limit, min_time=min_time, reproducer_dir=reproducer_dir)
    search = _Search(space, strategy, np.random.default_rng(seed))
    runner = _Runner(task, executor, jobs)
    bar = progress_bar(budget, f"tuning {kernel.name}", progress)
    interrupted = False
    try:
        timed, attempts = 0, 0
        deadline = None if time_budget is None else time.monotonic() + time_budget
        while timed < budget and attempts < 4 * budget + 8 and \
                (deadline is None or time.monotonic() < deadline or not search.trials):
            batch = search.propose(min(runner.width, budget - timed))
            if not batch:
                break  # the space is exhausted
            attempts += len(batch)
            for trial in runner.run(batch):
                search.record(trial)
                if trial.ok:
                    timed += 1
                    bar.update(1)
                    bar.set_postfix_str(f"best {search.best_seconds() * 1e3:.3f} ms",
                                        refresh=False)
        final = _confirmed(search, runner, _retime(search, runner))
    except KeyboardInterrupt:
        interrupted = True
        T.kill_running()
        final = {t.candidate: t.seconds for t in search.trials if t.ok}
    finally:
        bar.close()
        runner.close()
    automatic = space.automatic()
    if not final:
        raise TCError(f"no candidate of {kernel.name} could be timed "
                      f"({_count_text(search.trials)}); the automatic schedule itself "
                      f"failed: {search.trials[0].message if search.trials else 'no trial ran'}")
    best = min(final, key=final.get)
    automatic_seconds = final.get(automatic, math.nan)
    result = TuningResult(kernel.name, SearchSpace.options(best), final[best],
                          automatic_seconds, list(search.trials), interrupted,
                          strategy=strategy)
    if store:  # a database that fails only warns: the result is returned all the same
        result.stored = db.save(key, machine, kernel.name, shapes, result.best,
                                result.best_seconds, automatic_seconds, search.trials)
        result.database = str(db.path) if db.path is not None else None
    return result


def max_trials() -> int | None:
    """TCLANG_MAX_TRIALS: at most this many trials per tuning, whatever its budget (a smoke
    test of a tuning script: the documentation's test runs its examples so)."""
    from tclang import environment
    return environment.whole_number("TCLANG_MAX_TRIALS", None)


def kernel_outputs(source: str, backend: str, entry: str, inputs: tuple) -> tuple:
    """The automatic schedule's outputs (what every candidate is checked against)."""
    from tclang.runtime.arguments import call_numpy
    from tclang.runtime.kernels import define_module
    return call_numpy(define_module(source, backend)[entry], inputs)


class _Search:
    """The points tried so far and how the next batch is chosen."""

    def __init__(self, space: SearchSpace, strategy: str, rng: np.random.Generator):
        self.space, self.strategy, self.rng = space, strategy, rng
        self.trials: list[T.Trial] = []
        self.seen: set[Candidate] = set()

    def record(self, trial: T.Trial) -> None:
        self.trials.append(trial)

    def timed(self) -> list[T.Trial]:
        return [t for t in self.trials if t.ok]

    def best_seconds(self) -> float:
        return min((t.seconds for t in self.timed()), default=math.inf)

    def propose(self, n: int) -> list[Candidate]:
        batch: list[Candidate] = []
        if not self.seen:
            batch.append(self.space.automatic())  # the baseline, timed like the rest
        timed = self.timed()
        if self.strategy == "random" or len(timed) < MODEL_AFTER:
            batch += self._fresh(lambda: self.space.random(self.rng), n - len(batch))
        else:
            children = self._fresh(self._child, CHILDREN)
            if children:
                model = BoostedTrees().fit(
                    np.array([self.space.features(t.candidate) for t in timed]),
                    np.log(np.array([t.seconds for t in timed])))
                predicted = model.predict(np.array([self.space.features(c) for c in children]))
                ranked = [children[k] for k in np.argsort(predicted, kind="stable")]
                explore = []  # one child from the lower half: where the model may be wrong
                if n > 1 and len(ranked) >= 2 * n:
                    explore = [ranked[int(self.rng.integers(len(ranked) // 2, len(ranked)))]]
                batch += ranked[:n - len(explore)] + explore
        self.seen.update(batch)
        return batch[:max(n, 1)]

    def _child(self) -> Candidate:
        timed = sorted(self.timed(), key=lambda t: t.seconds)[:8]
        parents = [t.candidate for t in timed]
        r = self.rng.random()
        if r < 0.5:
            return self.space.mutate(parents[int(self.rng.integers(len(parents)))], self.rng)
        if r < 0.85:
            a, b = (parents[int(self.rng.integers(len(parents)))] for _ in range(2))
            child = self.space.crossover(a, b, self.rng)
            return self.space.mutate(child, self.rng) if self.rng.random() < 0.5 else child
        return self.space.random(self.rng)

    def _fresh(self, make, n: int) -> list[Candidate]:
        out: list[Candidate] = []
        new: set[Candidate] = set()
        for _ in range(20 * max(n, 1)):
            if len(out) >= n:
                break
            c = make()
            if c not in self.seen and c not in new:
                new.add(c)
                out.append(c)
        return out


class _Runner:
    """Runs batches of trials on an executor and yields them as they finish."""

    def __init__(self, task: T.Task, executor, jobs: int | None):
        self.task = task
        self.owned = executor is None
        self.dask = _is_dask(executor)
        if executor is None:
            from tclang.tuning import workers
            if workers.is_gpu(task.backend):  # one trial per device: its worker's
                devices = workers.pool(task.backend, T._measure).size
                jobs = min(jobs or devices, devices)
            jobs = jobs or 2
            executor = concurrent.futures.ThreadPoolExecutor(jobs, thread_name_prefix="tune")
        self.executor = executor
        if self.dask:
            workers = len(executor.scheduler_info().get("workers", {})) or 1
            self.width = jobs or 2 * workers
            self.task_ref = executor.scatter(task, broadcast=True)
        else:
            self.width = jobs or getattr(executor, "_max_workers", None) or 2
            self.task_ref = task

    def run(self, batch: list[Candidate]):
        if self.dask:
            from distributed import as_completed
            futures = [self.executor.submit(T.run_trial, self.task_ref, c, pure=False)
                       for c in batch]
            for future in as_completed(futures):
                yield _result(future, batch[futures.index(future)])
            return
        futures = {self.executor.submit(T.run_trial, self.task_ref, c): c for c in batch}
        for future in concurrent.futures.as_completed(futures):
            yield _result(future, futures[future])

    def close(self) -> None:
        if self.owned:
            self.executor.shutdown(wait=False, cancel_futures=True)


def _result(future, candidate: Candidate) -> T.Trial:
    try:
        return future.result()
    except Exception as err:  # noqa: BLE001 - the executor lost the task (a worker died)
        return T.Trial(candidate, "crashed", message=f"the executor failed the trial: {err!r}")


def _is_dask(executor) -> bool:
    return executor is not None and type(executor).__module__.startswith("distributed")


def _retime(search: _Search, runner: _Runner) -> dict[Candidate, float]:
    """The fastest points and the automatic one, timed again one after another."""
    automatic = search.space.automatic()
    timed = sorted(search.timed(), key=lambda t: t.seconds)
    chosen = [t.candidate for t in timed[:RETIMED]]
    if automatic not in chosen and any(t.candidate == automatic for t in timed):
        chosen.append(automatic)
    final: dict[Candidate, float] = {}
    for candidate in chosen:
        again = next(runner.run([candidate]))
        if again.ok:
            final[candidate] = again.seconds
    return final or {t.candidate: t.seconds for t in timed[:1]}


def _confirmed(search: _Search, runner: _Runner,
               final: dict[Candidate, float]) -> dict[Candidate, float]:
    """`final` once its winner has been timed again against the automatic schedule,
    alternately, CONFIRM_ROUNDS times each: a winner whose median (all its re-timings)
    is not CONFIRM_MARGIN faster than automatic's won by noise (a loaded machine, one
    lucky sample), and the automatic schedule stays the best (what gets stored)."""
    automatic = search.space.automatic()
    best = min(final, key=final.get) if final else None
    if best is None or best == automatic or automatic not in final:
        return final
    times = {best: [final[best]], automatic: [final[automatic]]}
    for _ in range(CONFIRM_ROUNDS):
        for candidate in (best, automatic):
            again = next(runner.run([candidate]))
            if again.ok:
                times[candidate].append(again.seconds)
    won, auto = statistics.median(times[best]), statistics.median(times[automatic])
    if won * CONFIRM_MARGIN < auto:
        return {best: won, automatic: auto}
    return {automatic: auto}


def _count_text(trials) -> str:
    counts: dict[str, int] = {}
    for t in trials:
        counts[t.status] = counts.get(t.status, 0) + 1
    return ", ".join(f"{v} {k}" for k, v in counts.items()) or "none"


class _NoBar:
    def update(self, n):
        pass

    def set_postfix_str(self, text, refresh=True):
        pass

    def close(self):
        pass


def progress_bar(total: int, desc: str, shown: bool, unit: str = "trial"):
    """A tqdm bar (rate, ETA), or one that shows nothing."""
    if not shown:
        return _NoBar()
    from tqdm.auto import tqdm
    return tqdm(total=total, desc=desc, unit=unit, leave=True)
