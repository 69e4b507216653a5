"""isl's scheduler under a fusion strategy, a time guard and a fallback chain.

Strategies (isl options are per context; each compilation has its own context):
- preserve_parallel: PPCG's options (whole_component=0, maximize_band_depth=1,
  maximize_coincidence=1): clusters merge only when no coincident member is lost.
- min: serialize_sccs=1, every strongly connected component its own band.
- max: maximize_coincidence=0, so clusters merge even when parallelism is lost.
`whole_component=1` is never used: it blows up to minutes on MLP chains (notes, section 8),
and even on two statements (an init and a reduction with a 4-d domain and a guarded read)
it ran past every limit: isl's operation counter does not bound it.

The guard: the scheduler runs in a forked worker (tclang/forked_server.py) with a wall-clock limit, because isl's
operation counter does not bound its blow-ups (the fuzzers found programs that
"preserve_parallel" scheduled for minutes under every operation limit, while proximity
bounded the distance to every consumer; see _nearest_proximity). A scop of one
statement, which cannot blow up this way, is scheduled in-process under the operation
limit and saves the round trip. On a timeout or an isl error the chain falls
back to "min", then to the original program order, and records why. isl errors never
reach the user.

A fallback forced by circumstance (the time limit on a loaded machine, a scheduling
process killed or not started) is *degraded*: `ScheduleResult.retry_at` says when the
full schedule may be tried again. The compile driver stores no degraded kernel on disk
(the next process tries again) and keeps it in memory only until then (RETRY_AFTER,
doubled for each failure again): a load spike at compile time slowed every later process,
and the process itself for its life (issue 31). isl refusing a strategy is the program's
doing, the same every time: that fallback is final.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

import islpy as isl

from polyhedral.isl_context import compilation_context

from polyhedral.dependences import Dependences
from polyhedral.isl_callbacks import sets
from polyhedral.scop import Scop
from polyhedral.statement_groups import SPLIT_STATEMENTS, join_groups, statement_groups, \
    union_sets
from tclang import budget as compile_budget
from tclang.forked_server import ForkedServer, RequestFailed, ServerError, ServerTimeout
from tclang.recent import Recent

TIME_LIMIT = 3.0
"""Seconds for the scheduler runs of one compilation, in a worker. isl's scheduler either
finishes well within a second or runs for tens of seconds: 739 of the 740 runs over
`tclang fuzz` programs 0-249 (seed 0, every configuration) took under 0.5 s, the slowest of
the 11 slowest programs of 2,000 needed 2.2 s when it finished at all, while PPCG's options
(and "max") on program 1864's shape-generic scop run for 40 s ("min": 0.1 s). Waiting
longer buys no schedule, and a fuzzed program's 10 s cover about six compilations."""
FALLBACK_LIMIT = 2.0  # seconds at least for each fallback strategy
RETRY_AFTER = 60.0
"""Seconds before this process tries again a strategy that ran past its time limit or
whose scheduling process died; doubled for each failure in a row, MAX_RETRY_AFTER at
most. A program that always blows up then costs its time limit again about once an hour
(not at every compile), and a load spike costs a minute of the degraded kernel."""
MAX_RETRY_AFTER = 3600.0
MIN_BUDGET_LIMIT = 0.05
"""Seconds of the compile budget (tclang/budget.py) below which a strategy is not tried:
the scheduling process's round trip alone costs a few milliseconds, a schedule more."""
MAX_OPERATIONS = 20_000_000  # in-process guard (isl's counter, reset before scheduling)
LEXMIN_OPERATIONS = 200_000  # for the nearest-consumer proximity (see _nearest_proximity)


@dataclass
class ScheduleResult:
    schedule: isl.Schedule
    strategy: str  # the strategy that produced it: one of the fusions, or "original"
    fallback: str | None  # why the requested strategy was not used, if it was not
    seconds: float
    # degraded (a fallback forced by circumstance, not by the program): the time.monotonic()
    # after which a better strategy may be tried again; None when the result is final
    retry_at: float | None = None


