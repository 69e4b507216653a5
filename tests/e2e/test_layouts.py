"""Layouts of a specialized kernel's arguments (tclang/layouts.py): which share a compile,
every one computes what NumPy does, out= with strided outputs, and a kernel compiled for
one layout never runs with strides its code holds as other constants."""

from __future__ import annotations

import numpy as np
import pytest

import tclang as tc
from backends.cuda.emulation.build import available as emulation_available
from tclang.driver import compiler
from tclang.layouts import OFFSET_BOUND, Layout, layout_key

MATMUL = "def mm(float(M,K) A, float(K,N) B) -> (C) {\n  C(m, n) +=! A(m, k) * B(k, n)\n}"
SOFTMAX = """def softmax(float(N, D) X) -> (Y) {
    m(n) max=! X(n, d)
    s(n) +=! exp(X(n, d) - m(n))
    Y(n, d) = exp(X(n, d) - m(n)) / s(n)
}"""
CONV = """def conv(float(N, C, H, W) I, float(M, C, KH, KW) Wt) -> (O) {
    O(n, m, h, w) +=! I(n, c, h + kh, w + kw) * Wt(m, c, kh, kw)
}"""
rng = np.random.default_rng(7)


def f32(*shape):
    return rng.standard_normal(shape).astype(np.float32)


def wide(a: np.ndarray, extra: int) -> np.ndarray:
    """`a`'s values in a view whose last dimension's rows are `extra` elements wider."""
    big = np.full(a.shape[:-1] + (a.shape[-1] + extra,), np.nan, a.dtype)
    big[..., :a.shape[-1]] = a
    return big[..., :a.shape[-1]]


def layouts(a: np.ndarray) -> dict[str, np.ndarray]:
    """The same values of a 2-D `a` in several memory layouts."""
    return {
        "C": a,
        "Fortran": np.asfortranarray(a),
        "transposed": wide(np.ascontiguousarray(a.T), 3).T,  # of a wider array
        "padded rows": wide(a, 5),
        "padded rows 2": wide(a, 11),
        "row slice": np.concatenate([a, a])[:a.shape[0]],  # C-contiguous
        "reversed": a[::-1][::-1],
    }


@pytest.fixture
def compile_keys(monkeypatch):
    """The cache keys the compile driver is asked for from now on (every compile, also
    one the memory or disk cache answers, goes through it with its full key)."""
    keys = []
    real = compiler.compile_definition

    def spy(defn, sizes, options, backend, target, key, *rest):
        keys.append(key)
        return real(defn, sizes, options, backend, target, key, *rest)

    monkeypatch.setattr(compiler, "compile_definition", spy)  # runtime imports it per compile
    return keys


def test_four_layouts_compile_three_times(compile_keys):
    a, b = f32(13, 7), f32(7, 5)
    kernel = tc.define(MATMUL).mm
    found = {}
    for name in ("C", "Fortran", "transposed", "padded rows"):
        found[name] = kernel.compile(layouts(a)[name], b)
        np.testing.assert_allclose(kernel(layouts(a)[name], b), a @ b, rtol=1e-5, atol=1e-5)
    assert len(compile_keys) == len({compiler.key_digest(k) for k in compile_keys}) == 3
    # Fortran order and a transposed view step along the same unit-stride dimension
    assert found["Fortran"] is found["transposed"]
    # C-contiguous strides stay constants of the code; a padded view's row stride is not
    assert len({id(found[n]) for n in ("C", "Fortran", "padded rows")}) == 3
    for name in ("padded rows 2", "row slice", "reversed"):  # same keys as padded rows or C
        kernel(layouts(a)[name], b)
    assert len(compile_keys) == 3
    assert kernel.compile(layouts(a)["padded rows 2"], b) is found["padded rows"]
    assert kernel.compile(layouts(a)["row slice"], b) is found["C"]


def test_contiguous_kernels_keep_constant_strides():
    a, b = f32(6, 4), f32(4, 3)
    kernel = tc.define(MATMUL).mm
    static = {name: kernel.compile(layouts(a)[name], b).compiled.artifact.blobs["static"]
              for name in ("C", "Fortran", "padded rows")}
    assert static == {"C": b"1", "Fortran": b"0", "padded rows": b"0"}


