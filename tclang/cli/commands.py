"""The `tclang` commands that need the whole compiler: explain, run, tune, compare, demo.

explain: the compiled kernel stage by stage (tclang.stages names them: scop, dependences,
schedule, transform, loops, code, llvm, llvm-opt, cuda, python) and its compile times.
run: random inputs, the kernel checked against the reference interpreter, and its time.
tune: tc.autotune from the command line (tclang.tuning.search).
compare: automatic vs manual vs tuned schedules and NumPy, one table and a chart
(tclang.tuning.compare).
demo: matmul, an MLP layer and softmax on the CPU, checked and timed against NumPy.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from tclang.errors import TCArgumentError, TCError
from tclang.tools.inputs import (check_input_memory, check_sizes, count_argument, input_bytes,
                           parse_sizes, positive_argument, random_inputs, read_source)
from tclang.options import FUSIONS, KNOBS, Options, knobs_options, parse_knob, parse_knobs


def add_commands(sub) -> None:
    explain = sub.add_parser("explain", help="show the schedule, loops and generated code")
    _common(explain)
    explain.add_argument("--stage", default=None,
                         help="what to print after the summary, in order: passes, scop, "
                              "dependences, schedule, transform, loops, code, llvm, "
                              "llvm-opt, cuda, python, timings (default: the summary alone)")
    explain.add_argument("--no-limits", action="store_true",
                         help="skip measuring the machine's sgemm and triad rates (the "
                              "summary's roofline then gives the work alone)")
    explain.add_argument("--grad", action="store_true",
                         help="print the generated backward definition (tc.grad) instead; "
                              "no --sizes needed")
    explain.add_argument("--wrt", default=None,
                         help="with --grad: the inputs to differentiate with respect to, "
                              "e.g. A,B (default: every floating-point input)")
    explain.set_defaults(run=_explain)

    run = sub.add_parser("run", help="run on random inputs, check the result (NumPy or the "
                                     "reference interpreter), print the time")
    _common(run)
    run.add_argument("--check", default="auto", choices=["auto", "full", "sample", "none"],
                     help="auto (default): NumPy where it computes the operator, else the "
                          "reference interpreter, on a random sample of output points when "
                          "the whole would take over ~2 s; full: every point however long; "
                          "sample: the interpreter on a sample; none: no check")
    run.add_argument("--repeat", type=count_argument(1), default=10,
                     help="timed runs (the median is printed)")
    run.add_argument("--seed", type=count_argument(0), default=0)
    run.set_defaults(run=_run)

    tune = sub.add_parser("tune", help="autotune a definition for some sizes and store the "
                                        "best options in the tuning database")
    tune.add_argument("file", help="a .tc source file")
    tune.add_argument("--entry", help="the definition (default: the only one)")
    tune.add_argument("--sizes", default="", help="size values, e.g. M=512,N=512,K=512")
    _tuning_arguments(tune)
    tune.add_argument("--budget", type=count_argument(1), default=64,
                      help="timed trials (default 64)")
    tune.add_argument("--strategy", default="evolution", choices=["evolution", "random"])
    tune.add_argument("--time-limit", type=positive_argument, default=60.0,
                      help="seconds per trial before it is killed (default 60)")
    tune.add_argument("--time-budget", type=positive_argument, default=None,
                      metavar="SECONDS", help="stop starting trials after this many seconds "
                                              "(the best few are timed again after)")
    tune.add_argument("--seed", type=count_argument(0), default=0)
    tune.set_defaults(run=_tune)

    compare = sub.add_parser(
        "compare", help="automatic vs manual vs tuned schedules (and NumPy): one table, "
                        "one chart")
    compare.add_argument("file", help="a .tc source file")
    compare.add_argument("--entry", help="the definition (default: the only one)")
    compare.add_argument("--sizes", default="", help="size values, e.g. M=512,N=512,K=512")
    compare.add_argument("--manual", action="append", default=[],
                         help='a manual schedule, e.g. "tile=32x32x64,unroll=4" (sizes '
                              'joined by x, a loop order by colons: loop_order=k:m:n); '
                              'repeat for several')
    compare.add_argument("--tune", type=count_argument(0), default=0, metavar="N",
                         help="also tune with N trials (stored in the tuning database)")
    compare.add_argument("--peers", default="numpy,torch",
                         help="peers timed beside (where einsum can write the kernel)")
    compare.add_argument("--rounds", type=count_argument(1), default=5,
                         help="interleaved timing rounds")
    compare.add_argument("--seed", type=count_argument(0), default=0)
    compare.add_argument("--out", default=".", help="folder for the chart "
                                                    "(compare-ENTRY.png)")
    compare.add_argument("--no-limits", action="store_true",
                         help="skip measuring the machine's sgemm and triad (no roofline)")
    compare.add_argument("--tuned", action="store_true",
                         help="also time the options `tclang tune` stored for these sizes")
    _tuning_arguments(compare)
    _knob_arguments(compare, whole=False)  # the knob flags: one more manual schedule
    compare.set_defaults(run=_compare)

    export = sub.add_parser(
        "export", help="a shared library with a C ABI and its header (runs without Python)")
    _common(export)
    export.add_argument("-o", "--output", required=True, help="folder for the library, "
                                                            "header and objects")
    export.add_argument("--target", default="cpu", choices=["cpu", "cuda"],
                        help="cpu: this machine (default); cuda: the .cu, PTX, cubin and a "
                             "library that launches them (needs nvcc, not a GPU)")
    export.add_argument("--arch", default="sm_80", help="the GPU architecture for "
                                                        "--target cuda (default sm_80)")
    export.set_defaults(run=_export)

    demo = sub.add_parser("demo", help="matmul, an MLP layer and softmax: checked against "
                                       "NumPy and timed")
    demo.add_argument("--size", type=count_argument(1), default=512, help="problem size (default 512)")
    demo.add_argument("--rounds", type=count_argument(1), default=9,
                      help="interleaved timing rounds (default 9; the median is shown)")
    demo.add_argument("--gap", type=float, default=0.25,
                      help="seconds of rest after every timing sample (default 0.25: "
                           "BLAS threads spin on after a call)")
    demo.set_defaults(run=_demo)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", help="a .tc source file")
    p.add_argument("--entry", help="the definition (default: the only one)")
    p.add_argument("--sizes", default="", help="size values, e.g. M=64,N=32")
    p.add_argument("--backend", default="cpu",
                   choices=["cpu", "cuda", "cuda-emulated", "reference"])
    _knob_arguments(p)


#: what each knob flag does, in a few words (tc.Options documents them in full)
_KNOB_HELP = {
    "fusion": "max, min or preserve_parallel",
    "tile": "tile sizes, e.g. 32x32x64 or 32,32,64 (0 leaves a loop untiled; off: none)",
    "unroll": "unroll innermost loops of at most this many iterations",
    "specialize": "off: shape-generic code (as --generic); on: every shape its own; auto",
    "loop_order": "loop order of the outer nest, e.g. k:m:n, k,m,n or 2,0,1",
    "parallel": "on or off: the outermost parallel loop on threads",
    "vectorize": "on or off: SIMD for innermost stride-1 loops",
    "vector_width": "SIMD lanes to ask for",
    "block": "GPU threads per block, e.g. 32x8",
    "grid": "GPU blocks per grid, e.g. 64x64",
    "shared_memory": "on or off: promote reused tiles to GPU shared memory",
    "private_memory": "on or off: GPU accumulators in registers",
    "reorder_reductions": "off: reductions in program order, bitwise reproducible",
    "check_bounds": "on: check every array access",
    "register_tile": "the CPU micro-kernel's register tile, e.g. 6x16, or off",
    "pack": "on or off: pack the micro-kernel's lane operand (default: where reused)",
    "passes": "off: no passes on the definition before scheduling",
    "compile_budget": "seconds for the whole compile (default: TCLANG_COMPILE_BUDGET, else 60)",
}

#: what each kind of knob value looks like, for a flag's usage error
_KNOB_EXPECTED = {
    "sizes": "sizes such as 32x32x64 or 32,32,64",
    "pair": "a pair of sizes such as 6x16, or off",
    "order": "a loop order such as k:m:n, k,m,n or 2,0,1",
    "count": "a whole number",
    "choice": "one of " + ", ".join(FUSIONS),
    "switch": "on or off",
    "seconds": "a number of seconds",
}


def _knob_argument(knob: str):
    """The argparse type of a knob flag: its value as the knob grammar reads it, else a
    usage error (exit 2, as for every number a flag does not take); the text itself is
    kept, for knobs_options to read after --options. A value Options refuses (a tile of
    -1, --fusion most) is a usage error too, as main's argparse choices made it.)"""
    def check(text: str) -> str:
        try:
            Options(**{knob: parse_knob(knob, text)})
        except TCError as err:
            raise argparse.ArgumentTypeError(
                f"expected {_KNOB_EXPECTED[KNOBS[knob]]}, not {text!r} ({err})") from None
        return text
    check.__name__ = knob  # what argparse names in its message
    return check


