"""Automatic dynamic shapes (Options(specialize="auto"), the default; docs/language.md,
Dynamic shapes): a kernel is specialized for its first sizes; once a size takes a second
value, one variant generic in the sizes that changed (the others constants) runs every
later value. Results against NumPy over sweeps with odd, prime and extent-1 sizes, the
variants each policy makes (Kernel.compile_stats), and what the partly generic code
keeps (register tiles, constant strides, run-time bounds checks)."""

from __future__ import annotations

import numpy as np
import pytest

import tclang as tc
from tclang.errors import TCScheduleError
from tclang.layouts import Layout, partial_layout_key
from benchmarks import kernels as K

# the benchmark operators themselves (benchmarks/kernels.py)
MATMUL, MLP, SOFTMAX, LAYERNORM, CONV = K.MATMUL, K.MLP_LAYER, K.SOFTMAX, K.LAYERNORM, \
    K.CONV2D
rng = np.random.default_rng(34)
SWEEP = (16, 1, 7, 13, 33, 97, 2, 64, 31, 5)  # ten values: odd, prime, 1


def f32(*shape):
    return rng.standard_normal(shape).astype(np.float32)


def conv_ref(I, Wt):
    n, c, h, w = I.shape
    m, _, kh, kw = Wt.shape
    out = np.zeros((n, m, h - kh + 1, w - kw + 1), np.float64)
    for y in range(kh):
        for x in range(kw):
            patch = I[:, :, y:y + h - kh + 1, x:x + w - kw + 1].astype(np.float64)
            out += np.einsum("nchw,mc->nmhw", patch, Wt[:, :, y, x].astype(np.float64))
    return out


