"""Checks with a bound (tclang.tools.checking, `tclang run --check`, `tc.compare`'s check):
NumPy where a peer computes the operator, else the reference interpreter on every point
or on a sample of output points with their full reductions; a planted wrong result is
caught, and a big problem never means a silent wait."""

from __future__ import annotations

import numpy as np
import pytest

import tclang as tc
from tclang.cli import main
from tclang.tools.inputs import random_inputs

# |x + bias| after a contraction: no library operator tclang recognises (the interpreter
# checks it)
MLP = """def mlp(float(B,I) X, float(O,I) W, float(O) bias) -> (Y) {
    Y(b, o) +=! X(b, i) * W(o, i)
    Y(b, o)  = fabs(Y(b, o) + bias(o))
}"""
MM = "def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }"
SOFTMAX = """def softmax(float(N, D) X) -> (Y) {
    rowmax(n) max=! X(n, d)
    rowsum(n) +=! exp(X(n, d) - rowmax(n))
    Y(n, d) = exp(X(n, d) - rowmax(n)) / rowsum(n)
}"""


def _run(source: str, sizes: dict, seed: int = 0):
    kernel = tc.define(source)[tc.define(source).names[0]]
    inputs = random_inputs(kernel.definition, sizes, np.random.default_rng(seed))
    out = kernel(*inputs)
    return kernel, inputs, out if isinstance(out, tuple) else (out,)


@pytest.mark.parametrize("source,sizes,against", [
    (MLP, dict(B=12, I=9, O=7), "the reference interpreter (every point)"),
    (MM, dict(M=12, K=9, N=7), "NumPy (einsum"),
])
def test_a_point_perturbed_is_caught_with_check_full(source, sizes, against):
    from tclang.tools.checking import check
    kernel, inputs, out = _run(source, sizes)
    assert check(kernel, inputs, out, mode="full", progress=False).ok
    bad = out[0].copy()
    bad[5, 3] += 1e-2 * max(1.0, abs(float(bad[5, 3])))
    result = check(kernel, inputs, (bad,), mode="full", progress=False)
    assert result.ok is False and "(5, 3)" in result.where
    assert "DIFFERS FROM the reference interpreter" in result.text()
    if against.startswith("NumPy"):
        assert "NumPy's einsum" in result.note  # NumPy disagreed; the interpreter decided


def test_a_wrong_row_is_caught_by_a_sample():
    """20 x 50 outputs, 64-long reductions, checked on a sample of half a second: its
    first chunk alone is ~100 random points (each with its full reduction), which meet a
    given wrong row with probability 1 - (19/20)^100 > 99%; the points are drawn from a
    fixed seed, so the test is deterministic."""
    from tclang.tools.checking import check
    kernel, inputs, out = _run(MLP, dict(B=20, I=64, O=50))
    for row in (3, 11, 17):
        bad = out[0].copy()
        bad[row, :] += 1.0
        result = check(kernel, inputs, (bad,), mode="sample", budget=0.5, progress=False)
        assert "sampled points of Y" in result.against and "100.00%" not in result.against
        assert result.ok is False and result.where.startswith(f"Y({row}, ")
    good = check(kernel, inputs, out, mode="sample", budget=0.5, progress=False)
    assert good.ok and "each with its full reduction" in good.against


def test_the_sampled_program_links_temporaries_to_their_rows():
    from tclang.tools.checking import check
    from tclang.tools.sampling import Sampler
    kernel, inputs, out = _run(SOFTMAX, dict(N=6, D=5))
    sampler = Sampler(kernel.definition, dict(N=6, D=5))
    text = sampler.source(3)
    # rowmax and rowsum are computed for the sampled rows only, each over the whole row
    assert "rowmax(p) max=! X(at1(p), d) where p in 0:3, d in 0:5" in text
    assert "Y(p) = exp(X(at1(p), at0(p)) - rowmax(p)) / rowsum(p) where p in 0:3" in text
    result = check(kernel, inputs, out, mode="sample", progress=False)
    assert result.ok and "30 sampled points" in result.against  # small: every point