def _knob_arguments(p: argparse.ArgumentParser, whole: bool = True) -> None:
    """A flag per knob of tc.Options, each value in the knob grammar of tclang/options.py;
    `whole`: also --options (a whole knob string) and --tuned (the stored options)."""
    group = p.add_argument_group(
        "schedule knobs", 'each as in a knob string such as "tile=32x32x64,unroll=4" '
        "(what repr(tc.Options), tclang tune and compare --manual use); unset knobs stay "
        "automatic")
    if whole:
        group.add_argument("--options", metavar="KNOBS",
                           help='a knob string, e.g. "tile=32x32x64,unroll=4"; the knob '
                                "flags override it")
        group.add_argument("--tuned", action="store_true",
                           help="the options `tclang tune` stored for these sizes on this "
                                "machine (TCLANG_TUNING_DB), else the automatic schedule")
    for knob, kind in KNOBS.items():
        extra = dict(nargs="?", const="on", metavar="on|off") if kind == "switch" else \
            dict(metavar=knob.upper())
        group.add_argument("--" + knob.replace("_", "-"), dest=f"knob_{knob}",
                           type=_knob_argument(knob), help=_KNOB_HELP[knob], **extra)
    group.add_argument("--generic", action="store_true",
                       help="shape-generic code (--specialize off)")


