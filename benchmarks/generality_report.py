"""The generality benchmark's report: the distribution of ratios to the best peer (per
family and overall: geometric mean, 10th percentile, worst case), a table a person reads
at a glance, and a chart (matplotlib, optional)."""

from __future__ import annotations

import math
import os

import numpy as np

from benchmarks.generality_cases import FAMILIES


def _timed(rows):
    return [r for r in rows if r.get("vs_best")]


def distribution(rows: list[dict]) -> dict:
    """{n, geomean, p10, worst, worst_name, roofline_geomean} of the timed rows."""
    timed = _timed(rows)
    if not timed:
        return {"n": 0}
    ratios = np.array([r["vs_best"] for r in timed])
    roof = np.array([r["roofline"] for r in timed if r.get("roofline", 0) > 0])
    worst = min(timed, key=lambda r: r["vs_best"])
    return {"n": len(timed), "geomean": float(np.exp(np.log(ratios).mean())),
            "p10": float(np.percentile(ratios, 10)), "worst": worst["vs_best"],
            "worst_name": worst["name"],
            "roofline_geomean": float(np.exp(np.log(roof).mean())) if len(roof) else math.nan}


def summary(rows: list[dict]) -> dict:
    out = {f: distribution([r for r in rows if r["family"] == f]) for f in FAMILIES}
    out["all"] = distribution(rows)
    out["not_ok"] = [(r["name"], r["status"]) for r in rows if r["status"] != "ok"]
    return out


def _ms(seconds) -> str:
    return f"{seconds * 1e3:.2f}"


def _row_line(r: dict) -> str:
    if r["status"] != "ok":
        return f"| {r['family']} | {r['name']} | **{r['status']}** | | | | |"
    if "tclang_s" not in r:
        return f"| {r['family']} | {r['name']} | error {r['error']:.1e} | | | | |"
    best = r.get("best_peer")
    peer = f"{_ms(r['peers'][best])} ({best})" if best else "-"
    ratio = f"{r['vs_best']:.2f}x" if best else "-"
    return (f"| {r['family']} | {r['name']} | {_ms(r['tclang_s'])} ±{r['tclang_spread']:.0%}"
            f" | {peer} | {ratio} | {r['roofline']:.0%} | {r['gflops']:.1f} |")


def table(result: dict) -> str:
    lim, s = result["limits"], result["summary"]
    load = " ".join(f"{x:.1f}" for x in result["load_before"])
    after = " ".join(f"{x:.1f}" for x in result.get("load_after", ()))
    head = [f"Commit {result['commit']}, seed {result['seed']}, one thread everywhere, "
            f"{result.get('clock', 'wall')} clock; "
            f"load average (1, 5, 15 min) before: {load}, after: {after}. Roofline "
            f"limits measured in this run (one thread): sgemm "
            f"{lim['sgemm_gflops']:.1f} GFLOP/s, triad {lim['triad_gbs']:.1f} GB/s. "
            f"Ratio: best peer's time over tclang's (>1: tclang faster).", "",
            "| family | cases | geomean vs best peer | 10th percentile | worst | "
            "roofline (geomean) |", "|---|---|---|---|---|---|"]
    for fam in (*FAMILIES, "all"):
        d = s[fam]
        if d.get("n"):
            head.append(f"| {fam} | {d['n']} | {d['geomean']:.2f}x | {d['p10']:.2f}x | "
                        f"{d['worst']:.2f}x ({d['worst_name']}) | "
                        f"{d['roofline_geomean']:.0%} |")
    if s["not_ok"]:
        head += ["", "Not timed: " + "; ".join(f"{n} ({st})" for n, st in s["not_ok"])]
    head += ["", "| family | operator | tclang (ms) | best peer (ms) | ratio | roofline | "
             "GFLOP/s |", "|---|---|---|---|---|---|---|"]
    return "\n".join(head + [_row_line(r) for r in result["rows"]])


def plot(result: dict, path: str) -> str | None:
    """Each case's ratio to the best peer and % of roofline, grouped by family."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    timed = sorted(_timed(result["rows"]),
                   key=lambda r: (FAMILIES.index(r["family"]), r["vs_best"]))
    if not timed:
        return None
    colors = {"contraction": "tab:blue", "window": "tab:orange", "model": "tab:green"}
    y = np.arange(len(timed))
    fig, (a, b) = plt.subplots(1, 2, sharey=True, figsize=(12, 0.22 * len(timed) + 1.8))
    c = [colors[r["family"]] for r in timed]
    ratios = [r["vs_best"] for r in timed]
    a.barh(y, [v - 1 for v in ratios], left=1, color=c)  # from parity: wins right
    a.axvline(1.0, color="black", linewidth=0.8)
    a.set_xscale("log")  # 0.5x and 2x lie the same distance from parity
    a.set_xlim(min(0.5, min(ratios) / 1.3), max(2.0, max(ratios) * 1.3))
    a.set_xlabel("best peer's time / tclang's (>1: tclang faster; log)")
    # a trace reads only a diagonal, but kernel_work counts whole tensors: >100% there
    b.barh(y, [min(150.0, 100 * r["roofline"]) for r in timed], color=c)
    b.set_xlim(0, 150)
    b.axvline(100.0, color="black", linewidth=0.8)
    b.set_xlabel("% of roofline (one thread; cut at 150)")
    a.set_yticks(y, [r["name"][:48] for r in timed], fontsize=6)
    a.invert_yaxis()
    for fam, col in colors.items():
        b.barh([0], [0], color=col, label=fam)
    b.legend(loc="lower right", fontsize=7)
    fig.suptitle(f"tclang generality benchmark, commit {result['commit']}, seed "
                 f"{result['seed']}, one thread, {result.get('clock', 'wall')} clock")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return os.path.abspath(path)
