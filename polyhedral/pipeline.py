"""The polyhedral middle end in one function: checked definition -> scheduled loop IR.

    definition, report = optimize(definition, sizes)  # passes: tclang/passes (not Options(passes=False))
    definition = store_reduction_terms(definition)  # CPU: softmax's exp once (then contracted)
    definition = widen_half_reductions(definition)  # half sums and products in float32
    definition = factor_out_scales(definition, sizes)  # X +=! e * c -> X +=! e; X = X * c
    check_names(definition, ...)                    # no rewrite moved a name out of scope
    scop = build_scop(widen_indices(definition), sizes)  # int64 index values; domains, accesses
    check_bounds(scop)                              # exact, for the concrete sizes
    deps = compute_dependences(scop)                # flow, false, reduction self-deps
    result = compute_schedule(scop, deps, fusion)   # isl scheduler, guarded, with fallbacks
    tree = fuse_rows(...)                           # CPU: row reductions + consumers, one pass
    tree = transform_bands(...) / map_to_gpu(...)   # loop order, tiling, intra-tile order
    check_legality(tree, deps, scop)                # every dependence still goes forward
    kernel = lower_to_loops(scop, tree, deps)       # isl AST -> loop IR
    kernel = contract_temporaries(kernel)           # CPU: temporaries of one iteration
    kernel = split_guards(kernel)                   # CPU: no guard in a vector loop
    kernel = with_choices(kernel, options, target, layouts)  # what the backend emits

Errors from isl never reach the user as isl errors: they become a `TCCompileError` that
names the stage.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Mapping

import islpy as isl

from polyhedral import loop_ir as L
from polyhedral.bounds import bounds_conditions, check_bounds
from polyhedral.recurrences import check_recurrences
from polyhedral.contraction import SLICE_BYTES, contract_temporaries
from polyhedral.dependences import compute_dependences
from polyhedral.guard_splitting import automatic_fusion, split_guards
from polyhedral.legality import check_legality
from polyhedral.loop_format import format_kernel
from polyhedral.lowering import lower_to_loops
from polyhedral.packing import graft_copies
from polyhedral.row_fusion import fuse_rows
from polyhedral.scheduler import RETRY_AFTER, compute_schedule, schedule_text
from polyhedral.scheduled import ScheduledKernel
from polyhedral.scop import build_scop
from polyhedral.gpu import map_to_gpu
from polyhedral.tiling import BandReport, apply_loop_order, transform_bands
from tclang import budget as compile_budget
from tclang.lang import program as P
from tclang.lang.passes import finish, optimize, passes_text
from tclang.lang.passes.rewrite import check_names
from tclang.lang.passes.contraction_layouts import CONTRACTION_LAYOUTS, pack_contractions
from tclang.lang.passes.stored_terms import STORED_TERMS, store_reduction_terms
from tclang.environment import switch
from tclang.stages import Stages
from tclang.options import Options
from tclang.target import Target
from tclang.lang.guarded_sums import restrict_guarded_sums
from tclang.lang.half_accumulators import widen_half_reductions
from tclang.lang.reduction_scales import factor_out_scales
from tclang.lang.wide_indices import widen_indices


def verify_enabled() -> bool:
    """Legality of every schedule is re-checked with TCLANG_VERIFY=1 (the tests set it)."""
    return switch("TCLANG_VERIFY", False)


STAGE_FAILURES = (isl.Error, ValueError, KeyError)
"""What isl and the pipeline's own code raise inside a stage that means "this stage failed":
a `TCCompileError` naming the stage (tclang/stages.py)."""


def schedule_definition(defn: P.Definition, sizes: Mapping[str, int] | None,
                        options: Options, target: Target,
                        layouts: tuple | None = None,
                        collect: dict[str, str] | None = None) -> ScheduledKernel:
    """Schedule one definition for `target`, called alone (explain, export, a tool, a
    benchmark): under the compile's budget if one is open, else one of its own. `collect`
    receives each stage's text (tclang explain); TCLANG_DUMP prints them. The compile door
    calls `schedule_stages` itself, inside the budget and with the stages it opened."""
    with compile_budget.compiling(defn.name, options):
        stages = Stages(defn.name, failures=STAGE_FAILURES, collect=collect)
        return schedule_stages(defn, sizes, options, target, layouts, stages)


def schedule_stages(defn: P.Definition, sizes: Mapping[str, int] | None,
                    options: Options, target: Target, layouts: tuple | None,
                    stages: Stages) -> ScheduledKernel:
    """Schedule one definition for `target`, for concrete `sizes` or (None) for all sizes,
    inside an open compile budget (tclang/budget.py), timing and showing each stage in
    `stages` (made with STAGE_FAILURES); `sizes` that name only some of the sizes make code
    generic in the others (the automatic dynamic shapes of Options(specialize="auto"),
    tclang/runtime/kernels.py). `layouts`: each input's layout key (tclang/layouts.py: the
    strides in elements the code may hold as constants, None where read at run time, and a
    bound on the offsets of a layout with run-time strides), when specialized."""
    store = (options.passes is not False and not target.is_grid and rows_automatic(options)
             and sizes is not None)
    scheduled = _schedule(defn, sizes, options, target, layouts, stages, store)
    stored = scheduled.stored_terms
    if stored and not all(p.contracted for p in scheduled.kernel.temporaries
                          if p.buffer.name in stored):  # a full array: recompute instead
        scheduled = _schedule(defn, sizes, options, target, layouts, stages, False)
    return scheduled


def _schedule(defn: P.Definition, sizes: Mapping[str, int] | None, options: Options,
              target: Target, layouts: tuple | None, stages: Stages,
              store: bool) -> ScheduledKernel:
    """schedule_stages's stages; `store`: store row reductions' costly terms for their
    consumers (tclang/lang/passes/stored_terms.py)."""
    verify = verify_enabled()
    if any(s.is_scatter for s in defn.statements):  # the passes know no scatter
        options, store = replace(options, passes=False), False
    with stages("passes"):
        defn, report, stored = run_passes(defn, sizes, options, store, verify=verify,
                                          pack=packs_contractions(options, target, sizes))
    with stages("scop"):
        defn = scop_definition(defn, sizes, options, report, verify=verify)
        scop = build_scop(defn, sizes)
        check_recurrences(scop)
        if scop.specialized:
            check_bounds(scop)
            bounds = ()
        else:
            bounds = bounds_conditions(scop)
    stages.show("passes", lambda: passes_text(defn, report))
    stages.show("scop", lambda: scop_text(scop))
    with stages("dependences"):
        deps = compute_dependences(scop, options.reorder_reductions is not False)
    stages.show("dependences", lambda: dependences_text(deps))
    budget = compile_budget.current()
    with stages("schedule", check=False):  # a spent budget: program order (scheduler.py)
        result = compute_schedule(scop, deps, options.fusion or
                                  _automatic_fusion(defn, sizes, report))
    fallback, retry_at = result.fallback, result.retry_at
    budget.scheduled = True  # from here a spent budget never loses the schedule
    if budget.exceeded() and budget.fell_back is None:  # the stages left get a grace
        budget.fall_back(fallback or "the compile budget ran out in the schedule stage")
    stages.show("schedule", lambda: schedule_text(result.schedule))
    with stages("transform", check=False):
        reports: list[BandReport] = []
        tree, plans, packs, strategy = result.schedule, None, {}, result.strategy
        try:
            if budget.fell_back is not None and not target.is_grid:
                raise compile_budget.BudgetExceeded(budget, "schedule")
            tree, plans, strategy = _transform(result, scop, deps, options, target,
                                               reports, packs)
        except compile_budget.BudgetExceeded as spent:
            if target.is_grid:  # a GPU kernel cannot run without its mapping
                raise
            # the cheapest way out: the schedule as it came, untiled and untransformed
            reports, tree, plans, packs, strategy = [], result.schedule, None, {}, \
                result.strategy
            if budget.fell_back is None:
                budget.fall_back(str(spent))
            if retry_at is None:  # degraded: never stored, compiled in full later
                retry_at = time.monotonic() + RETRY_AFTER
            fallback = "; ".join(filter(None, (
                fallback, f"the compile budget of {budget.seconds:g} s ran out: the "
                          f"schedule is neither tiled nor transformed")))
        final_schedule = schedule_text(tree)
    stages.show("transform", final_schedule)
    with stages("loops"):
        kernel = lower_to_loops(scop, tree, deps, defn.name, unroll=options.unroll or 0,
                                launches=plans, parallel=options.parallel is not False,
                                vectorize=options.vectorize is not False, packs=packs,
                                reorder=options.reorder_reductions is not False)
        if not target.is_grid:  # temporaries used inside one iteration: per-thread slices
            kernel = contract_temporaries(kernel)
            kernel = split_guards(kernel)  # guards unswitched or split out of vector loops
        kernel = with_choices(kernel, options, target, layouts)
    stages.show("loops", lambda: format_kernel(kernel))
    return ScheduledKernel(kernel, final_schedule, strategy, fallback,
                           bounds, tuple(reports), dict(stages.timings), stored, retry_at)


def _transform(result, scop, deps, options: Options, target: Target,
               reports: list[BandReport], packs: dict) -> tuple:
    """The transform stage's work on the scheduler's `result`: (tree, GPU launch plans,
    strategy). Checks the compile budget band by band (polyhedral/tiling.py)."""
    tree, plans, strategy = result.schedule, None, result.strategy
    if options.loop_order is not None:
        tree = apply_loop_order(tree, scop, options.loop_order)
    check = options.loop_order is not None or verify_enabled()
    cause = f"loop_order={options.loop_order!r}" if options.loop_order else "the schedule"
    if target.is_grid:
        if check:  # mapping only spreads coincident members over blocks and threads
            check_legality(tree, deps, scop, cause)
        tree, plans = map_to_gpu(tree, scop, options, target)
    else:
        if rows_automatic(options):  # reductions and their consumers, one pass a row
            fused = fuse_rows(tree, scop, deps, target)
            strategy += " + rows" if fused is not tree else ""
            tree = fused
        tree = transform_bands(tree, scop, options, target, reports, packs)
        if check:
            check_legality(tree, deps, scop, cause)
        tree = graft_copies(tree, packs)  # only adds copies of read-only operands
    return tree, plans, strategy


def _automatic_fusion(defn: P.Definition, sizes, report: list) -> str:
    """polyhedral/guard_splitting.py's choice, except for a contraction copied into a
    matrix product's layout: its copies and its product are nests apart by design, and
    fused, isl's scheduler ran past its 3 s limit aligning the result's copy
    (`Z(g, v, e, h, m) = Z_sum(g*35 + h, ...)`) with the product's loops."""
    if any(name == CONTRACTION_LAYOUTS for name, _ in report):
        return "min"
    return automatic_fusion(defn, sizes)


