"""The generality benchmark (benchmarks/generality.py) runs, and every case it times
computes what NumPy computes: its quick run end to end (results, not speed), the quick
cases on every backend, and, marked slow, every small case of every generator on every
backend (odd, prime and size-1 extents included)."""

from __future__ import annotations

import random

import numpy as np
import pytest

from benchmarks.generality import all_cases, run
from benchmarks.generality_cases import FAMILIES, error_of
from benchmarks.generality_contractions import contraction
from benchmarks.generality_report import summary, table
from benchmarks.generality_timing import TOLERANCE, measure_case

pytestmark = pytest.mark.filterwarnings("ignore::tclang.errors.TCWarning")

BACKENDS = ("cpu", "reference", "cuda-emulated")


def test_the_quick_run_checks_and_times_every_case():
    result = run(seed=0, quick=True, rounds=1, gap=0.0, log=lambda s: None)
    rows = result["rows"]
    assert {r["family"] for r in rows} == set(FAMILIES)
    for r in rows:
        assert r["status"] == "ok", r
        assert r["error"] <= TOLERANCE
        assert r["tclang_s"] > 0 and r["vs_best"] > 0 and r["best_peer"] in r["peers"]
    assert result["summary"]["all"]["n"] == len(rows)
    text = table(result)
    assert "geomean vs best peer" in text and "triad" in text


def _check(case, backend):
    row = measure_case(case, 1, {}, rounds=0, gap=0.0, time_it=False, backend=backend)
    assert row["status"] == "ok", (case.source, row.get("message"))
    assert row["error"] <= TOLERANCE, case.source
    assert not row.get("peers_left_out"), row  # the peers compute what the reference does


def test_the_quick_cases_match_numpy_under_the_reference_interpreter():
    for case in all_cases(seed=0, quick=True):
        _check(case, "reference")


def test_a_case_of_each_family_matches_numpy_as_emulated_cuda():
    """One case a family (the emulator is slow to build for; all of them: slow below)."""
    for family in FAMILIES:
        _check(all_cases(seed=0, quick=True, families=(family,))[0], "cuda-emulated")


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("family", FAMILIES)
def test_every_small_case_matches_numpy(family, backend):
    """The quick sizes of every generated case (no sampling) over two seeds."""
    for case in [c for seed in (0, 1) for c in all_cases(seed, True, (family,), None)]:
        _check(case, backend)


def test_contractions_have_2_to_6_indices_per_operand_and_match_their_einsum():
    rng = random.Random(5)
    for _ in range(20):
        case = contraction(rng, 5e3)
        x, rest = case.einsum.split(",")
        y, z = rest.split("->")
        assert all(2 <= len(ix) <= 6 for ix in (x, y)) and len(z) <= 6
        assert set(x) & set(y) - set(z), "at least one reduction index"
        arrays = case.arrays()
        assert error_of(np.einsum(case.einsum, *arrays), case.reference(*arrays)) < 1e-5


def test_the_distribution_is_the_geometric_mean_10th_percentile_and_worst():
    rows = [{"family": "window", "name": f"w{k}", "status": "ok", "vs_best": v,
             "roofline": 0.25} for k, v in enumerate((0.5, 2.0, 1.0, 4.0))]
    rows.append({"family": "window", "name": "bad", "status": "wrong"})
    d = summary(rows)["window"]
    assert d["n"] == 4 and d["geomean"] == pytest.approx(2 ** 0.5)  # (0.5 * 2 * 1 * 4) ** (1 / 4)
    assert d["p10"] == pytest.approx(np.percentile([0.5, 1, 2, 4], 10))
    assert (d["worst"], d["worst_name"]) == (0.5, "w0")
    assert d["roofline_geomean"] == pytest.approx(0.25)
    assert summary(rows)["not_ok"] == [("bad", "wrong")]