MAX_COEFFICIENT = 8
"""Bound on every schedule coefficient (isl's default: none). Found by the fuzzer: a
5-statement program whose ILP ran past 30 s unbounded is scheduled in 0.2 s with it; every
benchmark and example operator and the 179 multi-statement programs among fuzz programs
200-399 (seed 0) get the same schedules with and without it (and 176 of 0-199 with 4) (skews by more than a few are never what a tensor
program wants). isl's running time is not monotone in the bound: 4 made another program
(HANGS in the tests) run past every limit where 2 and 8 did not. A bound on the constant
shifts instead breaks epilogue fusion once sizes exceed it (the shift that places an
epilogue after its reduction grows with the reduction's extent)."""


def _set_options(ctx: isl.Context, fusion: str) -> None:
    ctx.set_schedule_max_coefficient(MAX_COEFFICIENT)
    ctx.set_schedule_whole_component(0)
    ctx.set_schedule_maximize_band_depth(1)
    ctx.set_schedule_maximize_coincidence(0 if fusion == "max" else 1)
    ctx.set_schedule_serialize_sccs(1 if fusion == "min" else 0)
    ctx.set_schedule_outer_coincidence(0)
    ctx.set_schedule_treat_coalescing(1)


def _constraints(scop: Scop, deps: Dependences) -> isl.ScheduleConstraints:
    validity = deps.validity
    return (isl.ScheduleConstraints.on_domain(scop.domain)
            .set_context(scop.context)
            .set_validity(validity)
            .set_coincidence(deps.coincidence)
            .set_proximity(deps.validity))


def _nearest_proximity(sc: isl.ScheduleConstraints) -> isl.ScheduleConstraints:
    """Proximity only from each instance to the first instance that depends on it.

    Proximity is the scheduler's objective, not a constraint (validity stays whole), and
    the distance to the first consumer is what keeps a producer next to its consumers.
    Bounding the distance to every consumer made isl's ILP many times larger: conv2d's
    init -> update pairs range over all c, kh, kw (~100 ms -> ~10 ms, same schedule).
    Computed here, in the guarded process, because a lexmin has its own costs: with
    symbolic sizes it can split into a case per relation of the sizes (a 4-statement
    generated program: 18 s, then an ILP over hundreds of pieces). Every benchmark and
    example operator needs under 10,000 of isl's counted operations for it, so past
    LEXMIN_OPERATIONS the full proximity is kept (0.1 s for that program)."""
    ctx = sc.get_ctx()
    ctx.reset_operations()
    ctx.set_max_operations(LEXMIN_OPERATIONS)
    try:
        return sc.set_proximity(sc.get_proximity().lexmin().coalesce())
    except isl.Error:
        return sc
    finally:
        ctx.set_max_operations(0)
        ctx.reset_operations()


def compute_schedule(scop: Scop, deps: Dependences, fusion: str,
                     time_limit: float | None = None) -> ScheduleResult:
    """A program of at most SPLIT_STATEMENTS statements is scheduled whole; a larger one
    in groups (each a view of the scop with the group's instances as its domain), each
    with the strategy chain of _schedule_group under its own `time_limit` (TIME_LIMIT
    when None), joined and fused back (polyhedral/statement_groups.py). Every limit is
    capped by what is left of the compile's budget (tclang/budget.py): once it is spent,
    the groups left run in program order, degraded like any failure by circumstance, and
    are fused back all the same (the join's cost is linear; 1,000 loops' code is not).
    The result's `retry_at` is the earliest retry of a strategy (of any group) that
    failed by circumstance."""
    time_limit = TIME_LIMIT if time_limit is None else time_limit
    start = time.perf_counter()
    domains = _statement_domains(scop)
    ids = [st.id for st in scop.statements if st.id in domains]
    if len(ids) <= SPLIT_STATEMENTS:
        schedule, strategy, reasons, retries = _schedule_group(scop, deps, fusion,
                                                               time_limit)
        return ScheduleResult(schedule, strategy, "; ".join(reasons) or None,
                              time.perf_counter() - start, min(retries, default=None))
    schedules, strategies, failed, retries = [], [], [], []
    previous: list[str] = []
    for group in statement_groups(ids, deps):
        view = replace(scop, domain=union_sets([domains[sid] for sid in group]))
        schedule, strategy, why, later = _schedule_group(view, deps.among(group), fusion,
                                                         time_limit)
        schedules.append(schedule)
        strategies.append(strategy)
        retries += later
        if why and why == previous:  # the next group failed alike (the budget spent)
            failed[-1][1] = group[-1]
        elif why:
            failed.append([group[0], group[-1], why])
        previous = why
    reasons = [f"statements {first}..{last}: {r}"
               for first, last, why in failed for r in why]
    schedule = join_groups(scop.domain, schedules, deps, fusion)
    strategy = " / ".join(sorted(set(strategies), key=strategies.index))
    return ScheduleResult(schedule, strategy, "; ".join(reasons) or None,
                          time.perf_counter() - start, min(retries, default=None))