def packs_contractions(options: Options, target: Target,
                       sizes: Mapping[str, int] | None) -> bool:
    """Whether tensor contractions are copied into a matrix product's layout
    (tclang/lang/passes/contraction_layouts.py): on the CPU, for known sizes, under the
    automatic schedule, with the reduction order the scheduler's to choose."""
    return (options.passes is not False and not target.is_grid and sizes is not None
            and options.tile is None and rows_automatic(options)
            and options.reorder_reductions is not False)


def run_passes(defn: P.Definition, sizes: Mapping[str, int] | None, options: Options,
               store: bool, *, verify: bool = False, pack: bool = False):
    """The passes stage: (the definition after the passes, explain's report of them, the
    temporaries that store row reductions' terms). `verify`: every pass's output is
    checked to name only what its statements have (tclang/lang/passes/rewrite.py,
    `check_names`), so a misplaced name is blamed on the pass that misplaced it."""
    report: list = []
    stored: tuple[str, ...] = ()
    if verify:
        check_names(defn, "the front end")
    if options.passes is not False:  # dead code, folding, exact identities, shared values
        defn, report = optimize(defn, sizes, verify=verify)
    if pack:
        defn, notes = pack_contractions(defn, sizes)
        defn = _checked(defn, CONTRACTION_LAYOUTS, verify)
        if notes:
            report.append((CONTRACTION_LAYOUTS, notes))
    if store:
        defn, notes, stored = store_reduction_terms(defn, sizes, SLICE_BYTES)
        defn = _checked(defn, STORED_TERMS, verify)
        if notes:
            report.append((STORED_TERMS, notes))
    return defn, report, stored


