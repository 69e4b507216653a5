"""`tclang fuzz`: generated programs through the differential runner, N of them or for T
seconds, or (--source-fuzz) broken source text through `tclang.define`.

Programs run in a worker process, so that generated code that crashes or hangs is reported
with the program that caused it instead of taking the fuzzer down. Each failing program is
shrunk (in the worker too) and written to the output directory as a .tc file with its
sizes and what failed; --regressions also appends it to tests/fuzzing/regressions.py.
A failure of an extra check (a module's cache, a gradient, an interrupted compile) is
written as it is, with a script reproducing it (failure-K.py) where it has one.

Every worker gets the same disk cache directory for the run (a new temporary one unless
--cache-dir names one), so that what one process compiled is what the others load: the
module check and the interrupted compiles rely on it, and the user's own cache is never
touched. The summary says how many programs exercised each feature.
"""

from __future__ import annotations

import atexit
import multiprocessing
import os
import random
import sys
import time
import warnings
from collections import Counter
from pathlib import Path

TIMEOUT_S = 120.0  # one program, every configuration: no result by then is a hang
HANG_PARTS = 4
"""...or by this many times `program_seconds`, where that is longer: a program runs several
parts (its differential run, a gradient check, a second-order check), each allowed
`program_seconds` before it is "slow", so with `--program-seconds 60` a slow program
passed 120 s and was reported as a hang, a crash (seed 2038, program 355: a gradgradcheck
of a 6-statement program, 149 s beside the run's other worker and a test run)."""
RECYCLE = 200  # programs per worker process: compiled kernels stay loaded until it exits
PROGRAM_SECONDS = 10.0  # a program slower than this (every configuration) is a failure
PROGRAM_MEMORY_MB = 1024.0  # and so is one that takes its worker's memory past this


def add_command(sub) -> None:
    """Register `fuzz` on an argparse subparsers object (tclang/cli.py calls this)."""
    from tclang.tools.inputs import count_argument, positive_argument
    p = sub.add_parser("fuzz", help="differential fuzzing: random programs on every backend "
                                    "and schedule, checked against the reference")
    p.add_argument("--programs", type=count_argument(1),
                   help="how many programs (default 100 unless --seconds is given)")
    p.add_argument("--seconds", type=positive_argument, help="stop after this long")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--backends", help="comma-separated (default: cpu,reference and "
                                      "cuda-emulated where g++ is available)")
    p.add_argument("--out", default="fuzz-failures", help="where shrunk failing programs go")
    p.add_argument("--regressions", action="store_true",
                   help="also append failing programs to tests/fuzzing/regressions.py")
    p.add_argument("--jobs", type=count_argument(1), default=1,
                   help="worker processes running programs at once (default 1)")
    p.add_argument("--no-shrink", action="store_true")
    p.add_argument("--program-seconds", type=positive_argument, default=PROGRAM_SECONDS,
                   help="a program taking longer (compiles and runs, every configuration) "
                        f"fails as 'slow' (default {PROGRAM_SECONDS:g})")
    p.add_argument("--program-memory-mb", type=positive_argument, default=PROGRAM_MEMORY_MB,
                   help="a program taking its worker's peak memory past this fails as "
                        f"'memory' (default {PROGRAM_MEMORY_MB:g})")
    p.add_argument("--include-known", action="store_true",
                   help="also run the configurations that hit known open bugs")
    p.add_argument("--source-fuzz", action="store_true",
                   help="fuzz the source text instead (--programs inputs through define)")
    p.add_argument("--cache-dir", help="the disk cache every worker shares (default: a new "
                                       "temporary directory, removed after the run)")
    p.add_argument("--share", action="append", default=[], metavar="FEATURE=P",
                   help="the share of programs that get a feature (repeatable): "
                        "reduction, module, gradcheck, gradgradcheck (of those with "
                        "gradcheck), tuner_options, interrupt, grad, recurrence, scatter; e.g. "
                        "--share module=1")
    p.add_argument("--plain", action="store_true",
                   help="the generic generator's programs only, with no extra checks")
    p.set_defaults(run=_main)


