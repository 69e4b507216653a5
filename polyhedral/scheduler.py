"""isl's scheduler under a fusion strategy, a time guard and a fallback chain.

Strategies (isl options are per context; each compilation has its own context):
- preserve_parallel: PPCG's options (whole_component=0, maximize_band_depth=1,
  maximize_coincidence=1): clusters merge only when no coincident member is lost.
- min: serialize_sccs=1, every strongly connected component its own band.
- max: maximize_coincidence=0, so clusters merge even when parallelism is lost.
`whole_component=1` is used only for programs of at most two statements (an init and its
reduction: matmul, conv2d), where it is several times faster than clustering (conv2d:
~90 -> ~12 ms) and finds the same schedule; on longer chains it blows up to minutes (MLP3,
notes section 8).

The guard: "max" runs in a forked worker with a wall-clock limit (isl's operation counter
does not bound its known blow-ups); the other strategies run in-process under an operation
limit. On a timeout or an isl error the chain falls back to "min", then to the original
program order, and records why. isl errors never reach the user.
"""

from __future__ import annotations

import multiprocessing
import time
from dataclasses import dataclass

import islpy as isl

from polyhedral.dependences import Dependences
from polyhedral.scop import Scop

TIME_LIMIT = 10.0  # seconds for one scheduler run in a worker
MAX_OPERATIONS = 20_000_000  # in-process guard (isl's counter, reset before scheduling)


@dataclass
class ScheduleResult:
    schedule: isl.Schedule
    strategy: str  # the strategy that produced it: one of the fusions, or "original"
    fallback: str | None  # why the requested strategy was not used, if it was not
    seconds: float


WHOLE_COMPONENT_MAX_STATEMENTS = 2


def _set_options(ctx: isl.Context, fusion: str, statements: int) -> None:
    ctx.set_schedule_whole_component(int(statements <= WHOLE_COMPONENT_MAX_STATEMENTS))
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


def compute_schedule(scop: Scop, deps: Dependences, fusion: str,
                     time_limit: float = TIME_LIMIT) -> ScheduleResult:
    start = time.perf_counter()
    chain = [fusion] + [f for f in ("min",) if f != fusion]
    reasons = []
    for strategy in chain:
        try:
            if strategy == "max":
                schedule = _in_worker(scop, deps, strategy, time_limit)
            else:
                schedule = _in_process(scop, deps, strategy)
        except _Failed as failure:
            reasons.append(f"{strategy}: {failure}")
            continue
        fallback = "; ".join(reasons) if reasons else None
        return ScheduleResult(schedule, strategy, fallback, time.perf_counter() - start)
    schedule = original_schedule(scop)
    return ScheduleResult(schedule, "original", "; ".join(reasons),
                          time.perf_counter() - start)


class _Failed(Exception):
    pass


def _in_process(scop: Scop, deps: Dependences, strategy: str) -> isl.Schedule:
    ctx = scop.ctx
    _set_options(ctx, strategy, _statement_count(scop))
    ctx.reset_operations()
    ctx.set_max_operations(MAX_OPERATIONS)
    try:
        return _constraints(scop, deps).compute_schedule()
    except isl.Error as err:
        raise _Failed(f"isl gave up ({str(err).splitlines()[0][:120]})") from None
    finally:
        ctx.set_max_operations(0)
        ctx.reset_operations()


def _statement_count(scop: Scop) -> int:
    return scop.domain.n_set()


def _worker(conn, constraints_text: str, strategy: str, statements: int) -> None:
    try:
        ctx = isl.Context()
        _set_options(ctx, strategy, statements)
        sc = isl.ScheduleConstraints.read_from_str(ctx, constraints_text)
        conn.send(("ok", sc.compute_schedule().to_str()))
    except Exception as err:  # reported to the parent, which falls back
        conn.send(("error", f"{type(err).__name__}: {err}"))
    finally:
        conn.close()


def _in_worker(scop: Scop, deps: Dependences, strategy: str, limit: float) -> isl.Schedule:
    """Run the scheduler in a forked process, killed after `limit` seconds."""
    text = _constraints(scop, deps).to_str()
    mp = multiprocessing.get_context("fork")
    parent, child = mp.Pipe(duplex=False)
    process = mp.Process(target=_worker, args=(child, text, strategy, _statement_count(scop)), daemon=True)
    process.start()
    child.close()
    try:
        if not parent.poll(limit):
            raise _Failed(f"the scheduler ran past {limit:g} s")
        status, payload = parent.recv()
    except EOFError:
        raise _Failed("the scheduler process died") from None
    finally:
        if process.is_alive():
            process.kill()
        process.join(1)
        parent.close()
    if status != "ok":
        raise _Failed(f"isl gave up ({payload[:120]})")
    return isl.Schedule.read_from_str(scop.ctx, payload)


def original_schedule(scop: Scop) -> isl.Schedule:
    """Program order: a sequence of the statements, each with a band over its indices."""
    ctx = scop.ctx
    present = [st for st in scop.statements if _statement_domain(scop, st.id) is not None]
    node = isl.Schedule.from_domain(scop.domain).get_root().child(0)
    if not present:
        return node.get_schedule()
    filters = isl.UnionSetList.alloc(ctx, len(present))
    for st in present:
        filters = filters.add(_statement_domain(scop, st.id))
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


def _statement_domain(scop: Scop, sid: str) -> isl.UnionSet | None:
    found = []
    scop.domain.foreach_set(lambda s: found.append(s) if s.get_tuple_name() == sid else None)
    return isl.UnionSet.from_set(found[0]) if found else None


def schedule_text(schedule: isl.Schedule) -> str:
    """The schedule tree in isl's block YAML style (PPCG's --save-schedule format)."""
    printer = isl.Printer.to_str(schedule.get_ctx()).set_yaml_style(isl.yaml_style.BLOCK)
    return printer.print_schedule(schedule).get_str()