@pytest.mark.parametrize("m,k,n", [(1, 1, 1), (1, 7, 1), (17, 1, 3), (13, 29, 31), (64, 33, 2)])
def test_every_layout_computes_what_numpy_does(m, k, n):
    a, b = f32(m, k), f32(k, n)
    kernel = tc.define(MATMUL).mm
    for name_a, la in layouts(a).items():
        for name_b, lb in layouts(b).items():
            np.testing.assert_allclose(kernel(la, lb), a @ b, rtol=1e-4, atol=1e-5,
                                       err_msg=f"A {name_a}, B {name_b}")


def test_extent_one_dimensions_with_any_stride():
    """NumPy lets an extent-1 dimension have any stride: such arrays are still contiguous
    (the key ignores that stride) or share the unit-stride key of their other dims."""
    a, b = f32(1, 9), f32(9, 1)
    odd_a = np.lib.stride_tricks.as_strided(a, (1, 9), (1000 * 4, 4))
    odd_b = np.lib.stride_tricks.as_strided(b, (9, 1), (4, -8))
    assert layout_key(odd_a.shape, (1000, 1)) == layout_key(a.shape, (9, 1))
    kernel = tc.define(MATMUL).mm
    np.testing.assert_allclose(kernel(odd_a, odd_b), a @ b, rtol=1e-5)
    assert kernel.compile(odd_a, odd_b) is kernel.compile(a, b)
    three = f32(5, 1, 4)
    bent = np.lib.stride_tricks.as_strided(wide(three, 2), (5, 1, 4), (6 * 4, 77 * 4, 4))
    twice = tc.define("def t(float(A,B,C) X) -> (Y) { Y(a, b, c) = 2 * X(a, b, c) }").t
    np.testing.assert_allclose(twice(bent), 2 * three)
    np.testing.assert_allclose(twice(wide(three, 7)), 2 * three)
    assert twice.compile(bent) is twice.compile(wide(three, 7))


def test_softmax_and_conv_in_every_layout():
    x = f32(37, 19)
    softmax = tc.define(SOFTMAX).softmax
    expected = np.exp(x - x.max(1, keepdims=True))
    expected /= expected.sum(1, keepdims=True)
    for name, lx in layouts(x).items():
        np.testing.assert_allclose(softmax(lx), expected, rtol=1e-5, atol=1e-6, err_msg=name)
    image, weights = f32(2, 3, 9, 11), f32(4, 3, 3, 2)
    expected = np.zeros((2, 4, 7, 10), np.float32)
    for kh in range(3):
        for kw in range(2):
            expected += np.einsum("nchw,mc->nmhw", image[:, :, kh:kh + 7, kw:kw + 10],
                                  weights[:, :, kh, kw])
    conv = tc.define(CONV).conv
    views = [image, wide(image, 3), image.transpose(0, 1, 3, 2).copy().transpose(0, 1, 3, 2),
             np.moveaxis(np.moveaxis(image, 1, 3).copy(), 3, 1)]  # NCHW, padded, W-major, NHWC
    for k, view in enumerate(views):
        np.testing.assert_allclose(conv(view, weights), expected, rtol=1e-4, atol=1e-4,
                                   err_msg=f"view {k}")


def test_strided_outputs():
    a, b = f32(9, 6), f32(6, 5)
    kernel = tc.define(MATMUL).mm
    for name, la in layouts(a).items():
        for out in (wide(np.zeros((9, 5), np.float32), 4), np.zeros((5, 9), np.float32).T,
                    np.zeros((18, 10), np.float32)[::2, ::2], np.zeros((9, 5), np.float32)):
            out[...] = np.nan
            assert kernel(la, b, out=out) is out
            np.testing.assert_allclose(out, a @ b, rtol=1e-5, atol=1e-5, err_msg=name)


