"""Automatic vs manual vs tuned schedules of one kernel, and its peers, in one table.

`compare(kernel, *args, manual=[...], tune=N)` (and `tclang compare`) times the
automatic schedule, each manual one (written as tc.Options or as a spec such as
"tile=32x32x64,unroll=4"), the options `tc.autotune` finds with N trials, and peers:
NumPy (einsum with optimize=True) and PyTorch (einsum, or the library operator) wherever
tclang.peers recognises what the definition computes from its structure (a contraction,
a convolution with stride, padding, dilation or groups, pooling, cumsum, softmax, layer
norm, attention with or without a causal mask); the table says "no peer" where it
recognises nothing. Every schedule runs as a tuning trial does: in its own process, its
outputs checked against the automatic schedule's, which are checked with a bounded wait
(tclang.tools.checking: NumPy where a peer computes the operator, else the reference interpreter
on all or a sample of the output points); a peer is timed only if its result matches the
automatic schedule's; an illegal manual schedule is reported with the dependence it
breaks, never timed. Rounds are interleaved (one timing of each per round; the median is
reported) and the machine's limits are measured in the same run: time, GFLOP/s or GB/s,
% of the roofline, ratio to automatic, cold compile time. `Comparison.table()` is
markdown; `Comparison.plot(path)` a PNG whose layout (`chart_layout`) is decided as data:
a log axis when times spread over more than 5x, labels in their own column so that
whiskers never cross them, long labels wrapped, refused schedules listed under the bars.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field

import numpy as np

from tclang.bfloat16 import from_float32, is_bfloat16, to_numpy_float32
from tclang.errors import TCError
from tclang.runtime.host_tensors import as_torch
from tclang.options import Options, parse_knobs
from tclang.driver import roofline
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
    operator: str | None = None  # what tclang.peers recognised, None: nothing

    def row(self, label: str) -> Row:
        return next(r for r in self.rows if r.label == label)

    def table(self) -> str:
        automatic = self.row("automatic").seconds
        sizes = ", ".join(f"{k}={v}" for k, v in self.sizes.items())
        head = [f"{self.entry} ({sizes}); outputs checked against {self.check}.",
                f"Peers: {self.operator} (recognised from the definition's structure)."
                if self.operator else "No peer: tclang recognises no einsum or library "
                "operator in this definition."]
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
        """The chart of `chart_layout` as a PNG; None without matplotlib."""
        try:
            import matplotlib
            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            return None
        fig = draw(chart_layout(self), plt)
        fig.savefig(path, dpi=120)
        plt.close(fig)
        return path


COLORS = {"automatic": "tab:blue", "manual": "tab:orange", "tuned": "tab:green",
          "peer": "tab:gray"}
LOG_SPREAD = 5.0  # times spread over more than this factor: a log axis
LABEL_WIDTH = 34  # characters per line of a schedule's label
NOTE_WIDTH = 100  # characters per line of the notes under the chart
COLUMN_POINTS = 78  # width of a column right of the axes, in points (right-aligned)


@dataclass
class ChartBar:
    label: list[str]  # the schedule's label, wrapped
    time: float  # the median, in the layout's unit
    low: float  # the whisker: first and third quartiles of the rounds, in the unit
    high: float
    columns: tuple[str, ...]  # right of the axes: speed vs automatic, % of roofline
    color: str


@dataclass
class ChartLayout:
    """What the chart shows and where, decided before anything is drawn (and tested as
    data): the bars, whether the axis is logarithmic, its limits, the notes under it."""

    title: str
    xlabel: str
    unit: str  # of the times: "s", "ms" or "µs"
    bars: list[ChartBar]
    log: bool
    xlim: tuple[float, float]
    headings: tuple[str, ...]  # of the columns right of the axes
    notes: list[str]  # refused and failed schedules, "no peer", wrapped lines

    @property
    def label_lines(self) -> int:
        return sum(max(1, len(b.label)) for b in self.bars)


def chart_layout(c: Comparison) -> ChartLayout:
    """The chart of a comparison: one bar per timed row (median, quartile whiskers), a
    log axis when the slowest median is over 5x the fastest (a linear one squashed every
    other bar when one schedule was 10x slower), the speed vs automatic and % of roofline
    in a column right of the axes where no whisker can reach them, labels wrapped at
    LABEL_WIDTH characters, rows that were not timed listed under the chart."""
    import textwrap
    timed = [r for r in c.rows if r.seconds is not None]
    automatic = c.row("automatic").seconds
    bars = []
    for r in timed:
        q1, q3 = np.percentile(r.samples, [25, 75])
        columns = [f"{automatic / r.seconds:.2f}x" if automatic else "-"]
        if c.limits:
            roof = roofline.roofline_fraction(r.seconds, c.flops, c.moved, c.limits)
            columns.append("-" if math.isnan(roof) else f"{roof:.0%}")
        bars.append(ChartBar(wrap_label(r.label, LABEL_WIDTH), r.seconds, q1, q3,
                             tuple(columns), COLORS.get(r.kind, "tab:gray")))
    # the unit that keeps the figures between 0.1 and 1000 or so
    slowest = max([b.time for b in bars] or [1e-3])
    unit, factor = ("s", 1.0) if slowest >= 10 else ("ms", 1e3) if slowest >= 1e-4 else \
        ("µs", 1e6)
    for b in bars:
        b.time, b.low, b.high = b.time * factor, b.low * factor, b.high * factor
    values = [b.time for b in bars] or [1.0]
    log = max(values) / min(values) > LOG_SPREAD if min(values) > 0 else False
    top = max([b.high for b in bars] or [1.0])
    if log:
        bottom = min(b.low for b in bars)
        xlim = (bottom / 1.5, top * 1.5)
    else:
        xlim = (0.0, top * 1.08)
    notes = []
    for r in c.rows:
        if r.seconds is None:
            text = f"{r.label}: {r.status}" + (f" - {r.message}" if r.message else "")
            notes += textwrap.wrap(text, NOTE_WIDTH, subsequent_indent="    ")
    if notes:
        notes.insert(0, "Not timed:")
    sizes = ", ".join(f"{k}={v}" for k, v in c.sizes.items())
    peers = f"peers compute {c.operator}" if c.operator else \
        "no peer: tclang recognises no einsum or library operator here"
    rounds = max((len(r.samples) for r in timed), default=0)
    scale = "log scale" if log else "linear scale"
    return ChartLayout(
        title=textwrap.fill(f"{c.entry} ({sizes})", 70) + "\n" + textwrap.fill(peers, 70),
        xlabel=f"time per call, {unit} ({scale}; shorter is faster): median of {rounds} "
               f"rounds, whiskers from the first to the third quartile",
        unit=unit, bars=bars, log=log, xlim=xlim,
        headings=("vs automatic",) + (("% of roofline",) if c.limits else ()),
        notes=notes)


def wrap_label(label: str, width: int) -> list[str]:
    """`label` in lines of at most `width` characters, broken after a comma, a colon or a
    space (a knob's name is never cut in two unless it alone is longer than a line)."""
    import re
    lines, line = [], ""
    for token in re.findall(r"[^,: ]+[,: ]*|[,: ]+", label):
        if line and len(line) + len(token.rstrip()) > width:
            lines.append(line.rstrip())
            line = ""
        while len(token.rstrip()) > width:
            lines.append(token[:width])
            token = token[width:]
        line += token
    if line.strip():
        lines.append(line.rstrip())
    return lines or [label]


def draw(layout: ChartLayout, plt):
    """A matplotlib figure of `layout`: bars on the left axes, their notes in a column
    right of the axes, the notes below."""
    line = 0.22  # inches per text line
    height = 1.4 + line * (layout.label_lines + len(layout.bars)) + \
        line * len(layout.notes) + (0.3 if layout.notes else 0)
    fig = plt.figure(figsize=(10, height))
    bottom_in = 0.75 + line * len(layout.notes) + (0.3 if layout.notes else 0)
    ax = fig.add_axes((0.28, bottom_in / height, 0.48, 1 - (bottom_in + 0.55) / height))
    # rows as tall as their wrapped labels
    y, centers = 0.0, []
    for b in layout.bars:
        h = max(1, len(b.label)) + 1
        centers.append(y + h / 2)
        y += h
    for b, yc in zip(layout.bars, centers):
        ax.barh(yc, b.time, height=1.2, color=b.color)
        ax.errorbar(b.time, yc, xerr=[[b.time - b.low], [b.high - b.time]],
                    fmt="none", ecolor="black", capsize=3, linewidth=1)
        for k, text in enumerate(b.columns):
            ax.annotate(text, xy=(1.0, yc), xycoords=("axes fraction", "data"),
                        xytext=(COLUMN_POINTS * (k + 1), 0), textcoords="offset points",
                        va="center", ha="right", fontsize=9)
    ax.set_yticks(centers, ["\n".join(b.label) for b in layout.bars], fontsize=9)
    ax.set_ylim(y, 0)
    if layout.log:
        from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter
        ax.set_xscale("log")
        decades = math.log10(layout.xlim[1] / layout.xlim[0])
        ax.xaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0) if decades < 4 else (1.0,)))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlim(*layout.xlim)
    ax.set_xlabel(textwrap_fill(layout.xlabel, 70), fontsize=9)
    ax.set_title(layout.title, fontsize=11)
    for k, heading in enumerate(layout.headings):
        ax.annotate(heading, xy=(1.0, 1.0), xycoords="axes fraction",
                    xytext=(COLUMN_POINTS * (k + 1), 4), textcoords="offset points",
                    va="bottom", ha="right", fontsize=9, style="italic")
    ax.grid(axis="x", which="both", alpha=0.3)
    if layout.notes:
        fig.text(0.02, (line * len(layout.notes) + 0.15) / height, "\n".join(layout.notes),
                 va="top", fontsize=8.5, family="monospace")
    return fig