def _main(args) -> int:
    if args.source_fuzz:
        return run_source_fuzz(args.programs or 2000, args.seed)
    backends = tuple(b.strip() for b in args.backends.split(",")) if args.backends else None
    programs = args.programs if args.programs or args.seconds else 100
    return run_fuzz(programs, args.seconds, args.seed, backends, args.out,
                    shrink_failures=not args.no_shrink, regressions=args.regressions,
                    avoid_known=not args.include_known, jobs=args.jobs,
                    program_seconds=args.program_seconds,
                    program_memory_mb=args.program_memory_mb,
                    generate=_generator(args.plain, args.share), cache_dir=args.cache_dir)


def _generator(plain: bool, shares: list[str]):
    """The program generator the command line asks for (None: fuzz_program's shares)."""
    from tclang.errors import TCArgumentError
    from tclang.fuzzing.features import SHARES, fuzz_program
    from tclang.fuzzing.generator import generate
    if plain:
        return generate
    given = {}
    for item in shares:
        name, _, value = item.partition("=")
        try:
            given[name.strip()] = float(value)
        except ValueError:
            given[name.strip()] = -1.0
        if name.strip() not in SHARES or not 0 <= given[name.strip()] <= 1:
            raise TCArgumentError(f"--share takes FEATURE=P with P between 0 and 1 and "
                                  f"FEATURE one of {', '.join(SHARES)}, not {item!r}")
    return (lambda rng: fuzz_program(rng, given)) if given else None


def run_fuzz(programs: int | None, seconds: float | None, seed: int, backends, out_dir,
             *, shrink_failures: bool = True, regressions: bool = False,
             avoid_known: bool = True, generate=None, jobs: int = 1,
             program_seconds: float = PROGRAM_SECONDS,
             program_memory_mb: float = PROGRAM_MEMORY_MB, cache_dir=None) -> int:
    """The fuzz loop; returns the exit code (1 if any program failed). `generate` makes
    program k from a `random.Random` (default: `features.fuzz_program`, the generic
    generator's programs with reduction programs and extra checks); `jobs` worker
    processes run programs at once (results and reports stay the same whatever the
    number), sharing `cache_dir` (default: a temporary directory) as their disk cache. A
    program with a part (its differential run, or one extra check) over `program_seconds`,
    or over `program_memory_mb`, fails ("slow", "memory"); the summary names the slowest
    program and the largest peak memory, and counts what the programs exercised."""
    import shutil
    import tempfile

    from tclang.fuzzing.differential import cuda_emulation_available
    from tclang.fuzzing.features import fuzz_program
    generate = generate or fuzz_program
    if backends is None:
        backends = ("cpu", "reference") + (("cuda-emulated",) if cuda_emulation_available()
                                           else ())
    temporary = cache_dir is None
    cache_dir = tempfile.mkdtemp(prefix="tclang-fuzz-cache-") if temporary else str(cache_dir)
    try:
        return _loop(programs, seconds, seed, backends, out_dir, shrink_failures, regressions,
                     avoid_known, generate, jobs, program_seconds, program_memory_mb,
                     {"TCLANG_CACHE_DIR": os.path.abspath(cache_dir)})
    finally:
        if temporary:
            shutil.rmtree(cache_dir, ignore_errors=True)


