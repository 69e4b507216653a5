"""The compare chart's layout decided as data (tclang.tuning.compare.chart_layout), and
the drawn figure checked for crossed or cut text."""

from __future__ import annotations

import numpy as np
import pytest

from tclang.tuning.compare import Comparison, Row, chart_layout, wrap_label

LIMITS = {"sgemm_gflops": 100.0, "triad_gbs": 10.0}


def comparison(times: dict, refused=(), operator="einsum 'ij,jk->ik'", limits=LIMITS):
    rows = []
    for label, ms in times.items():
        kind = "automatic" if label == "automatic" else "peer" if label in (
            "numpy", "torch") else "manual"
        rows.append(Row(label, kind, samples=[ms * f / 1e3 for f in (0.9, 1.0, 1.05, 1.2)]))
    for label, message in refused:
        rows.append(Row(label, "manual", status="refused", message=message))
    return Comparison("matmul", {"M": 256, "K": 256, "N": 256}, rows, 2 * 256 ** 3,
                      3 * 4 * 256 ** 2, limits, "NumPy", operator)


def test_a_log_axis_when_times_spread_over_5x():
    assert chart_layout(comparison({"automatic": 1.0, "manual: tile=8": 12.0})).log
    near = chart_layout(comparison({"automatic": 1.0, "manual: tile=8": 3.0}))
    assert not near.log and near.xlim[0] == 0.0
    assert "linear scale" in near.xlabel


def test_the_unit_follows_the_times():
    assert chart_layout(comparison({"automatic": 0.02})).unit == "µs"
    assert chart_layout(comparison({"automatic": 2.0})).unit == "ms"
    assert chart_layout(comparison({"automatic": 20_000.0})).unit == "s"


def test_speed_and_roofline_are_a_column_and_whiskers_are_quartiles():
    layout = chart_layout(comparison({"automatic": 1.0, "numpy": 2.0}))
    assert layout.headings == ("vs automatic", "% of roofline")
    auto, numpy = layout.bars
    assert auto.columns[0] == "1.00x" and numpy.columns[0] == "0.50x"
    assert auto.columns[1].endswith("%")
    q1, q3 = np.percentile([0.9, 1.0, 1.05, 1.2], [25, 75])
    assert abs(auto.low - q1) < 1e-9 and abs(auto.high - q3) < 1e-9
    assert chart_layout(comparison({"automatic": 1.0}, limits=None)).headings == \
        ("vs automatic",)


def test_long_labels_wrap_between_knobs():
    label = "manual: loop_order=k:m:n,tile=off,vectorize=off,parallel=off,register_tile=off"
    lines = wrap_label(label, 34)
    assert all(len(line) <= 34 for line in lines) and len(lines) >= 3
    assert "".join(lines).replace(" ", "") == label.replace(" ", "")
    for knob in ("loop_order", "vectorize=off", "register_tile=off"):
        assert any(knob in line for line in lines), (knob, lines)


def test_refused_schedules_and_missing_peers_are_listed():
    layout = chart_layout(comparison(
        {"automatic": 1.0}, refused=[("manual: loop_order=k:n:m", "breaks a flow "
                                      "dependence of S1 on S0")], operator=None))
    text = "\n".join(layout.notes)
    assert text.startswith("Not timed:") and "loop_order=k:n:m: refused - breaks" in text
    assert "no peer: tclang recognises no einsum or library operator" in layout.title
    assert "peers compute einsum 'ij,jk->ik'" in chart_layout(comparison(
        {"automatic": 1.0})).title


def test_drawn_text_is_never_crossed_or_cut():
    plt = pytest.importorskip("matplotlib.pyplot")
    from tclang.tuning.compare import draw
    layout = chart_layout(comparison(
        {"automatic": 1.0, "manual: tile=32x32x64,unroll=4,register_tile=6x16,pack=on": 1.4,
         "tuned (64 trials): tile=64x16x256,loop_order=k:m:n,vector_width=16": 0.7,
         "numpy": 11.0, "torch": 0.9},
        refused=[("manual: loop_order=k:n:m", "breaks a flow dependence")]))
    fig = draw(layout, plt)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    ax = fig.axes[0]
    texts = [t for t in ax.get_yticklabels() + ax.texts + fig.texts +
             [ax.title, ax.xaxis.label] if t.get_text()]
    boxes = [t.get_window_extent(renderer) for t in texts]
    page = fig.bbox
    for t, b in zip(texts, boxes):
        assert b.x0 >= page.x0 and b.x1 <= page.x1 and b.y0 >= page.y0 and \
            b.y1 <= page.y1, f"cut: {t.get_text()!r}"
    for i in range(len(boxes)):
        for j in range(i + 1, len(boxes)):
            assert not boxes[i].overlaps(boxes[j]), (texts[i].get_text(), texts[j].get_text())
    # the columns stand right of the axes: no bar or whisker (clipped to them) reaches one
    for t in ax.texts:
        assert t.get_window_extent(renderer).x0 > ax.bbox.x1
    plt.close(fig)