def softmax_ref(X):
    e = np.exp(X - X.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def layernorm_ref(X, g, b):
    mean = X.mean(axis=1, keepdims=True)
    var = ((X - mean) ** 2).mean(axis=1, keepdims=True)
    return (X - mean) / np.sqrt(var + 1e-5) * g + b


def _variants(kernel) -> int:
    stats = kernel.compile_stats
    return stats["specialized"] + stats["generic"]


@pytest.mark.parametrize("backend", ["cpu", "reference"])
def test_matmul_sweep_of_ten_values_compiles_twice(backend):
    k = tc.define(MATMUL, backend=backend).matmul
    B = f32(24, 40)
    for m in SWEEP:
        A = f32(m, 24)
        np.testing.assert_allclose(k(A, B), A @ B, rtol=1e-4, atol=1e-4)
    assert k.compile_stats == {"specialized": 1, "generic": 1,
                               "compiled": k.compile_stats["compiled"]}
    assert k.compile_stats["compiled"] <= 2
    assert k.generic_sizes == ("M",)
    generic = k.compile(f32(3, 24), B)
    assert generic.generic == ("M",) and generic.sizes == {"K": 24, "N": 40}
    assert "// sizes: K=24, N=40" in generic.loops  # K and N stay constants
    first = k.compile(f32(16, 24), B)  # the first value keeps its specialized kernel
    assert first.generic == () and first.sizes == {"M": 16, "K": 24, "N": 40}


def test_partly_generic_matmul_keeps_its_register_tile():
    k = tc.define(MATMUL).matmul
    B = f32(64, 48)
    for m in (32, 33):
        k(f32(m, 64), B)
    loops = k.compile(f32(9, 64), B).loops
    assert "unrolled" in loops  # the micro-kernel of the specialized code
    assert "A[M][64]" in loops


@pytest.mark.parametrize("name", ["mlp", "softmax", "layernorm"])
def test_row_sweeps_match_numpy(name):
    D = 40
    W, bias = f32(24, D), f32(24)
    g, b = f32(D), f32(D)
    cases = {
        "mlp": (MLP, lambda n: (f32(n, D), W, bias),
                lambda X, W, bias: np.maximum(X @ W.T + bias, 0)),
        "softmax": (SOFTMAX, lambda n: (f32(n, D),), softmax_ref),
        "layernorm": (LAYERNORM, lambda n: (f32(n, D), g, b), layernorm_ref),
    }
    source, make, ref = cases[name]
    mod = tc.define(source)
    k = mod[mod.names[0]]
    for n in SWEEP:
        args = make(n)
        np.testing.assert_allclose(k(*args), ref(*args), rtol=2e-4, atol=2e-4)
    assert _variants(k) == 2
    assert len(k.generic_sizes) == 1


def test_conv_sweep_of_the_image_height():
    k = tc.define(CONV).conv2d
    Wt = f32(4, 3, 3, 3)
    for h in (8, 3, 11, 4, 17, 5, 9, 30, 13, 6):  # 3: a single output row
        I = f32(2, 3, h, 7)
        np.testing.assert_allclose(k(I, Wt), conv_ref(I, Wt), rtol=1e-4, atol=1e-4)
    assert _variants(k) == 2 and k.generic_sizes == ("H",)


def test_conv_sweep_of_the_batch():
    k = tc.define(CONV).conv2d
    Wt = f32(4, 3, 3, 3)
    for n in (2, 1, 5, 3):
        I = f32(n, 3, 9, 8)
        np.testing.assert_allclose(k(I, Wt), conv_ref(I, Wt), rtol=1e-4, atol=1e-4)
    assert _variants(k) == 2 and k.generic_sizes == ("N",)


def test_a_second_size_that_changes_makes_one_more_variant():
    k = tc.define(MATMUL).matmul
    for m, n in ((8, 16), (9, 16), (10, 16), (10, 17), (11, 5), (1, 1)):
        A, B = f32(m, 12), f32(12, n)
        np.testing.assert_allclose(k(A, B), A @ B, rtol=1e-4, atol=1e-4)
    assert k.compile_stats["specialized"] == 1 and k.compile_stats["generic"] == 2
    assert k.generic_sizes == ("M", "N")


def test_specialize_true_compiles_every_value():
    k = tc.define(MATMUL, options=tc.Options(specialize=True)).matmul
    B = f32(8, 8)
    for m in (1, 2, 3, 5):
        A = f32(m, 8)
        np.testing.assert_allclose(k(A, B), A @ B, rtol=1e-4, atol=1e-4)
    assert k.compile_stats["specialized"] == 4 and k.compile_stats["generic"] == 0
    assert k.generic_sizes == ()


def test_specialize_false_compiles_once():
    k = tc.define(MATMUL, options=tc.Options(specialize=False)).matmul
    for m, n in ((1, 8), (2, 3), (7, 1)):
        A, B = f32(m, 5), f32(5, n)
        np.testing.assert_allclose(k(A, B), A @ B, rtol=1e-4, atol=1e-4)
    assert k.compile_stats["specialized"] == 0 and k.compile_stats["generic"] == 1
    assert k.compile(f32(2, 5), f32(5, 2)).sizes is None


def test_the_option_and_its_knob():
    assert tc.Options().specialize == "auto"
    assert tc.Options.parse("specialize=auto") == tc.Options()
    assert tc.Options.parse("specialize=off").specialize is False
    assert tc.Options.parse(repr(tc.Options(specialize=True)).split("'")[1]).specialize is True
    with pytest.raises(TCScheduleError, match="specialize must be True, False or"):
        tc.Options(specialize="sometimes")


def test_strided_inputs_on_the_generic_variant():
    """Layouts of a partly generic kernel: C-contiguous arrays keep the strides that the
    fixed sizes decide; a transposed view or a padded slice has its own variant."""
    k = tc.define(MATMUL).matmul
    B = f32(12, 10)
    for m in (4, 5):
        k(f32(m, 12), B)
    big = f32(40, 30)
    # each row count once: a shape that recurs is specialized where the first variant has
    # a register tile (AVX2 machines tile these 10 columns), which is not what this tests
    rows = iter((3, 7, 1, 6, 9, 11, 2, 8, 13))
    for _ in range(3):
        for layout in (lambda m: big[:m, :12], lambda m: f32(12, m).T, lambda m: f32(m, 12)):
            A = layout(next(rows))
            np.testing.assert_allclose(k(A, B), A @ B, rtol=1e-4, atol=1e-4)
    assert k.compile_stats["specialized"] == 1


def test_partial_layout_keys():
    fixed_last = (False, True)
    assert partial_layout_key((5, 8), (8, 1), fixed_last) == Layout((8, 1))
    assert partial_layout_key((9, 8), (8, 1), fixed_last) == Layout((8, 1))
    assert partial_layout_key((8, 5), (5, 1), (True, False)) == Layout((None, 1))
    assert partial_layout_key((5, 8), (1, 5), fixed_last) == Layout((1, None))
    assert partial_layout_key((1, 8), (0, 1), fixed_last) == Layout((8, 1))


def test_reads_out_of_bounds_are_caught_per_call():
    """A partly generic kernel checks the reads that the generic sizes may push out of
    bounds at run time, as a shape-generic one does."""
    source = """def shift(float(N) X, float(M) Y) -> (Z) {
        Z(i) = X(i) + Y(i) where i in 0:N
    }"""
    k = tc.define(source).shift
    Y = f32(6)
    for n in (3, 4, 6, 1):
        X = f32(n)
        np.testing.assert_allclose(k(X, Y), X + Y[:n], rtol=1e-6)
    assert k.generic_sizes == ("N",)
    with pytest.raises(tc.TCArgumentError, match="out of bounds"):
        k(f32(7), Y)
    assert k.compile_stats["specialized"] == 1 and k.compile_stats["generic"] == 1


def test_a_zero_size_runs_on_a_specialized_kernel():
    """Partly generic code assumes its generic sizes are at least 1 (the bounds of a
    reduction's tiles depend on it), so a call with a zero one gets a specialized kernel,
    and the generic variant refuses one when called directly."""
    k = tc.define(MATMUL).matmul
    B = f32(6, 4)
    for m in (3, 5, 0, 2, 0):
        A = f32(m, 6)
        np.testing.assert_allclose(k(A, B), A @ B, rtol=1e-5, atol=1e-5)
    assert k.compile_stats["specialized"] == 2 and k.compile_stats["generic"] == 1
    generic = k.compile(f32(2, 6), B)
    assert generic.generic == ("M",)
    with pytest.raises(tc.TCArgumentError, match="at least 1"):
        generic(f32(0, 6), B)
    k0 = tc.define(MATMUL).matmul
    for kk in (3, 4, 0):  # an empty reduction: the output is all zeros
        A, B = f32(2, kk), f32(kk, 5)
        np.testing.assert_allclose(k0(A, B), A @ B, rtol=1e-5, atol=1e-5)


def test_a_generic_convolution_runs_its_reduction_tiles_exactly():
    """With every size generic (here, after all of them changed), the point loops of the
    reduction tiles are bounded by the sizes, not run over a whole tile under a guard."""
    k = tc.define(CONV).conv2d
    for n, c, h, w, m, kh in ((1, 2, 6, 5, 3, 3), (2, 3, 7, 6, 4, 2)):
        I, Wt = f32(n, c, h, w), f32(m, c, kh, kh)
        np.testing.assert_allclose(k(I, Wt), conv_ref(I, Wt), rtol=1e-4, atol=1e-4)
    loops = k.compile(I, Wt).loops
    assert "c12 < 64;" not in loops and "c11 < 64;" not in loops


def test_a_contraction_specializes_shapes_that_recur():
    """On a kernel with a register tile (a contraction, whose generic variant measured
    slower), the third call of one shape on the generic variant gets it a specialized
    kernel; on others (softmax) shapes that recur stay on the generic variant."""
    k = tc.define(MATMUL).matmul
    B = f32(32, 32)
    for m in (8, 9):
        k(f32(m, 32), B)
    A = f32(11, 32)
    for _ in range(5):
        np.testing.assert_allclose(k(A, B), A @ B, rtol=1e-4, atol=1e-4)
    assert k.compile_stats["specialized"] == 2 and k.compile_stats["generic"] == 1
    assert k.compile(A, B).generic == ()
    s = tc.define(SOFTMAX).softmax
    for n in (8, 9, 11, 11, 11, 11, 11):
        X = f32(n, 32)
        np.testing.assert_allclose(s(X), softmax_ref(X), rtol=1e-4, atol=1e-5)
    assert s.compile_stats["specialized"] == 1 and s.compile_stats["generic"] == 1


def test_calls_of_a_generic_variant_take_the_fastest_path():
    """The native entry is bound to a call's sizes and strides (Artifact.bind), for a
    variant whose code reads them at run time: repeats skip every check, and a call of
    another size or layout is refused by its signature and goes the checked way."""
    s = tc.define(SOFTMAX).softmax
    for n in (8, 9):
        s(f32(n, 32))
    X = f32(13, 32)
    s(X)
    assert s._hot.fastest is not None
    for n in (13, 13, 5, 13, 1):
        X = f32(n, 32)
        np.testing.assert_allclose(s(X), softmax_ref(X), rtol=1e-4, atol=1e-5)
    X = f32(40, 64)[:13, :32]  # a padded slice: a variant of its own layout
    np.testing.assert_allclose(s(X), softmax_ref(X), rtol=1e-4, atol=1e-5)
    out = np.empty((13, 32), np.float32)
    for _ in range(3):
        X = f32(13, 32)
        assert s(X, out=out) is out
        np.testing.assert_allclose(out, softmax_ref(X), rtol=1e-4, atol=1e-5)
    assert s._hot.fastest_out is not None


def test_the_variants_come_from_the_disk_cache(monkeypatch):
    """Both variants are stored: the same sweep after the in-memory map is cleared (as in
    another process) compiles nothing, and the generic variant's key differs from every
    specialized one's. (Without call records: a call one answers never parses the
    definition, so it is not counted as a value seen, and the next value gets a
    specialized kernel.)"""
    from tclang.driver import compiler
    monkeypatch.setenv("TCLANG_CALL_RECORDS", "0")
    source = MLP.replace("mlp_layer", "mlp_disk")
    W, bias = f32(12, 20), f32(12)
    sweep = [f32(n, 20) for n in (6, 3, 11)]
    first = tc.define(source).mlp_disk
    for X in sweep:
        first(X, W, bias)
    assert first.compile_stats["compiled"] == 2
    compiler.forget_compiled()
    again = tc.define(source).mlp_disk
    for X in sweep:
        np.testing.assert_allclose(again(X, W, bias), np.maximum(X @ W.T + bias, 0),
                                   rtol=1e-4, atol=1e-4)
    assert again.compile_stats == {"specialized": 1, "generic": 1, "compiled": 0}