def _loop(programs, seconds, seed, backends, out_dir, shrink_failures, regressions,
          avoid_known, generate, jobs, program_seconds, program_memory_mb, env) -> int:
    from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
    counts, features, start = Counter(), Counter(), time.monotonic()
    spent: Counter = Counter()  # worker seconds in each part of the programs
    # (seconds or MB, program number); -1 so that the first report always wins (a worker
    # that died reports 0 s, and (0.0, None) against (0.0, 0) compared None with 0)
    slowest, heaviest = (-1.0, None), (-1.0, None)
    idle = [Worker(env, hang_seconds(program_seconds)) for _ in range(max(1, jobs))]
    running: dict = {}  # future -> (k, worker)

    def more() -> bool:
        return (programs is None or k < programs) and \
            (seconds is None or time.monotonic() - start < seconds)

    k = done = 0
    interrupted = False
    try:
        with ThreadPoolExecutor(len(idle)) as pool:
            try:
                while running or (idle and more()):
                    while idle and more():
                        # generated here, in one thread: warnings.catch_warnings is not
                        # thread-safe, and program k must not depend on the number of jobs
                        program, worker = generate(random.Random(f"{seed}:{k}")), idle.pop()
                        future = pool.submit(worker.run, program, backends=backends, seed=k,
                                             avoid_known=avoid_known)
                        running[future] = (k, worker)
                        k += 1
                    finished, _ = wait(running, return_when=FIRST_COMPLETED)
                    for future in finished:
                        number, worker = running.pop(future)
                        report = future.result()
                        slowest = max(slowest, (report.seconds, number))
                        heaviest = max(heaviest, (report.peak_rss_mb, number))
                        if _over_limits(report, program_seconds, program_memory_mb):
                            worker.close()  # a fresh worker: its peak memory starts again
                        counts[report.status] += 1
                        features.update(set(report.features))
                        spent.update(report.check_seconds)
                        counts["known"] += any("known bug" in x
                                               for x in report.skipped + [report.why])
                        for f in report.failures:
                            counts[f.kind] += 1
                        if report.status == "fail":
                            _record(report, number, worker, out_dir, shrink_failures, regressions)
                        idle.append(worker)
                        done += 1
                        _progress(counts, done, time.monotonic() - start)
            except KeyboardInterrupt:
                # Ctrl-C: stop now and say what the programs run so far found; the
                # programs in flight end with their workers (their reports go unread)
                interrupted = True
                for _, worker in running.values():
                    worker.close()
    finally:
        for worker in idle + [w for _, w in running.values()]:
            worker.close()
    if sys.stderr.isatty() or done % (10 if done <= 100 else 100):
        _progress(counts, done, time.monotonic() - start, final=True)
    failed = counts["fail"]
    elapsed = time.monotonic() - start
    print(f"slowest program: {slowest[1]} ({max(slowest[0], 0):.1f} s); largest worker peak "
          f"memory: {max(heaviest[0], 0):.0f} MB (program {heaviest[1]}); "
          f"{60 * done / max(elapsed, 1e-9):.1f} programs a minute")
    print(feature_summary(features))
    print("worker seconds: " + ", ".join(f"{part} {took:.0f}" for part, took in
                                           sorted(spent.items(), key=lambda x: -x[1])))
    print(f"{counts['pass']} passed, {failed} failed" +
          (f" (interrupted: {done} of {programs or k} programs ran)" if interrupted else ""))
    return 130 if interrupted else 1 if failed else 0


def feature_summary(features: Counter) -> str:
    """How many programs exercised each feature (report.features' labels, counted once
    per program), as one line."""
    def n(*labels: str) -> int:
        return sum(features[x] for x in labels)
    families = sorted(x for x in features if x.startswith("family ") and
                      not x.endswith(" on cuda-emulated"))
    reductions = sum(features[x] for x in families)
    on_gpu = sum(features[f"{x} on cuda-emulated"] for x in families)
    kinds = ", ".join(f"{x[7:]} {features[x]}" for x in families)
    styles = ", ".join(f"{x[14:]} {features[x]}" for x in sorted(features)
                       if x.startswith("module layout "))
    forms = ", ".join(f"{x[len('grad of '):]} {features[x]}" for x in sorted(features)
                      if x.startswith("grad of "))
    torch_forms = ", ".join(f"{x[len('gradcheck of '):]} {features[x]}" for x in
                            sorted(features) if x.startswith("gradcheck of "))
    return "\n".join([
        f"gradients of where clauses and guards: tc.grad: {forms or 'none'}; torch "
        f"gradcheck: {torch_forms or 'none'}",
        f"features: multi-def modules: {n('module')} ({styles or 'none'}), guarded "
        f"reductions: {reductions} (cuda-emulated {on_gpu}; {kinds or 'none'}), "
        f"grad: {n('grad', 'grad (a point not smooth)')} "
        f"(not differentiable {n('grad: not differentiable')}), torch gradcheck: "
        f"{n('gradcheck')}, gradgradcheck: {n('gradgradcheck')}, options: {n('options')} "
        f"(tuner's space {n('tuner options')}), interrupted compiles: {n('interrupt')} "
        f"(landed during the compile {n('interrupt landed during the compile')})"])