def scop_definition(defn: P.Definition, sizes: Mapping[str, int] | None, options: Options,
                    report: list, *, verify: bool = False) -> P.Definition:
    """The rewrites between the passes and the scop: exactly what `build_scop` gets.
    Its names are checked always (one linear walk): a rewrite that moved a name where it
    means nothing is a `TCCompileError` that says so, not isl's syntax error."""
    passes = options.passes is not False
    defn = widen_half_reductions(defn)  # half sums accumulate in float32
    defn = _checked(defn, "float32 accumulators of half sums", verify)
    if passes:  # a sum of `affine ? e : 0` runs over the points where it holds
        defn = _checked(restrict_guarded_sums(defn), "guarded sums", verify)
    if options.reorder_reductions is not False:  # scale a sum once, not every term
        defn = _checked(factor_out_scales(defn, sizes), "factoring out sums' scales", verify)
    defn = _checked(widen_indices(defn), "wide index values", verify)  # exact, in int64
    if passes:  # last: what the scop is built from, Lets and all
        defn = finish(defn, report, verify=verify)
    return check_names(defn, "the rewrites before the scop")


def _checked(defn: P.Definition, rewrite: str, verify: bool) -> P.Definition:
    return check_names(defn, rewrite) if verify else defn


def rows_automatic(options: Options) -> bool:
    """Row fusion (polyhedral/row_fusion.py) is part of the automatic fusion and of "max";
    "preserve_parallel" and "min" named by hand are isl's strategies alone, and a manual
    loop order names the loops of the nests isl made."""
    return options.fusion in (None, "max") and options.loop_order is None