def test_a_compiled_kernel_refuses_another_layout():
    a, b = f32(8, 6), f32(6, 4)
    views = layouts(a)
    contiguous = tc.compile(MATMUL, "mm", a, b)
    for name in ("Fortran", "padded rows"):
        with pytest.raises(tc.TCArgumentError, match="layout"):
            contiguous(views[name], b)
    padded = tc.compile(MATMUL, "mm", views["padded rows"], b)
    np.testing.assert_allclose(padded(views["padded rows 2"], b), a @ b, rtol=1e-5)
    for name in ("C", "Fortran", "transposed"):
        with pytest.raises(tc.TCArgumentError, match="layout"):
            padded(views[name], b)
    np.testing.assert_allclose(contiguous(views["row slice"], b), a @ b, rtol=1e-5)


def test_the_disk_cache_keys_layouts(tmp_path, monkeypatch):
    monkeypatch.setenv("TCLANG_CACHE_DIR", str(tmp_path))
    a, b = f32(10, 4), f32(4, 6)
    views = layouts(a)
    found = {}
    for name in ("padded rows", "padded rows 2", "C", "row slice", "Fortran"):
        compiler.forget_compiled()  # nothing in memory: the disk cache answers or not
        kernel = tc.define(MATMUL).mm
        found[name] = kernel.compile(views[name], b).cache
        np.testing.assert_allclose(kernel(views[name], b), a @ b, rtol=1e-5, err_msg=name)
    assert found == {"padded rows": "compiled", "padded rows 2": "disk", "C": "compiled",
                     "row slice": "disk", "Fortran": "compiled"}


def test_shape_generic_kernels_take_every_layout_in_one_compile(compile_keys):
    a, b = f32(7, 5), f32(5, 3)
    kernel = tc.define(MATMUL, options=tc.Options(specialize=False)).mm
    for name, la in layouts(a).items():
        np.testing.assert_allclose(kernel(la, b), a @ b, rtol=1e-5, err_msg=name)
    assert len(compile_keys) == 1


def test_layout_keys():
    assert layout_key((3, 4), (4, 1)) == Layout((4, 1))
    assert layout_key((3, 4), (1, 3)) == Layout((1, None), OFFSET_BOUND)
    assert layout_key((3, 4), (9, 1)) == layout_key((3, 4), (5, 1)) == \
        Layout((None, 1), OFFSET_BOUND)
    assert layout_key((3, 4), (-4, 1)) == Layout((None, 1), OFFSET_BOUND)
    assert layout_key((3, 4), (0, 1)) == Layout((None, 1), OFFSET_BOUND)  # broadcast
    assert layout_key((1, 4), (123, 1)) == Layout((4, 1))  # contiguous: 123 never used
    assert layout_key((1, 4), (123, 2)) == Layout((0, None), OFFSET_BOUND)
    assert layout_key((0, 4), (1, 7)) == Layout((4, 1))  # no elements
    assert layout_key((), ()) == Layout(())
    assert layout_key((2, 3), (1 << 30, 1)) == Layout((None, 1), None)  # offsets too far


@pytest.mark.skipif(not emulation_available(), reason="the emulation needs g++")
def test_cuda_emulated_layouts():
    a, b = f32(11, 6), f32(6, 5)
    kernel = tc.define(MATMUL, backend="cuda-emulated").mm
    for name, la in layouts(a).items():
        for lb in (b, np.asfortranarray(b), wide(b, 2)):
            np.testing.assert_allclose(kernel(la, lb), a @ b, rtol=1e-4, atol=1e-5,
                                       err_msg=name)


def test_cuda_indexes_in_32_bits_only_within_the_layouts_bound():
    """Run-time strides keep 32-bit GPU indices when the layout key bounds the offsets."""
    from backends.cuda.codegen import generate
    from polyhedral.pipeline import schedule_definition
    defn = tc.define(MATMUL, backend="cuda-emulated").mm.definition
    options = tc.Options()
    target = compiler.compile_target("cuda-emulated", options)
    sizes = {"M": 8, "K": 6, "N": 4}

    def index_type(layout_a: Layout) -> str:
        kernel = schedule_definition(defn, sizes, options, target,
                                     (layout_a, Layout((4, 1)))).kernel
        return "int" if "((int)st_A_0)" in generate(kernel).text else "long long"

    assert index_type(Layout((6, 1))) == "int"
    assert index_type(Layout((None, 1), OFFSET_BOUND)) == "int"
    assert index_type(Layout((None, 1), None)) == "long long"