def _knob_pairs(args) -> list[tuple[str, str]]:
    """(knob, value text) for each knob flag given, in the order of tc.Options."""
    pairs = [(k, getattr(args, f"knob_{k}")) for k in KNOBS
             if getattr(args, f"knob_{k}", None) is not None]
    return pairs + ([("specialize", "off")] if getattr(args, "generic", False) else [])


def _options(args) -> Options | str:
    """The Options of --options and the knob flags (the flags win), or "tuned"."""
    pairs = _knob_pairs(args)
    if args.tuned:
        if pairs or args.options:
            raise TCArgumentError("--tuned uses the stored options: give it without "
                                  "--options or knob flags",
                                  hint="or copy the options `tclang tune` printed into "
                                       "--options and change what you want")
        return "tuned"
    base = parse_knobs(args.options, "--options") if args.options else None
    return knobs_options(pairs, base)


def _kernel_and_inputs(args, backend: str | None = None):
    import tclang
    source = read_source(args.file)
    module = tclang.define(source, backend=backend or args.backend, options=_options(args))
    return (source,) + _entry_and_inputs(args, module)


def _entry_and_inputs(args, module):
    """The kernel --entry names (or the only one) and random inputs for --sizes."""
    names = module.names
    entry = args.entry or (names[0] if len(names) == 1 else None)
    if entry is None:
        raise TCError(f"{args.file} defines {', '.join(names)}: choose one with --entry")
    kernel = module[entry]
    sizes = parse_sizes(args.sizes)
    check_sizes(kernel.definition, sizes)
    check_input_memory(kernel.definition, sizes)
    seed = getattr(args, "seed", 0)
    try:
        return kernel, random_inputs(kernel.definition, sizes, np.random.default_rng(seed))
    except MemoryError as err:  # under the machine's memory, but not free now
        raise TCArgumentError(f"--sizes {args.sizes}: {kernel.name}'s random inputs "
                              f"({input_bytes(kernel.definition, sizes):,} bytes) cannot be "
                              f"allocated ({err})", hint="choose smaller sizes") from None