def scop_text(scop) -> str:
    return (f"context: {scop.context}\ndomain: {scop.domain}\nreads: {scop.reads}\n"
            f"writes: {scop.writes}")


def dependences_text(deps) -> str:
    return (f"flow: {deps.flow}\nfalse: {deps.false}\nreduction: {deps.reduction}\n"
            f"fences: {deps.fences}")


def with_choices(kernel: L.Kernel, options: Options, target: Target,
                 layouts: tuple | None) -> L.Kernel:
    """The kernel with every decision the options make for code generation written on it,
    and its buffers' strides where they are constants: backends read only the kernel."""
    choices = L.CodeChoices(
        check_bounds=target.bounds_checked,
        reassociate=options.reorder_reductions is not False,
        always_threaded=bool(options.parallel),
        vectorize=options.vectorize is not False,
        vector_width=options.vector_width or 0,
        private_memory=options.private_memory is not False)
    sizes = dict(kernel.size_values) if kernel.size_values else None
    buffers, inputs = [], 0
    for buffer in kernel.buffers:
        strides, bound = None, None
        if buffer.kind == "input":
            if layouts is not None and inputs < len(layouts):
                strides, bound = layouts[inputs]
            inputs += 1
        elif sizes is not None:  # outputs and temporaries: the runtime allocates them
            strides = _row_major([_known(d, sizes) for d in buffer.shape])
        buffers.append(replace(buffer, strides=strides, offset_bound=bound))
    return replace(kernel, buffers=tuple(buffers), choices=choices)


def _known(extent: L.IExpr, sizes: dict[str, int]) -> int | None:
    """An extent's value, or None where it names a generic size (a partly generic kernel
    has only some sizes' values)."""
    try:
        return L.evaluate(extent, sizes)
    except KeyError:
        return None


def _row_major(shape: list[int | None]) -> tuple[int | None, ...] | None:
    """Row-major strides; None for a stride that depends on an extent not known (read at
    run time)."""
    strides, step = [], 1
    for extent in reversed(shape):
        strides.append(step)
        step = None if step is None or extent is None else step * max(extent, 1)
    return tuple(reversed(strides))