def _schedule_group(scop: Scop, deps: Dependences, fusion: str, time_limit: float
                    ) -> tuple[isl.Schedule, str, list[str], list[float]]:
    """(schedule, strategy, why the strategies before it failed, when the ones that
    failed by circumstance may be tried again) of the scop's domain: the first strategy
    of the chain gets `time_limit`; the fallbacks share what is left of it, at least
    FALLBACK_LIMIT each, so a program that blows up costs about `time_limit` in all
    rather than `time_limit` per strategy. Each limit is capped by what is left of the
    compile budget; once that is spent, program order."""
    start = time.perf_counter()
    chain = [fusion] + [f for f in ("min",) if f != fusion]
    reasons, retries = [], []
    budget = compile_budget.current()  # every limit capped by what is left of it
    for step, strategy in enumerate(chain):
        limit = time_limit if step == 0 else \
            max(FALLBACK_LIMIT, time_limit - (time.perf_counter() - start))
        capped = ""
        if budget is not None and budget.remaining() < limit:
            limit, capped = budget.remaining(), " (capped by the compile budget)"
            if limit < MIN_BUDGET_LIMIT:  # spent: program order, tried in full later
                reasons.append(f"{strategy}: not tried, the compile budget of "
                               f"{budget.seconds:g} s was spent")
                retries.append(time.monotonic() + RETRY_AFTER)
                continue
        try:
            if scop.domain.n_set() > 1:
                schedule = _in_worker(scop, deps, strategy, limit)
            else:
                schedule = _in_process(scop, deps, strategy)
        except _Failed as failure:
            reasons.append(f"{strategy}: {failure}{capped}")
            if failure.retry_at is not None:
                retries.append(failure.retry_at)
            continue
        return schedule, strategy, reasons, retries
    return original_schedule(scop), "original", reasons, retries


class _Failed(Exception):
    """A strategy gave no schedule; `retry_at` as ScheduleResult's (None: isl refused it,
    and would again)."""

    def __init__(self, why: str, retry_at: float | None = None):
        super().__init__(why)
        self.retry_at = retry_at


def _in_process(scop: Scop, deps: Dependences, strategy: str) -> isl.Schedule:
    ctx = scop.ctx
    _set_options(ctx, strategy)
    constraints = _nearest_proximity(_constraints(scop, deps))  # under its own limit
    ctx.reset_operations()
    ctx.set_max_operations(MAX_OPERATIONS)
    try:
        return constraints.compute_schedule()
    except isl.Error as err:
        raise _Failed(f"isl gave up ({str(err).splitlines()[0][:120]})") from None
    finally:
        ctx.set_max_operations(0)
        ctx.reset_operations()


def _schedule_text(request: tuple[str, str]) -> str:
    """In the scheduling process: (constraints text, strategy) -> the schedule's text."""
    constraints_text, strategy = request
    ctx = compilation_context()
    _set_options(ctx, strategy)
    sc = isl.ScheduleConstraints.read_from_str(ctx, constraints_text)
    return _nearest_proximity(sc).compute_schedule().to_str()


# Forking once per compilation cost 20-25 ms here; a request to a running process costs
# about a millisecond. The process is killed (and forked again on the next request) when a
# request runs past its time limit or is interrupted.
_scheduler = ForkedServer(_schedule_text, "scheduler")