def _export(args) -> int:
    import tclang
    from tclang.tools.inputs import read_source
    if args.backend != "cpu":
        raise TCArgumentError(f"tclang export takes --target (cpu or cuda), not --backend "
                              f"{args.backend}")
    options = _options(args)
    generic = options != "tuned" and options.specialize is False
    if generic == bool(args.sizes):
        raise TCArgumentError("tclang export needs either --sizes (a library for those sizes) or "
                      "--generic (one for every size)",
                      hint="e.g. --sizes M=512,K=512,N=512, or --generic")
    module = tclang.define(read_source(args.file), options=options)
    names = module.names
    entry = args.entry or (names[0] if len(names) == 1 else None)
    if entry is None:
        raise TCError(f"{args.file} defines {', '.join(names)}: choose one with --entry")
    sizes = None
    if not generic:
        sizes = parse_sizes(args.sizes)
        check_sizes(module[entry].definition, sizes)
    lib = module[entry].export(args.output, sizes, args.target, args.arch)
    made_for = "every size" if sizes is None else \
        ", ".join(f"{k}={v}" for k, v in sizes.items())
    print(f"{lib.library}  ({lib.function}, for {made_for})")
    print(f"{lib.header}  (include it; link with -L{lib.library.parent} -ltclang_{entry})")
    return 0


def _explain(args) -> int:
    """The summary of the schedule's decisions, then the stages --stage names. The kernel
    is compiled afresh (no cache): every stage runs, so --stage timings shows each one's
    time and the summary knows why each band was tiled as it was."""
    if args.grad:
        return _explain_grad(args)
    from tclang.stages import STAGES, check_names
    chosen = [s.strip() for s in (args.stage or "").split(",") if s.strip()]
    check_names([s for s in chosen if s != "timings"])  # before any slow work
    _, kernel, inputs = _kernel_and_inputs(args)
    compiled = kernel.compile(*inputs, fresh=True)
    print(f"{kernel.signature}")
    print(f"backend {args.backend}; compiled afresh for explain in "
          f"{sum(compiled.timings.values()) * 1e3:.0f} ms (--stage timings: each stage)")
    if compiled.fallback:
        print(f"note: the requested schedule was replaced ({compiled.fallback})")
    limits = None
    if not args.no_limits and args.backend == "cpu":
        from tclang.driver.roofline import machine_limits
        limits = machine_limits(gap=0.1, n=1024, triad_elements=4_000_000)
    from tclang.runtime.arguments import bind_arguments
    sizes = bind_arguments(kernel.definition, inputs, False).sizes  # also when generic
    _section("summary", compiled.summary(sizes, limits).text())
    for stage in chosen:
        if stage == "timings":
            _section("compile time (a fresh compile, no cache)", _timings_text(compiled))
        else:
            _section(f"{stage}: {STAGES[stage]}", compiled.stage_text(stage))
    if not chosen:
        print("\n(more with --stage " + ",".join(STAGES) + ",timings)")
    return 0


def _timings_text(compiled) -> str:
    """Each stage's time for a compile of the kernel: a kernel that came from a cache is
    compiled again for the asking (its own timing is the load's alone)."""
    lines = []
    if compiled.cache != "compiled":
        load = compiled.timings.get("cache load")
        lines.append(f"(this kernel came from the {compiled.cache} cache"
                     + (f" in {load * 1e3:.1f} ms" if load is not None else "")
                     + "; a compile of it, timed now without the caches:)")
    timings = compiled.compile_timings()
    lines += [f"{k:>12}: {v * 1e3:8.1f} ms" for k, v in timings.items()]
    lines.append(f"{'total':>12}: {sum(timings.values()) * 1e3:8.1f} ms")
    return "\n".join(lines)