def _over_limits(report, seconds: float, memory_mb: float) -> bool:
    """Add a "slow" or "memory" failure to `report` for each limit it went past: the time
    limit applies to each part (the differential run, each extra check) on its own. Peak
    memory only grows in a process, so the worker is replaced after a program over the
    memory limit: the next program is measured from a fresh start."""
    from tclang.fuzzing.differential import Failure
    over = []
    parts = report.check_seconds or {"program": report.seconds}
    for part, took in parts.items():
        if took > seconds:
            over.append(Failure("runner", None, "slow",
                                f"{took:.1f} s (limit {seconds:g} s)"
                                + (f" in the {part} check" if part != "differential" and
                                   part != "program" else "")))
    if report.peak_rss_mb > memory_mb:
        over.append(Failure("runner", None, "memory",
                            f"peak {report.peak_rss_mb:.0f} MB (limit {memory_mb:g} MB)"))
    if over:
        report.failures.extend(over)
        report.status = "fail"
    return bool(over)


def _progress(counts: Counter, k: int, elapsed: float, final: bool = False) -> None:
    line = (f"[fuzz] {k} programs, {counts['mismatch']} mismatches, {counts['crash']} crashes,"
            f" {counts['out-of-bounds']} out-of-bounds, {counts['modified-input']} modified "
            f"inputs, {counts['wrong-cached-kernel']} wrong cached kernels, "
            f"{counts['grad-mismatch']} wrong gradients, {counts['lost-interrupt']} lost "
            f"interrupts, {counts['slow']} slow, {counts['memory']} over memory, "
            f"{counts['skipped']} skipped, {counts['known']} hit known bugs, "
            f"{elapsed:.0f} s")
    if sys.stderr.isatty():
        print("\r" + line, end="\n" if final else "", file=sys.stderr, flush=True)
    elif final or k % (10 if k <= 100 else 100) == 0:
        print(line, file=sys.stderr, flush=True)


def _record(report, k: int, worker: "Worker", out_dir, shrink_failures: bool,
            regressions: bool) -> None:
    from tclang.fuzzing.differential import fails_like, save_regression, shrink
    failure = report.failures[0]
    program = report.program
    # the whole program's cost, or an extra check's whole setting (a module, a gradient,
    # an interrupt): not shrunk
    whole = failure.kind in ("slow", "memory") or bool(failure.check)
    if shrink_failures and not whole:
        program = shrink(program, fails_like(failure, run=worker.run, seed=k), budget=150)
    reason = f"{failure.config}: {failure.kind}: {failure.detail}"
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"failure-{k}.tc"
    sizes = ",".join(f"{n}={v}" for n, v in sorted(program.sizes.items()))
    others = "".join(f"# also {f.config}: {f.kind}: {f.detail[:300]}\n"
                     for f in report.failures[1:])
    path.write_text(f"# {reason}\n{others}# tclang run {path.name} --entry {program.entry} "
                    f"--sizes {sizes}\n{program.source}")
    repro = next((f.repro for f in report.failures if f.repro), "")
    if repro:
        path.with_suffix(".py").write_text(repro)
    if regressions and not whole:
        save_regression(program, "OPEN " + reason, options=failure.options)
    print(f"\n[fuzz] program {k} failed ({reason[:200]}); shrunk program: {path}",
          file=sys.stderr)


def hang_seconds(program_seconds: float) -> float:
    """How long a worker may take over one program before the program is a hang."""
    return max(TIMEOUT_S, HANG_PARTS * program_seconds)