def test_numpy_disagreeing_is_settled_by_the_interpreter(monkeypatch):
    """A recognised operator whose NumPy call is wrong (a recognition bug) does not make a
    right kernel look wrong: the interpreter decides, and the result says both."""
    from tclang.tools.checking import check
    import tclang.peers as peers
    real = peers.recognise

    def wrong(defn, sizes):
        op = real(defn, sizes)
        op.numpy = lambda xs: np.einsum("ij,jk->ik", *xs) + 1.0
        return op
    monkeypatch.setattr(peers, "recognise", wrong)
    kernel, inputs, out = _run(MM, dict(M=6, K=5, N=4))
    result = check(kernel, inputs, out, progress=False)
    assert result.ok and "the reference interpreter" in result.against
    assert "NumPy's einsum 'ij,jk->ik' disagrees" in result.note


def test_an_output_that_cannot_be_sampled_is_said_not_checked():
    from tclang.tools.checking import check
    total = "def total(float(N, M) A) -> (s) {\n  s +=! A(i, j) * A(i, j)\n}"
    kernel, inputs, out = _run(total, dict(N=300, M=300))
    result = check(kernel, inputs, out, mode="sample", budget=0.01, limit=0.05,
                   progress=False)
    assert result.ok is None and "--check=full waits for it" in result.against


@pytest.mark.parametrize("mode", ["full", "sample"])
def test_a_wait_shows_a_progress_bar(mode, monkeypatch, capsys):
    """Never a silent wait: past BAR_DELAY seconds (2 s; 0 here) a check shows a bar."""
    import tclang.tools.checking as checking
    import tclang.tools.sampling as sampling
    monkeypatch.setattr(checking, "BAR_DELAY", 0.0)  # the whole-program check's bar
    monkeypatch.setattr(sampling, "BAR_DELAY", 0.0)  # the sample's
    kernel, inputs, out = _run(MLP, dict(B=20, I=30, O=10))
    assert checking.check(kernel, inputs, out, mode=mode, budget=0.5).ok
    err = capsys.readouterr().err
    assert "on the reference interpreter" in err and ("point" in err or " s" in err)


def _cli(tmp_path, capsys, source: str, *args):
    path = tmp_path / "k.tc"
    path.write_text(source)
    code = main(["run", str(path), *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_tclang_run_checks_a_big_problem_on_a_sample(tmp_path, capsys):
    """1.7 M statement instances: ~35 s (minutes on a loaded machine) on the whole-program
    interpreter, silently, before; now a bounded sample, said so."""
    code, out, err = _cli(tmp_path, capsys, MLP, "--sizes", "B=120,I=120,O=120",
                          "--repeat", "2")
    assert code == 0, err
    assert "matches the reference interpreter on" in out and "sampled points of Y" in out
    assert "median of 2 runs" in out


def test_tclang_run_check_modes(tmp_path, capsys):
    code, out, _ = _cli(tmp_path, capsys, MM, "--sizes", "M=9,K=8,N=7", "--check", "none")
    assert code == 0 and "not checked: --check=none" in out
    code, out, _ = _cli(tmp_path, capsys, MM, "--sizes", "M=9,K=8,N=7")
    assert code == 0 and "matches NumPy (einsum 'ij,jk->ik'" in out
    code, out, _ = _cli(tmp_path, capsys, MM, "--sizes", "M=9,K=8,N=7", "--check", "sample")
    assert code == 0 and "63 sampled points of C" in out


def test_tclang_run_fails_on_a_wrong_result(tmp_path, capsys, monkeypatch):
    from tclang.runtime.kernels import CompiledKernel
    real = CompiledKernel.__call__

    def perturbed(self, *args, out=None):
        result = real(self, *args, out=out)
        result[2, 1] += 5.0
        return result
    monkeypatch.setattr(CompiledKernel, "__call__", perturbed)
    code, out, _ = _cli(tmp_path, capsys, MLP, "--sizes", "B=6,I=5,O=4", "--repeat", "1")
    assert code == 1 and "DIFFERS FROM the reference interpreter" in out
    assert "worst at Y(2, 1)" in out
