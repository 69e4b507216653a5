"""Legality of a final schedule: every dependence must go forward in time.

For each pair of statements joined by validity dependences, the dependences are mapped
into schedule time; each must be lexicographically positive. A violation becomes a
`TCScheduleError` naming the two statements, the tensor and the kind of dependence, with a
pair of instances that would run in the wrong order.
"""

from __future__ import annotations

import islpy as isl

from polyhedral.dependences import Dependences
from polyhedral.isl_callbacks import maps
from polyhedral.scop import Scop
from tclang.errors import TCScheduleError


def check_legality(schedule: isl.Schedule, deps: Dependences, scop: Scop,
                   cause: str = "the schedule") -> None:
    timing = schedule.get_map().intersect_domain(scop.domain)
    for dep in maps(deps.validity):
        source = timing.extract_map(dep.get_space().domain().map_from_domain_and_range(
            _time_space(timing)))
        sink = timing.extract_map(dep.get_space().range().map_from_domain_and_range(
            _time_space(timing)))
        in_time = dep.apply_domain(source).apply_range(sink)
        forward = isl.Map.lex_lt(in_time.get_space().domain())
        backward = in_time.subtract(forward)
        if not backward.is_empty():
            raise _violation(dep, source, sink, backward, deps, scop, cause)


def _time_space(timing: isl.UnionMap) -> isl.Space:
    return maps(timing)[0].get_space().range()


def _violation(dep: isl.Map, source: isl.Map, sink: isl.Map, backward: isl.Map,
               deps: Dependences, scop: Scop, cause: str) -> TCScheduleError:
    src_id = dep.get_tuple_name(isl.dim_type.in_)
    dst_id = dep.get_tuple_name(isl.dim_type.out)
    bad = dep.intersect(source.apply_range(backward).apply_range(sink.reverse()))
    point = (bad if not bad.is_empty() else dep).wrap().sample_point()
    n_src = dep.dim(isl.dim_type.in_)
    values = [point.get_coordinate_val(isl.dim_type.set, k).to_python()
              for k in range(n_src + dep.dim(isl.dim_type.out))]
    src_point, dst_point = tuple(values[:n_src]), tuple(values[n_src:])
    kind = "flow (read-after-write)" if not isl.UnionMap.from_map(dep).intersect(
        deps.flow).is_empty() else "write-after-read/write-after-write"
    src, dst = scop.statement(src_id).source, scop.statement(dst_id).source
    tensors = sorted({src.target, dst.target} & ({src.target} | {r.tensor for r in dst.reads()}
                                                 | {dst.target}))
    message = (f"{cause} breaks a {kind} dependence on {', '.join(tensors)}: "
               f"`{dst.text}` (line {dst.span.line}) at {dst_id}{dst_point} must run after "
               f"`{src.text}` (line {src.span.line}) at {src_id}{src_point}, but would run "
               "before it")
    return TCScheduleError(message, dst.span, scop.definition.source,
                           hint="choose another loop_order (the band is not permutable in "
                                "this order), or leave loop_order unset")
