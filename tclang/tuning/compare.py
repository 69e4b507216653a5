"""Automatic vs manual vs tuned schedules of one kernel, and its peers, in one table.

`compare(kernel, *args, manual=[...], tune=N)` (and `tclang compare`) times the
automatic schedule, each manual one (written as tc.Options or as a spec such as
"tile=32x32x64,unroll=4"), the options `tc.autotune` finds with N trials, and NumPy (and
PyTorch, when installed) where the definition is a single contraction that einsum can
write. Every schedule runs as a tuning trial does: in its own process, its outputs checked
against the automatic schedule's, which are checked against NumPy; an illegal manual
schedule is reported with the dependence it breaks, never timed. Rounds are interleaved
(one timing of each per round; the median is reported) and the machine's limits are
measured in the same run: time, GFLOP/s or GB/s, % of the roofline, ratio to automatic,
cold compile time. `Comparison.table()` is markdown; `Comparison.plot(path)` a PNG.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field

import numpy as np

from tclang.errors import TCError
from tclang.options import Options, parse_knobs
from tclang.lang.program import Read, reads_of
from tclang.tuning import roofline
from tclang.tuning import trials as T
from tclang.tuning.space import candidate_of, describe


@dataclass
class Row:
    label: str
    kind: str  # "automatic", "manual", "tuned", "peer"
    options: Options | None = None
    status: str = "ok"
    message: str = ""
    samples: list = field(default_factory=list)
    compile_seconds: float | None = None

    @property
    def seconds(self) -> float | None:
        return statistics.median(self.samples) if self.samples else None

    @property
    def spread(self) -> float:
        if len(self.samples) < 2:
            return 0.0
        q1, q3 = np.percentile(self.samples, [25, 75])
        return float((q3 - q1) / self.seconds)


@dataclass
class Comparison:
    entry: str
    sizes: dict
    rows: list[Row]
    flops: float
    moved: float
    limits: dict | None
    check: str  # what the automatic schedule's outputs were checked against

    def row(self, label: str) -> Row:
        return next(r for r in self.rows if r.label == label)

    def table(self) -> str:
        automatic = self.row("automatic").seconds
        sizes = ", ".join(f"{k}={v}" for k, v in self.sizes.items())
        head = [f"{self.entry} ({sizes}); outputs checked against {self.check}."]
        if self.limits:
            head.append(f"Machine: sgemm {self.limits['sgemm_gflops']:.1f} GFLOP/s, triad "
                        f"{self.limits['triad_gbs']:.1f} GB/s (measured in this run). "
                        f"Medians of interleaved rounds, ± interquartile range / median.")
        unit = "GFLOP/s" if self.flops else "GB/s"
        lines = head + ["", f"| schedule | time (ms) | {unit} | % of roofline | vs automatic "
                            f"| compile (s) | note |", "|---|---|---|---|---|---|---|"]
        for r in self.rows:
            if r.seconds is None:
                lines.append(f"| {r.label} | - | - | - | - | - | {r.status}: {r.message} |")
                continue
            rate = (self.flops or self.moved) / r.seconds / 1e9
            roof = roofline.roofline_fraction(r.seconds, self.flops, self.moved,
                                              self.limits) if self.limits else math.nan
            roof_text = "-" if math.isnan(roof) else f"{roof:.0%}"
            compile_text = "-" if r.compile_seconds is None else f"{r.compile_seconds:.2f}"
            lines.append(f"| {r.label} | {r.seconds * 1e3:.3f} ±{r.spread:.0%} | {rate:.1f} | "
                         f"{roof_text} | {automatic / r.seconds:.2f}x | {compile_text} | "
                         f"{r.message} |")
        return "\n".join(lines)

    __str__ = table

    def plot(self, path: str) -> str | None:
        """A bar chart of the times as a PNG; None without matplotlib."""
        try:
            import matplotlib
            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            return None
        timed = [r for r in self.rows if r.seconds is not None]
        colors = {"automatic": "tab:blue", "manual": "tab:orange", "tuned": "tab:green",
                  "peer": "tab:gray"}
        fig, ax = plt.subplots(figsize=(8, 0.5 * len(timed) + 1.5))
        y = np.arange(len(timed))
        ax.barh(y, [r.seconds * 1e3 for r in timed], color=[colors[r.kind] for r in timed],
                xerr=[r.seconds * 1e3 * r.spread / 2 for r in timed])
        automatic = self.row("automatic").seconds
        for k, r in enumerate(timed):
            ax.annotate(f" {automatic / r.seconds:.2f}x", (r.seconds * 1e3, k), va="center")
        ax.set_yticks(y, [r.label[:48] for r in timed])
        ax.invert_yaxis()
        ax.set_xlim(0, max(r.seconds for r in timed) * 1e3 * 1.2)
        ax.set_xlabel("time per call, ms (shorter is faster; labels: speed vs automatic)")
        ax.set_title(f"{self.entry}: automatic vs manual vs tuned")
        fig.tight_layout()
        fig.savefig(path, dpi=120)
        plt.close(fig)
        return path


def parse_manual(spec: str) -> Options:
    """"tile=32x32x64,unroll=4,loop_order=k:m:n,register_tile=4x16,pack=off" -> Options:
    the one knob grammar of tclang/options.py (parse_knobs)."""
    return parse_knobs(spec, "manual schedule")


def compare(kernel, *args, manual=(), tune: int = 0, peers=("numpy", "torch"),
            rounds: int = 5, min_time: float = 0.2, limits: bool = True,
            database=None, seed: int = 0, progress: bool = True,
            time_limit: float = 120.0, jobs: int | None = None,
            executor=None) -> Comparison:
    """Compare the automatic schedule of `kernel` for `args` with manual ones (Options,
    spec strings, or (label, Options) pairs), a tuned one (`tune` trials, on `executor`
    or `jobs` local trials at once) and peers. The comparison's own timings run here, one
    after another."""
    from tclang.arguments import bind_arguments
    from tclang.tuning.search import autotune, check_seconds, kernel_outputs

    if not isinstance(rounds, int) or rounds < 1:
        raise TCError(f"rounds must be at least 1, not {rounds!r}")
    if not isinstance(tune, int) or tune < 0:
        raise TCError(f"tune must be 0 (no tuning) or a number of trials, not {tune!r}")
    check_seconds("min_time", min_time)
    check_seconds("time_limit", time_limit)

    if kernel.module.on_device:
        raise TCError("tc.compare runs on the CPU backends only for now (its trials fork, "
                      "which a CUDA context does not survive); compare CUDA schedules with "
                      "tc.Options(block=..., grid=...) and `tclang run --backend cuda`")
    definition = kernel.definition
    binding = bind_arguments(definition, args)
    sizes = dict(binding.sizes)
    inputs = tuple(np.asarray(a) for a in binding.arrays)
    source, backend, entry = kernel.module.program.source, kernel.module.backend, kernel.name
    reference = kernel_outputs(source, backend, entry, inputs)
    rows = [Row("automatic", "automatic", Options())]
    for item in manual:
        label, options = _manual(item)
        rows.append(Row(label, "manual", options))
    if tune:
        tuned = autotune(kernel, *args, budget=tune, seed=seed, database=database,
                         progress=progress, time_limit=time_limit, jobs=jobs,
                         executor=executor)
        found = describe(candidate_of(tuned.best))
        if found == "automatic":
            found = "automatic (nothing faster found)"
        rows.append(Row(f"tuned ({tune} trials): {found}", "tuned", tuned.best))
    einsum = einsum_spec(definition)
    peer_calls = _peers(peers, einsum, inputs, reference)
    rows += [Row(name, "peer") for name in peer_calls]
    check = _check_automatic(reference, einsum, inputs, source, entry, sizes, definition)
    task = T.Task(source, entry, backend, inputs, reference, time_limit=time_limit,
                  min_time=min_time)
    bar = _bar(rounds * len(rows), entry, progress)
    try:
        for k in range(rounds):
            for row in rows:
                if row.status != "ok":
                    bar.update(1)
                    continue
                if row.kind == "peer":
                    row.samples.append(_time_peer(peer_calls[row.label], min_time))
                    time.sleep(0.3)  # BLAS threads spin after a call: let them stop
                else:
                    trial = T.run_trial(
                        task if k else _cold(task), candidate_of(row.options))
                    if not trial.ok:
                        row.status, row.message = trial.status, trial.message
                    else:
                        row.samples.append(trial.seconds)
                        if k == 0:
                            row.compile_seconds = trial.compile_seconds
                bar.update(1)
    finally:
        bar.close()
    for row in rows:
        if row.kind == "peer" and row.status == "ok":
            row.message = f"np.einsum({einsum!r})" if row.label == "numpy" else \
                f"torch.einsum({einsum!r})"
    flops, moved = roofline.kernel_work(definition, sizes)
    measured = roofline.machine_limits(gap=0.3) if limits else None
    return Comparison(entry, sizes, rows, flops, moved, measured, check)


def _cold(task: T.Task) -> T.Task:
    import dataclasses
    return dataclasses.replace(task, cold_compile=True)


def _manual(item) -> tuple[str, Options]:
    if isinstance(item, str):
        return f"manual: {item}", parse_manual(item)
    if isinstance(item, Options):
        return f"manual: {describe(candidate_of(item))}", item
    label, options = item
    return label, options if isinstance(options, Options) else parse_manual(options)


def einsum_spec(definition) -> str | None:
    """"mk,kn->mn" when the definition is one sum (or plain product) of tensor reads with
    one index name per subscript; else None (no einsum peer)."""
    if len(definition.statements) != 1 or definition.temporaries:
        return None
    s = definition.statements[0]
    if s.op not in ("=", "+") or (s.op == "+" and not s.reset) or \
            (s.op == "=" and s.reduction_indices):
        return None
    reads = reads_of(s.rhs)
    if not reads or not _is_product(s.rhs) or any(_plain(r) is None for r in reads):
        return None
    letters = {name: chr(ord("a") + k) for k, name in enumerate(s.all_indices)}
    if len(letters) > 26:
        return None
    terms = ["".join(letters[i] for i in _plain(r)) for r in reads]
    order = [t.name for t in definition.inputs]
    if [r.tensor for r in reads] != order:
        return None  # operands in another order than the arguments
    return ",".join(terms) + "->" + "".join(letters[i] for i in s.indices)


def _is_product(e) -> bool:
    from tclang.lang.program import Binary
    if isinstance(e, Read):
        return True
    return isinstance(e, Binary) and e.op == "mul" and _is_product(e.lhs) and \
        _is_product(e.rhs)


def _plain(read: Read):
    from tclang.lang.program import IndexValue
    if read.guard is not None or not all(isinstance(x, IndexValue) for x in read.subscripts):
        return None
    return tuple(x.name for x in read.subscripts)


def _peers(names, einsum, inputs, reference) -> dict:
    calls = {}
    if einsum is None:
        return calls
    out = np.empty_like(reference[0])
    if "numpy" in names:
        calls["numpy"] = lambda: np.einsum(einsum, *inputs, out=out, optimize=True)
    if "torch" in names:
        try:
            import torch
        except ImportError:
            torch = None
        if torch is not None:
            tensors = [torch.from_numpy(np.ascontiguousarray(a)) for a in inputs]
            calls["torch"] = lambda: torch.einsum(einsum, *tensors)
    return calls


def _check_automatic(reference, einsum, inputs, source, entry, sizes, definition) -> str:
    """Check the automatic schedule's outputs against NumPy: einsum where it can write the
    definition, else the reference interpreter (when the problem is small enough for it)."""
    if einsum is not None:
        expected = (np.einsum(einsum, *[a.astype(np.float64) for a in inputs]),)
        what = f"NumPy (np.einsum {einsum!r})"
    else:
        instances = sum(math.prod(max(0, r.extent.evaluate(sizes)) for r in s.domain)
                        for s in definition.statements)
        if instances > 5e7:
            return "nothing (too big for the reference interpreter; the schedules are " \
                "checked against each other)"
        from tclang.tuning.search import kernel_outputs
        expected = kernel_outputs(source, "reference", entry, inputs)
        what = "the NumPy reference interpreter"
    wrong = T.mismatch(reference, tuple(np.asarray(e, dtype=r.dtype)
                                         for e, r in zip(expected, reference)))
    if wrong:
        raise TCError(f"the automatic schedule of {entry} disagrees with {what}: {wrong}; "
                      f"this is a compiler bug, please report it")
    return what


def _time_peer(call, min_time: float) -> float:
    call()
    times = []
    spent = 0.0
    while len(times) < 3 or (spent < min_time and len(times) < 1000):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
        spent += times[-1]
    return statistics.median(times)


def _bar(total: int, entry: str, shown: bool):
    from tclang.tuning.search import progress_bar
    return progress_bar(total, f"comparing {entry}", shown, unit="timing")