def _explain_grad(args) -> int:
    import tclang
    module = tclang.define(read_source(args.file), backend=args.backend)
    names = module.names
    entry = args.entry or (names[0] if len(names) == 1 else None)
    if entry is None:
        raise TCError(f"{args.file} defines {', '.join(names)}: choose one with --entry")
    wrt = tuple(w.strip() for w in args.wrt.split(",")) if args.wrt else None
    g = tclang.grad(module[entry], wrt)
    if g.forward_source != module[entry].definition.source:
        _section("forward, saving what the backward reads", g.forward_source)
    _section(f"backward: the gradient with respect to {', '.join(g.wrt)}", g.source)
    return 0


def _tuning_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--backend", default="cpu", choices=["cpu", "cuda", "cuda-emulated"],
                   help="cpu (default); cuda: trials in a spawned worker per GPU; "
                        "cuda-emulated: the generated CUDA on the CPU")
    p.add_argument("--jobs", type=count_argument(1), default=None,
                   help="trials at once on this machine (default 2; with --backend cuda, "
                        "the GPUs used, default all); compiles overlap, timings never do")
    p.add_argument("--scheduler", default=None, metavar="ADDRESS",
                   help="run the trials on a Dask cluster, e.g. tcp://host:8786 "
                        "(pip install 'tclang[tune]')")
    p.add_argument("--database", default=None,
                   help="the tuning database (default: TCLANG_TUNING_DB or tuning.sqlite "
                        "in the cache directory)")


def _executor(args):
    """A dask.distributed Client for --scheduler, else None (the local pool)."""
    if not args.scheduler:
        return None
    try:
        from distributed import Client
    except ImportError:
        raise TCError("--scheduler needs Dask: pip install 'tclang[tune]'") from None
    return Client(args.scheduler)


def _tune(args) -> int:
    import tclang
    kernel, inputs = _entry_and_inputs(args, tclang.define(read_source(args.file),
                                                            backend=args.backend))
    executor = _executor(args)
    try:
        result = tclang.autotune(kernel, *inputs, budget=args.budget, jobs=args.jobs,
                                 executor=executor, seed=args.seed, strategy=args.strategy,
                                 time_limit=args.time_limit, database=args.database,
                                 time_budget=args.time_budget)
    finally:
        if executor is not None:
            executor.close()
    print(result)
    print(_tuned_usage(args, kernel.name, result))
    return 1 if result.counts()["wrong"] else 0


def _tuned_usage(args, entry: str, result) -> str:
    """Where the tuning went and the ways to use it: --tuned (with TCLANG_TUNING_DB when
    the database is not the default one), options="tuned", or the knobs by hand."""
    import shlex
    knobs = result.best.describe()
    by_hand = f'  by hand:  --options "{knobs}", or tc.Options.parse("{knobs}")' \
        if knobs != "automatic" else "  (the automatic schedule was the fastest)"
    if not result.stored:
        return "\nnot stored in the tuning database (see the warning)\n" + by_hand
    from pathlib import Path

    from tclang.driver.tuning_database import default_path
    sizes = f" --sizes {args.sizes}" if args.sizes else ""
    if getattr(args, "backend", "cpu") != "cpu":
        sizes += f" --backend {args.backend}"
    try:
        default = default_path().resolve()
    except (TCError, OSError):  # no usable cache directory: only --database can be used
        default = None
    env = ""
    if Path(result.database).resolve() != default:
        env = f"TCLANG_TUNING_DB={shlex.quote(result.database)} "
    return (f"\nstored for {entry} at these sizes on this machine; use them with\n"
            f"  {env}tclang run {shlex.quote(args.file)} --entry {entry}{sizes} --tuned   "
            "(or explain, export, compare --tuned)\n"
            f'  tc.define(source, options="tuned")' + (" with that TCLANG_TUNING_DB" if env
                                                       else "") + "\n" + by_hand)