class Worker:
    """A child process running the differential runner; restarted after it dies. `env`:
    environment variables the child sets before it runs anything (the run's shared cache
    directory); `timeout`: seconds without a result after which the program is a hang."""

    def __init__(self, env: dict | None = None, timeout: float = TIMEOUT_S):
        self.timeout = timeout
        self.process = self.conn = None
        self.served = 0
        self.env = dict(env or {})
        atexit.register(self.close)  # before multiprocessing's own exit hook joins it

    def run(self, program, **kwargs):
        """`run_differential(program, **kwargs)` in the child; a crash or a hang of the
        child is a "crash" failure of the program."""
        from tclang.fuzzing.differential import Failure, Report
        for _ in range(2):
            if self.process is None or not self.process.is_alive():
                self._start()
            try:
                self.conn.send((program, kwargs))
                if self.conn.poll(self.timeout):
                    report = self.conn.recv()
                    self.served += 1
                    if self.served % RECYCLE == 0:
                        self.close()  # a fresh process: memory stays bounded on long runs
                    return report
                why = f"no result after {self.timeout:.0f} s (hang?)"
            except (EOFError, OSError, BrokenPipeError):
                why = None
            self.process.join(0.5)
            code = self.process.exitcode
            self.close()
            why = why or f"the worker process died (exit code {code})"
            if code is not None and code < 0 or why.startswith("no result"):
                break  # a signal or a hang: the program's fault
        options = kwargs.get("options_sets") or [None]
        backend = kwargs.get("backends", ("cpu",))[0]
        return Report(program, "fail", [Failure(backend, options[0], "crash", why)])

    def _start(self):
        ctx = multiprocessing.get_context("spawn")
        self.conn, child = ctx.Pipe()
        # not a daemon: the compiler forks processes of its own (isl's scheduler)
        self.process = ctx.Process(target=_serve, args=(child, self.env), daemon=False)
        self.process.start()
        child.close()

    def close(self):
        if self.process is not None:
            if self.process.is_alive():
                self.process.kill()
            self.process.join(2)
        self.process = self.conn = None


def _serve(conn, env: dict | None = None) -> None:
    """The worker's loop: LLVM's remarks go to /dev/null, reports go back."""
    os.environ.update(env or {})
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    from tclang.fuzzing.differential import Failure, Report, run_differential
    while True:
        try:
            program, kwargs = conn.recv()
        except EOFError:
            return
        start = time.monotonic()
        try:
            report = run_differential(program, **kwargs)
        except Exception as err:  # noqa: BLE001 - the runner itself failing is reported
            report = Report(program, "fail", [Failure("runner", None, "crash",
                                                      f"{type(err).__name__}: {err}")])
        report.seconds = time.monotonic() - start
        report.peak_rss_mb = _peak_rss_mb()
        conn.send(report)


def _peak_rss_mb() -> float:
    """The largest peak resident memory of this process, its finished children and its
    live helper processes (the scheduler and the LLVM optimizer: tclang.forked_server);
    Linux reports kilobytes."""
    import resource
    from tclang.forked_server import helper_pids
    # this process's own high-water mark from /proc: Linux keeps ru_maxrss across execve,
    # so a worker spawned (fork, then exec) by a process of 1 GB reported 1 GB before it
    # ran anything (a pytest worker that had run heavier tests failed every program)
    own = _high_water_mb("self")
    peaks = [own if own is not None else
             resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
             resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024]
    for pid in helper_pids():
        peak = _high_water_mb(str(pid))
        if peak is not None:  # (None: it has just ended, counted with the finished children)
            peaks.append(peak)
    return max(peaks)