def textwrap_fill(text: str, width: int) -> str:
    import textwrap
    return textwrap.fill(text, width)


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
    from tclang.runtime.arguments import bind_arguments
    from tclang.tuning.search import autotune, check_seconds, kernel_outputs

    if not isinstance(rounds, int) or rounds < 1:
        raise TCError(f"rounds must be at least 1, not {rounds!r}")
    if not isinstance(tune, int) or tune < 0:
        raise TCError(f"tune must be 0 (no tuning) or a number of trials, not {tune!r}")
    check_seconds("min_time", min_time)
    check_seconds("time_limit", time_limit)

    from tclang.tuning.workers import is_gpu
    gpu = is_gpu(kernel.module.backend)
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
    from tclang.peers import recognise
    operator = recognise(definition, sizes)
    check = _check_automatic(kernel, inputs, reference, progress)
    peer_rows, peer_calls = _peers(peers, operator, inputs, reference,
                                   device=kernel.module.backend == "cuda")
    rows += peer_rows
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
    flops, moved = roofline.kernel_work(definition, sizes)
    # the limits measured are the CPU's (sgemm, a STREAM triad): no roofline for a GPU
    measured = roofline.machine_limits(gap=0.3) if limits and not gpu else None
    return Comparison(entry, sizes, rows, flops, moved, measured, check,
                      operator.name if operator is not None else None)


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