def _compare(args) -> int:
    import os

    import tclang
    from tclang.tuning.compare import compare, parse_manual
    manual = [(f"manual: {spec}", parse_manual(spec)) for spec in args.manual]  # early
    if _knob_pairs(args):  # knob flags: one more manual schedule
        flags = knobs_options(_knob_pairs(args))
        manual.append((f"manual: {flags.describe()}", flags))
    kernel, inputs = _entry_and_inputs(args, tclang.define(read_source(args.file),
                                                            backend=args.backend))
    if args.tuned:
        stored = kernel.tuned_options(*inputs, database=args.database)
        if stored is None:
            raise TCArgumentError(f"no tuned options of {kernel.name} are stored for these "
                                  "sizes on this machine", hint="tune them first (tclang "
                                  "tune, or --tune N here)")
        manual.append((f"tuned (stored): {stored.describe()}", stored))
    executor = _executor(args)
    try:
        result = compare(kernel, *inputs, manual=manual, tune=args.tune, seed=args.seed,
                         peers=[p.strip() for p in args.peers.split(",") if p.strip()],
                         rounds=args.rounds, limits=not args.no_limits, jobs=args.jobs,
                         executor=executor, database=args.database)
    finally:
        if executor is not None:
            executor.close()
    print(result.table())
    os.makedirs(args.out, exist_ok=True)
    chart = result.plot(os.path.join(args.out, f"compare-{kernel.name}.png"))
    print(f"\nchart: {chart}" if chart else "\n(pip install matplotlib for a chart)")
    refused = [r for r in result.rows if r.status != "ok"]
    return 1 if any(r.status in ("wrong", "crashed", "error") for r in refused) else 0


def _section(title: str, text: str) -> None:
    print(f"\n== {title} " + "=" * max(0, 60 - len(title)))
    print(text.rstrip())


def _run(args) -> int:
    """Compile, run once, check the result with a bounded wait (tclang.tools.checking: NumPy
    where it computes the operator, else the reference interpreter on all or a sample of
    the output points, a progress bar past ~2 s), then time --repeat runs."""
    from tclang.tools.checking import check
    from tclang.runtime.arguments import call_numpy
    from tclang.tools.timing import spread
    _, kernel, inputs = _kernel_and_inputs(args)
    start = time.perf_counter()
    compiled = kernel.compile(*inputs)
    compile_s = time.perf_counter() - start
    result = call_numpy(compiled, inputs)
    checked = check(kernel, inputs, result, mode=args.check)
    outs = result if len(result) > 1 else result[0]
    times = []
    for _ in range(max(1, args.repeat)):
        start = time.perf_counter()
        compiled(*inputs, out=outs)
        times.append(time.perf_counter() - start)
    how = "compiled" if compiled.cache == "compiled" else f"loaded from the {compiled.cache} cache"
    print(f"{kernel.name} on {args.backend} ({how} in {compile_s * 1e3:.0f} ms): "
          f"{checked.text()}" + (f" [check: {checked.seconds:.1f} s]" if checked.seconds >= 1
                                 else ""))
    print(f"median of {len(times)} runs: {np.median(times) * 1e3:.3f} ms "
          f"±{spread(times):.0%} (best {min(times) * 1e3:.3f} ms)")
    return 1 if checked.ok is False else 0


def _as_tuple(x):
    return x if isinstance(x, tuple) else (x,)


DEMO = """
def matmul(float(M, K) A, float(K, N) B) -> (C) {
    C(m, n) +=! A(m, k) * B(k, n)
}
def mlp_layer(float(B, I) X, float(O, I) W, float(O) bias) -> (Y) {
    Y(b, o) +=! X(b, i) * W(o, i)
    Y(b, o)  = fmax(Y(b, o) + bias(o), 0)
}
def softmax(float(N, D) X) -> (Y) {
    rowmax(n) max=! X(n, d)
    rowsum(n) +=! exp(X(n, d) - rowmax(n))
    Y(n, d) = exp(X(n, d) - rowmax(n)) / rowsum(n)
}
"""