def _high_water_mb(pid: str) -> float | None:
    """VmHWM of a process (its memory's peak since its last exec), None without /proc."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


# ---- source fuzzing -----------------------------------------------------------------------

TOKENS = ["def", "(", ")", "{", "}", ",", "->", "float", "int32", "half", "bf16", "double",
          "bool", "int8", "A", "B", "O", "i", "j", "k", "N", "M", "=", "+=!", "+=", "*=!", "min=!",
          "max=", "+", "-", "*", "/", "%", "?", ":", "==", "!=", "<=", ">", "&&", "||", "!",
          "where", "in", "exists", "0", "1", "2.5", "1e3", "-7", ";", "exp", "min", "max",
          "fma", "sigmoid", "true", "#c\n", "\n", " ", "[", "@", "'", ".", "T", "x", "0:N",
          "99999999999", "1e400", "\t", "\u00e9", "\\"]


_CLASSES = (r"[A-Za-z_]\w*", r"\d+\.\d*(?:[eE][-+]?\d+)?|\d+",
            r"\+=!|\*=!|min=!|max=!|\+=|\*=|min=|max=|&&|\|\||[=!<>]=|[-+*/%<>]")


def mutate(rng: random.Random, text: str) -> str:
    """Half the time a token swapped for another of its class (a name, a number, an
    operator: often still valid, so the compiler runs), else 1-4 random edits: delete,
    insert or replace a token, duplicate or swap a span."""
    if rng.random() < 0.5:
        import re
        pattern = rng.choice(_CLASSES)
        tokens = list(re.finditer(pattern, text))
        for _ in range(rng.randint(1, 2)):
            if tokens:
                a, b = rng.choice(tokens), rng.choice(tokens)
                text = text[:a.start()] + b.group() + text[a.end():]
                tokens = list(re.finditer(pattern, text))
        return text
    for _ in range(rng.randint(1, 4)):
        a = rng.randint(0, len(text))
        b = rng.randint(a, min(len(text), a + 12))
        edit = rng.choice(("delete", "insert", "replace", "duplicate", "swap"))
        if edit == "delete":
            text = text[:a] + text[b:]
        elif edit == "insert":
            text = text[:a] + rng.choice(TOKENS) + text[a:]
        elif edit == "replace":
            text = text[:a] + rng.choice(TOKENS) + text[b:]
        elif edit == "duplicate":
            text = text[:b] + text[a:b] + text[b:]
        else:
            c = rng.randint(0, len(text))
            text = text[:a] + text[c:] if c > a else text[c:a] + text[:c] + text[a:]
    return text


def check_define(source: str, rng: random.Random, backend: str = "reference",
                 stats: Counter | None = None) -> str | None:
    """Through `tclang.define`, then a call on random inputs when the source is valid:
    None when only well-formed TCErrors came out, else what went wrong. `stats` counts
    how far the inputs got (refused, defined, called)."""
    stats = stats if stats is not None else Counter()
    import numpy as np

    import tclang
    from tclang.errors import (TCArgumentError, TCCompileError, TCError, TCScheduleError,
                               TCSemanticError, TCSyntaxError, TCWarning, source_lines)
    from tclang.fuzzing.generator import pick_sizes
    from tclang.tools.inputs import random_inputs
    stage = "define"
    try:
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore", TCWarning)
            module = tclang.define(source, backend=backend)
            stage = "call"
            stats["defined"] += 1
            for kernel in module:
                sizes = pick_sizes(kernel.definition, rng)
                if sizes is not None:
                    kernel(*random_inputs(kernel.definition, sizes,
                                          np.random.default_rng(rng.randrange(1 << 30))))
                    stats["called"] += 1
    except (TCSyntaxError, TCSemanticError, TCArgumentError, TCScheduleError) as err:
        text = str(err)  # rendering must not fail either
        lines = source_lines(source)
        if err.line is None:
            if isinstance(err, (TCSyntaxError, TCSemanticError)):
                return f"{type(err).__name__} without a line: {text[:200]}"
        elif not 1 <= err.line <= max(len(lines), 1):
            return f"{type(err).__name__} with line {err.line} outside the source: {text[:200]}"
        elif not 1 <= (err.column or 0) <= len(lines[err.line - 1]) + 1:
            return f"{type(err).__name__} with column {err.column} outside line {err.line}"
    except TCCompileError as err:
        if "internal error" in str(err):
            return f"{stage}: {str(err)[:300]}"
    except TCError as err:
        str(err)
    except Exception as err:  # noqa: BLE001 - exactly what must never happen
        return f"{stage}: {type(err).__name__} escaped: {str(err)[:300]}"
    return None


def source_inputs(rng: random.Random, seeds: list[str]):
    """Random bytes, token soup and mutated valid programs, in turn."""
    k = 0
    while True:
        kind = k % 3
        if kind == 0:
            data = bytes(rng.randrange(256) for _ in range(rng.randint(0, 60)))
            yield data.decode("utf-8", errors="replace")
        elif kind == 1:
            yield " ".join(rng.choice(TOKENS) for _ in range(rng.randint(0, 40)))
        else:
            yield mutate(rng, rng.choice(seeds))
        k += 1


def run_source_fuzz(count: int, seed: int) -> int:
    from tclang.fuzzing.generator import generate
    rng = random.Random(seed)
    seeds = [generate(random.Random(f"src:{seed}:{k}")).source for k in range(20)]
    problems = 0
    for k, source in zip(range(count), source_inputs(rng, seeds)):
        problem = check_define(source, rng)
        if problem:
            problems += 1
            print(f"[fuzz] input {k}: {problem}\n{source!r}", file=sys.stderr)
        if k % 100 == 0:
            print(f"[fuzz] {k} inputs, {problems} problems", file=sys.stderr, flush=True)
    print(f"{count - problems} passed, {problems} failed")
    return 1 if problems else 0