@dataclass(frozen=True)
class _Answer:
    status: str  # "ok", "error" (isl refused), "timeout" or "died" (no answer this time)
    text: str  # the schedule, or why not
    limit: float  # the time limit it was asked under
    retry_at: float | None = None  # "timeout", "died": when to ask again
    failures: int = 0  # "timeout", "died": how many times in a row


_answers = Recent(256)
"""(constraints text, strategy) -> _Answer: the scheduling process's answers. One scop is
scheduled again for every backend it is compiled for, for manual options that keep its
fusion (tile sizes, unrolling: what tuning varies) and after a kernel's variant was
evicted; isl's scheduler is deterministic, so its answer is kept. Running out of time
and a process that died are kept too, but only until their `retry_at` (and a time-out
until a longer limit is asked for): they say more about the machine than the program."""


def _in_worker(scop: Scop, deps: Dependences, strategy: str, limit: float) -> isl.Schedule:
    """Run the scheduler in the scheduling process, given up after `limit` seconds."""
    text = _constraints(scop, deps).to_str()
    answer = _answers.get((text, strategy))
    if answer is None or (answer.retry_at is not None and (
            time.monotonic() >= answer.retry_at
            or (answer.status == "timeout" and answer.limit < limit))):
        answer = _ask(text, strategy, limit, answer)
        _answers.put((text, strategy), answer)
    if answer.status != "ok":
        raise _Failed(answer.text, answer.retry_at)
    return isl.Schedule.read_from_str(scop.ctx, answer.text)


def _ask(text: str, strategy: str, limit: float, last: _Answer | None) -> _Answer:
    """The scheduling process's answer; a failure by circumstance is retried after
    RETRY_AFTER, doubled for each one in a row since `last`."""
    failures = 1 + (last.failures if last is not None else 0)
    retry_at = time.monotonic() + min(MAX_RETRY_AFTER, RETRY_AFTER * 2 ** (failures - 1))
    try:
        return _Answer("ok", _scheduler.call((text, strategy), limit), limit)
    except ServerTimeout as failure:
        return _Answer("timeout", str(failure), limit, retry_at, failures)
    except RequestFailed as failure:
        return _Answer("error", f"isl gave up ({str(failure)[:120]})", limit)
    except ServerError as failure:  # died twice in a row, or could not be forked
        return _Answer("died", str(failure), limit, retry_at, failures)


def original_schedule(scop: Scop) -> isl.Schedule:
    """Program order: a sequence of the statements (those of the scop's domain), each with
    a band over its indices."""
    ctx = scop.ctx
    domains = _statement_domains(scop)
    present = [st for st in scop.statements if st.id in domains]
    node = isl.Schedule.from_domain(scop.domain).get_root().child(0)
    if not present:
        return node.get_schedule()
    filters = isl.UnionSetList.alloc(ctx, len(present))
    for st in present:
        filters = filters.add(domains[st.id])
    node = node.insert_sequence(filters)
    for k, st in enumerate(present):
        if not st.indices:
            continue
        prefix = f"[{', '.join(scop.params)}] -> " if scop.params else ""
        args = ", ".join(st.indices)
        members = ", ".join(f"{{ {st.id}[{args}] -> [({i})] }}" for i in st.indices)
        mupa = isl.MultiUnionPwAff(f"{prefix}[{members}]", context=ctx)
        node = node.child(k).child(0).insert_partial_schedule(mupa).parent().parent()
    return node.get_schedule()


def _statement_domains(scop: Scop) -> dict[str, isl.UnionSet]:
    """Each statement's instances (a statement with none, e.g. for a size 0, is absent)."""
    return {s.get_tuple_name(): isl.UnionSet.from_set(s) for s in sets(scop.domain)}


def schedule_text(schedule: isl.Schedule) -> str:
    """The schedule tree in isl's block YAML style (PPCG's --save-schedule format)."""
    printer = isl.Printer.to_str(schedule.get_ctx()).set_yaml_style(isl.yaml_style.BLOCK)
    return printer.print_schedule(schedule).get_str()