def _demo(args) -> int:
    """Each operator compiled (or loaded from a cache: said so), checked against NumPy in
    float64, then timed against NumPy by tclang.tools.timing: interleaved rounds with rests,
    medians with their spread, both writing into preallocated outputs. The speed column is
    the median over the rounds of NumPy's time over tclang's in the same round, so load
    that comes and goes between rounds cancels out of it."""
    import tclang
    from tclang.tools.timing import interleaved, spread
    n = args.size
    rng = np.random.default_rng(0)
    f32 = np.float32
    A, B = rng.standard_normal((n, n), f32), rng.standard_normal((n, n), f32)
    X, W, bias = rng.standard_normal((n, n), f32), rng.standard_normal((n, n), f32), \
        rng.standard_normal(n, f32)
    S = rng.standard_normal((4 * n, n), f32)

    def softmax(x, out=None):
        e = np.exp(x - x.max(axis=1, keepdims=True))
        return np.divide(e, e.sum(axis=1, keepdims=True), out=out)

    def f64(*arrays):
        return [a.astype(np.float64) for a in arrays]

    module = tclang.define(DEMO)
    cases = [("matmul", (A, B), lambda out: np.matmul(A, B, out=out),
              lambda: np.matmul(*f64(A, B))),
             ("mlp_layer", (X, W, bias), lambda out: np.maximum(X @ W.T + bias, 0, out=out),
              lambda: np.maximum(f64(X)[0] @ f64(W)[0].T + bias, 0)),
             ("softmax", (S,), lambda out: softmax(S, out=out), lambda: softmax(*f64(S)))]
    print(f"tclang {tclang.__version__}: three one-line operators, size {n}, on the CPU; "
          f"times are medians of {args.rounds} interleaved rounds with {args.gap:g} s "
          f"rests, ± the interquartile range over the median")
    print(_load_note() + "\n")
    print("| operator | compile | max error vs NumPy (float64) | tclang (ms) | NumPy (ms) | "
          "NumPy time / tclang time |")
    print("|---|---|---|---|---|---|")
    ok = True
    bar = _demo_bar(len(cases) * 2 * args.rounds)
    try:
        for name, inputs, numpy_fn, expected_fn in cases:
            kernel = module[name]
            start = time.perf_counter()
            compiled = kernel.compile(*inputs)
            compile_s = time.perf_counter() - start
            how = "compiled" if compiled.cache == "compiled" else \
                f"loaded from the {compiled.cache} cache"
            result = compiled(*inputs)
            expected = expected_fn()
            error = float(np.max(np.abs(result - expected) / np.maximum(np.abs(expected), 1)))
            ok &= error < 1e-3
            ours, theirs = np.empty_like(result), np.empty_like(result)
            timings = interleaved({"tclang": lambda: compiled(*inputs, out=ours),
                                   "numpy": lambda: numpy_fn(theirs)},
                                  rounds=args.rounds, gap=args.gap, least=0.05,
                                  after_sample=lambda *_: bar.update(1))
            mine, peer = timings["tclang"], timings["numpy"]
            ratios = [p / m for p, m in zip(peer.samples, mine.samples)]
            bar.clear()
            print(f"| {name} | {compile_s:.2f} s, {how} | {error:.1e} | {mine.text()} | "
                  f"{peer.text()} | {float(np.median(ratios)):.2f}x ±{spread(ratios):.0%} |",
                  flush=True)
    finally:
        bar.close()
    print("\nall results match NumPy" if ok else "\nSOME RESULTS DIFFER FROM NUMPY")
    return 0 if ok else 1


def _load_note() -> str:
    """What else is running: the figures are this machine's, now, and a loaded machine
    slows multi-threaded code (tclang's and BLAS's alike) far more than its load says."""
    import os
    cores = os.cpu_count() or 1
    try:
        load = os.getloadavg()[0]
    except OSError:
        return f"{cores} cores"
    note = f"{cores} cores, load average {load:.1f}"
    if load > 0.5 * cores:
        note += (": other programs are running, so both sides run slower than on a quiet "
                 "machine and the spreads are wider")
    return note


def _demo_bar(total: int):
    from tclang.tuning.search import progress_bar
    return progress_bar(total, "timing", True, unit="sample")
