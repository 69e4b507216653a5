"""bfloat16 (tclang/bfloat16.py, docs/language.md): rounding to nearest even on every
backend, float32 accumulation of long sums, the language's rules (names, promotion,
literals), and interop: torch.bfloat16 tensors in and out, NumPy's ml_dtypes.bfloat16
where installed, a clear refusal where NumPy has no bfloat16."""

from __future__ import annotations

import numpy as np
import pytest

import tclang as tc
from tclang import bfloat16 as B
from tclang.dtypes import DType, promote
from backends.cuda.emulation.build import available as emulation_available

torch = pytest.importorskip("torch")

BACKENDS = ["cpu", "reference"] + (["cuda-emulated"] if emulation_available() else [])


def _special_values() -> np.ndarray:
    """float32 values at bfloat16's edges: ties (both parities), just off ties, the
    largest finite value and past it, subnormals, zeros, infinities, NaN."""
    one = np.float32(1.0).view(np.uint32)
    bits = [one | 0x8000, one | 0x18000, one | 0x8001, one | 0x7FFF, one | 0x17FFF,
            0x7F7F0000, 0x7F7F7FFF, 0x7F7F8000, 0x7F7FFFFF, 0x00008000, 0x00018000,
            0x00000001, 0x80000000, 0x7F800000, 0xFF800000, 0x3EAAAAAB, 0xC2F6E979]
    values = np.array(bits, dtype=np.uint32).view(np.float32)
    rng = np.random.default_rng(0)
    noise = (rng.standard_normal(200) * 10.0 ** rng.integers(-30, 30, 200)).astype(np.float32)
    return np.concatenate([values, -values, noise, [np.float32(np.nan)]])


@pytest.mark.parametrize("backend", BACKENDS)
def test_stores_and_casts_round_to_nearest_even_as_torch(backend):
    x = _special_values()
    k = tc.define("def r(float(N) X) -> (Y, Z) { Y(i) = bfloat16(X(i))\n"
                  "Z(i) = float(bfloat16(X(i) * 1.0)) }", backend=backend).r
    y, z = k(torch.from_numpy(x))
    truth = torch.from_numpy(x).bfloat16()
    assert y.dtype == torch.bfloat16 and z.dtype == torch.float32
    finite = ~torch.isnan(truth)
    assert torch.equal(y.view(torch.int16)[finite], truth.view(torch.int16)[finite])
    assert torch.isnan(y[~finite]).all()
    assert torch.equal(z[finite], truth.float()[finite])


def test_host_rounding_matches_torch_bit_for_bit():
    x = _special_values()
    truth = torch.from_numpy(x).bfloat16().view(torch.int16).numpy().view(np.uint16)
    ours = B.round_bits(x)
    finite = ~np.isnan(x)
    assert np.array_equal(ours[finite], truth[finite])
    assert np.isnan(B.to_float32(ours[~finite])).all()


@pytest.mark.parametrize("backend", BACKENDS)
def test_long_sums_accumulate_in_float32(backend):
    """10,000 x 0.01 in bfloat16 storage would stall at 2 (2 + 0.01 rounds back to 2)."""
    n = 10_000 if backend != "reference" else 2_000
    x = torch.full((n,), 0.01).bfloat16()
    k = tc.define("def s(bf16(N) X) -> (Y) { Y +=! X(i) }", backend=backend).s
    truth = x.double().sum()
    assert k(x).dtype == torch.bfloat16
    assert abs(float(k(x)) - float(truth)) <= float(truth) * 2 ** -8


@pytest.mark.parametrize("backend", BACKENDS)
def test_strided_inputs_out_and_zero_d(backend):
    k = tc.define("def f(bf16(N, M) A, bf16 s) -> (O) { O(i, j) = A(i, j) * s }",
                  backend=backend).f
    a = torch.randn(5, 7).bfloat16().t()  # a transposed view: not contiguous
    s = torch.tensor(1.5).bfloat16()
    expected = (a.float() * 1.5).bfloat16()
    assert torch.equal(k(a, s), expected)
    out = torch.empty(7, 5, dtype=torch.bfloat16)
    assert k(a, s, out=out) is out and torch.equal(out, expected)
    assert torch.equal(k(a, s), expected)  # again: the hot path