def _peers(names, operator, inputs, reference, device: bool = False) -> tuple[list, dict]:
    """The peer rows and their calls: NumPy and PyTorch computing the recognised
    operator, each confirmed on these inputs against the automatic schedule's result
    (a structure can look like an operator and compute something else: such a peer is
    reported, never timed). `device`: the kernel runs on a real GPU, so PyTorch's peer
    does too (its inputs on the GPU, each call waited for), when PyTorch has CUDA."""
    rows, calls = [], {}
    if operator is None:
        return rows, calls
    makers = {}
    narrow = any(is_bfloat16(np.asarray(a).dtype) for a in inputs)
    if "numpy" in names:  # NumPy has no bfloat16: it computes from the values in float32
        values = [to_numpy_float32(a) if is_bfloat16(np.asarray(a).dtype) else a
                  for a in inputs] if narrow else inputs
        makers["numpy"] = (lambda: operator.numpy(values),
                           operator.numpy_text + (" (bfloat16 inputs as float32)"
                                                  if narrow else ""))
    if "torch" in names and operator.torch is not None:
        try:
            import torch
        except ImportError:
            torch = None
        if torch is not None:
            tensors = [as_torch(np.ascontiguousarray(a)) for a in inputs]  # bf16: torch's
            on_gpu = device and torch.cuda.is_available()
            if on_gpu:
                tensors = [t.cuda() for t in tensors]

            def call():
                with torch.no_grad():
                    result = operator.torch(tensors)
                if on_gpu:
                    torch.cuda.synchronize()  # the time is the GPU's work, not a launch
                return result
            makers["torch (cuda)" if on_gpu else "torch"] = (call, operator.torch_text)
    for name, (call, text) in makers.items():
        row = Row(name, "peer", message=text)
        try:
            got = call()
            if type(got).__module__.startswith("torch"):
                got = got.cpu()
                got = got.float() if str(got.dtype) == "torch.bfloat16" else got
                got = got.numpy()
            got = np.asarray(got)
            want = reference[0]
            if is_bfloat16(np.asarray(want).dtype):  # rounded as tclang's result is
                got = from_float32(got.astype(np.float32))
            wrong = T.mismatch((got.astype(want.dtype),), reference[:1])
        except Exception as err:  # noqa: BLE001 - a peer that fails is reported, not fatal
            wrong = f"it raised {err!r}"
        if wrong:
            row.status = "differs"
            wrong = wrong.replace("the automatic schedule's", "tclang's")
            row.message = f"recognised as {operator.name}, but {text}: {wrong}; not timed"
        else:
            calls[name] = call
        rows.append(row)
    return rows, calls


def _check_automatic(kernel, inputs, reference, progress: bool) -> str:
    """Check the automatic schedule's outputs with a bounded wait (tclang.tools.checking: NumPy
    where a peer computes the operator, else the reference interpreter on all or a sample
    of the output points); a difference is a compiler bug."""
    from tclang.tools.checking import check
    result = check(kernel, inputs, reference, mode="auto", progress=progress)
    if result.ok is False:
        raise TCError(f"the automatic schedule of {kernel.name} {result.text()}; this is a "
                      f"compiler bug, please report it")
    if result.ok is None:
        return f"nothing ({result.against}; the schedules are checked against each other)"
    return result.against


def _time_peer(call, min_time: float) -> float:
    return statistics.median(T.time_calls(call, min_time))


def _bar(total: int, entry: str, shown: bool):
    from tclang.tuning.search import progress_bar
    return progress_bar(total, f"comparing {entry}", shown, unit="timing")