def test_type_names_promotion_and_literals():
    assert promote(DType.BFLOAT16, DType.FLOAT16) is DType.FLOAT32
    assert promote(DType.BFLOAT16, DType.INT64) is DType.BFLOAT16
    assert promote(DType.BFLOAT16, DType.FLOAT64) is DType.FLOAT64
    m = tc.define("def f(bf16(N) A, half(N) H, int32(N) I) -> (a, b, c, d) {\n"
                  "a(i) = A(i) * I(i)\n b(i) = A(i) + H(i)\n c(i) = A(i) * 2.0\n"
                  " d(i) = A(i) * 0 + bfloat16(0.1) }")
    assert [t.dtype for t in m.f.definition.outputs] == \
        [DType.BFLOAT16, DType.FLOAT32, DType.FLOAT32, DType.BFLOAT16]
    d = m.f(torch.ones(1).bfloat16(), torch.ones(1).half(), torch.ones(1, dtype=torch.int32))[3]
    assert float(d) == 0.10009765625  # bfloat16's 0.1
    with pytest.raises(tc.TCSemanticError, match="narrow"):  # half + bf16 is float32
        tc.define("def f(bf16(N) A, half(N) H) -> (bf16(N) O) { O(i) = A(i) + H(i) }")
    with pytest.raises(tc.TCSyntaxError):  # a type keyword, as half is
        tc.define("def f(float(N) A) -> (bf16) { bf16(i) = A(i) }")
    with pytest.raises(tc.TCSemanticError, match="too large for bfloat16"):
        tc.define("def f(float(N) A) -> (O) { O(i) = A(i) * bfloat16(3.5e38) }")


def test_numpy_callers_without_ml_dtypes_are_refused_before_running(monkeypatch):
    import tclang.runtime.host_tensors as H
    monkeypatch.setattr(H, "NUMPY_HAS_BFLOAT16", False)
    k = tc.define("def f(float(N) X) -> (Y) { Y(i) = bfloat16(X(i)) }").f
    with pytest.raises(tc.TCArgumentError, match="bfloat16") as raised:
        k(np.ones(3, np.float32))
    assert "torch" in raised.value.hint and "ml_dtypes" in raised.value.hint
    # torch callers, and out= tensors, are served
    assert k(torch.ones(3)).dtype == torch.bfloat16
    out = torch.zeros(3, dtype=torch.bfloat16)
    k(np.ones(3, np.float32), out=out)
    assert torch.equal(out, torch.ones(3).bfloat16())


def test_wrong_dtypes_name_bfloat16():
    k = tc.define("def f(bf16(N) X) -> (Y) { Y(i) = X(i) + X(i) }").f
    with pytest.raises(tc.TCArgumentError, match="must be bfloat16, but it is float16") as e:
        k(torch.ones(2).half())
    assert ".bfloat16()" in e.value.hint
    h = tc.define("def h(bf16(N) X) -> (Y) { Y(i) = float(X(i)) }").h
    with pytest.raises(tc.TCArgumentError, match="must be bfloat16, but it is uint16"):
        h(np.ones(2, np.uint16))  # bits alone are not bfloat16
    g = tc.define("def g(float(N) X) -> (Y) { Y(i) = X(i) }").g
    with pytest.raises(tc.TCArgumentError, match="must be float32, but it is bfloat16"):
        g(torch.ones(2).bfloat16())


def test_numpy_arrays_of_ml_dtypes_bfloat16():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    k = tc.define("def f(bf16(N) X, float(N) W) -> (Y, Z) { Y(i) = X(i) * W(i)\n"
                  "Z(i) = float(X(i)) }").f
    x = np.linspace(-3, 3, 11).astype(ml_dtypes.bfloat16)
    w = np.linspace(0, 1, 11).astype(np.float32)
    for _ in range(3):  # the checked call, then the hot paths
        y, z = k(x, w)
        assert y.dtype == np.float32 and z.dtype == np.float32
    b = tc.define("def b(float(N) X) -> (Y) { Y(i) = bfloat16(X(i)) }").b
    for _ in range(3):
        y = b(w)
        assert y.dtype == np.dtype(ml_dtypes.bfloat16)
        assert np.array_equal(y.view(np.uint16), w.astype(ml_dtypes.bfloat16).view(np.uint16))


@pytest.mark.parametrize("backend", BACKENDS)
def test_generic_code_and_gathers(backend):
    k = tc.define("def g(bf16(E, D) T, int32(N) I) -> (O) { O(n, d) = T(I(n), d) * 2.0 }",
                  backend=backend, options=tc.Options(specialize=False)).g
    for e, d, n in ((1, 1, 1), (7, 3, 13), (11, 16, 5)):
        t = torch.randn(e, d).bfloat16()
        i = torch.randint(0, e, (n,), dtype=torch.int32)
        assert torch.equal(k(t, i), t.float()[i.long()] * 2.0)
    with pytest.raises(tc.TCIndexError):
        k(torch.randn(2, 2).bfloat16(), torch.tensor([2], dtype=torch.int32))


@pytest.mark.parametrize("check", ["auto", "full", "sample"])
def test_tclang_run_checks_bfloat16_programs(check, tmp_path, capsys):
    """`tclang run` calls with NumPy arrays: bfloat16 results come back in tclang's
    storage, and every check compares them through float32."""
    from tclang.cli import main
    source = tmp_path / "b.tc"
    source.write_text("def bmm(bf16(M, K) A, bf16(K, N) B) -> (C) { C(m, n) +=! A(m, k) * B(k, n) }\n"
                      "def cast(float(N) X) -> (Y) { Y(i) = bfloat16(X(i) * 3.0) }\n")
    assert main(["run", str(source), "--entry", "bmm", "--sizes", "M=4,K=13,N=3",
                 "--check", check, "--repeat", "1"]) == 0
    assert main(["run", str(source), "--entry", "cast", "--sizes", "N=7", "--check", check,
                 "--repeat", "1"]) == 0
    assert capsys.readouterr().out.count(" matches ") == 2


def test_compare_times_bfloat16_schedules_and_checks_the_peers():
    k = tc.define("def bmm(bf16(M, K) A, bf16(K, N) B) -> (C) { C(m, n) +=! A(m, k) * B(k, n) }").bmm
    a, b = torch.randn(16, 13).bfloat16(), torch.randn(13, 7).bfloat16()
    result = tc.compare(k, a, b, manual=["tile=4"], rounds=1, min_time=0.01, limits=False,
                        progress=False)
    status = {row.label.split(":")[0]: row.status for row in result.rows}
    assert status["numpy"] != "differs" and status["torch"] != "differs", result.table()
    assert all(s not in ("wrong", "error") for s in status.values()), result.table()


def test_tclang_torch_function_trains_in_bfloat16():
    import tclang.torch as tct
    f = tct.function("def f(bf16(N, M) X, bf16(M) W) -> (Y) { Y(n) +=! X(n, i) * W(i) }", "f")
    gen = torch.Generator().manual_seed(2)
    X = torch.randn(3, 9, generator=gen).bfloat16().requires_grad_()
    W = torch.randn(9, generator=gen).bfloat16().requires_grad_()
    Y = f(X, W)
    assert Y.dtype == torch.bfloat16
    Y.float().sum().backward()
    assert W.grad.dtype == torch.bfloat16 and X.grad.dtype == torch.bfloat16
    torch.testing.assert_close(W.grad.float(), X.detach().float().sum(0), rtol=1.6e-2, atol=1.6e-2)
    torch.testing.assert_close(X.grad.float(), W.detach().float().expand(3, 9), rtol=0, atol=0)
