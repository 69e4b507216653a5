"""Contractions through the register-tile micro-kernel, against NumPy: odd, prime and size-1
extents (full tiles, partial tiles and both), manual tile shapes, shape-generic code,
bounds-checked code; FMA contraction in the emitted LLVM IR, and none where the user asked
for reproducible reductions."""

import re

import numpy as np
import pytest

import tclang as tc

MATMUL = "def mm(float(M,K) A, float(K,N) B) -> (C) { C(m, n) +=! A(m, k) * B(k, n) }"
BMM = "def bmm(float(B,N,M) X, float(B,M,K) Y) -> (Z) { Z(b, n, k) +=! X(b, n, m) * Y(b, m, k) }"
CONV = ("def conv(float(N,C,H,W) I, float(M,C,KH,KW) Wt) -> (O) {"
        " O(n, m, h, w) +=! I(n, c, h + kh, w + kw) * Wt(m, c, kh, kw) }")
MLP = ("def mlp(float(B,I) X, float(I,O) W, float(O) b) -> (Y) {\n"
       " Y(n, o) +=! X(n, i) * W(i, o)\n Y(n, o) = fmax(Y(n, o) + b(o), 0) }")
MLP_T = ("def mlp(float(B,I) X, float(O,I) W, float(O) b) -> (Y) {\n"
         " Y(n, o) +=! X(n, i) * W(o, i)\n Y(n, o) = fmax(Y(n, o) + b(o), 0) }")
DOUBLE_MM = "def mm(double(M,K) A, double(K,N) B) -> (C) { C(m, n) +=! A(m, k) * B(k, n) }"

rng = np.random.default_rng(7)


def matmul_case(m, k, n, dtype=np.float32):
    a, b = rng.standard_normal((m, k)).astype(dtype), rng.standard_normal((k, n)).astype(dtype)
    return (a, b), a.astype(np.float64) @ b.astype(np.float64)


def conv_reference(x, w):
    kh, kw = w.shape[2:]
    win = np.lib.stride_tricks.sliding_window_view(x.astype(np.float64), (kh, kw), axis=(2, 3))
    return np.einsum("nchwij,mcij->nmhw", win, w.astype(np.float64))


def _host_target():
    """The target kernels here compile for (its vector width decides the tile's form)."""
    from backends.llvm.backend import LLVMBackend
    return LLVMBackend().target()


def close(actual, expected, terms):
    scale = np.sqrt(max(terms, 1)) * np.abs(expected).max(initial=1.0)
    np.testing.assert_allclose(actual, expected, atol=2e-6 * scale, rtol=1e-5)


@pytest.mark.parametrize("m,k,n", [(1, 1, 1), (4, 3, 16), (5, 7, 17), (13, 29, 37),
                                   (37, 31, 70), (64, 48, 64), (3, 65, 1), (97, 2, 33)])
def test_matmul_shapes(m, k, n):
    args, expected = matmul_case(m, k, n)
    close(tc.define(MATMUL).mm(*args), expected, k)


@pytest.mark.parametrize("options", [tc.Options(register_tile=(1, 8)),
                                     tc.Options(register_tile=(3, 8)),
                                     tc.Options(register_tile=(3, 24), tile=(10, 0, 7)),
                                     tc.Options(register_tile=False),
                                     tc.Options(pack=True),
                                     tc.Options(pack=True, register_tile=(3, 8)),
                                     tc.Options(pack=True, check_bounds=True),
                                     tc.Options(pack=False),
                                     tc.Options(specialize=False),
                                     tc.Options(check_bounds=True),
                                     tc.Options(reorder_reductions=False)],
                         ids=lambda o: o.describe())
def test_matmul_options(options):
    kernel = tc.define(MATMUL, options=options)
    for m, k, n in [(37, 31, 70), (8, 5, 16), (1, 9, 3)]:
        args, expected = matmul_case(m, k, n)
        close(kernel.mm(*args), expected, k)


def on_both_backends(shapes):
    """Each shape on the cpu and the reference interpreter; the interpreter's run of the
    long reduction (k = 300, ~30 s) only with -m slow: the cpu run and the smaller shapes
    cover the same code on the default run."""
    return [pytest.param(backend, *shape, marks=pytest.mark.slow)
            if backend == "reference" and 300 in shape else (backend, *shape)
            for shape in shapes for backend in ("cpu", "reference")]


@pytest.mark.parametrize("backend,m,k,n", on_both_backends(
    [(67, 31, 70), (64, 300, 33), (97, 1, 16), (71, 13, 1)]))
def test_packed_operands(backend, m, k, n):
    """The lane operand copied sliver by sliver (partial slivers at every edge), in the
    LLVM backend and in the reference interpreter; transposed and Fortran-ordered too."""
    kernel = tc.define(MATMUL, backend=backend, options=tc.Options(pack=True))
    args, expected = matmul_case(m, k, n)
    close(kernel.mm(*args), expected, k)
    if backend == "cpu":
        a, b = args
        close(kernel.mm(a, np.asfortranarray(b)), expected, k)
        close(kernel.mm(np.asfortranarray(a), b.T.copy().T), expected, k)


@pytest.mark.parametrize("backend,b,i,o", on_both_backends(
    [(67, 31, 70), (64, 300, 33), (97, 1, 16), (71, 13, 1), (1, 9, 17), (5, 2, 3)]))
def test_an_operand_read_across_the_lanes_is_packed_lanes_first(backend, b, i, o):
    """x @ w.T (W(o, i) read across the lanes o): with pack=True W packed as its
    transpose, every edge; with packing off the dot-product form; by default either,
    after the machine's vector width; a Fortran-ordered W (then contiguous along o)."""
    x = rng.standard_normal((b, i)).astype(np.float32)
    w = rng.standard_normal((o, i)).astype(np.float32)
    bias = rng.standard_normal(o).astype(np.float32)
    expected = np.maximum(x.astype(np.float64) @ w.T.astype(np.float64) + bias, 0)
    for options in (tc.Options(), tc.Options(pack=True), tc.Options(pack=False)):
        kernel = tc.define(MLP_T, backend=backend, options=options)
        close(kernel.mlp(x, w, bias), expected, i)
        if backend == "cpu":
            close(kernel.mlp(x, np.asfortranarray(w), bias), expected, i)


def test_packing_in_the_llvm_ir():
    """The packed sliver is a 64-byte aligned array on the stack of the thread's function,
    and the micro-kernel loads its lanes from there."""
    a, b = np.ones((128, 64), np.float32), np.ones((64, 48), np.float32)
    ir = tc.define(MATMUL).mm.compile(a, b).stage_text("llvm")
    # K x nr floats, nr the model's for this machine (16 with AVX2, 32 with AVX-512 here)
    from polyhedral.register_tiles import shape_for
    nr = shape_for(_host_target(), 4, 48, 128, 64)[1]
    assert re.search(rf'%"B_packed0" = alloca \[{64 * nr} x float\], align 64', ir)
    off = tc.define(MATMUL, options=tc.Options(pack=False)).mm.compile(a, b)
    assert "alloca [" not in off.stage_text("llvm")
    # x @ w.T: W's 16 x kc sliver, lanes-first; the tile loads 8 lanes at once from it
    x, w, bias = np.ones((128, 64), np.float32), np.ones((48, 64), np.float32), np.ones(48,
                                                                                     np.float32)
    transposed = tc.define(MLP_T, options=tc.Options(pack=True)).mlp.compile(x, w, bias)
    assert re.search(rf'%"W_packed0" = alloca \[{64 * nr} x float\], align 64',
                     transposed.stage_text("llvm"))
    assert re.search(r"load <(8|16|32) x float>", transposed.stage_text("llvm-opt"))


def test_the_register_tile_is_vector_operations_in_the_llvm_ir():
    """Each row of the tile is one vector of nr lanes (two to six registers' worth) carried
    through the reduction loop: a broadcast of A's element, a vector load of B's row, one
    multiply and one add per row; no scalar statement per point for LLVM to re-vectorize
    (the unoptimized IR of a small matmul was 756 KB that way)."""
    a, b = np.ones((64, 48), np.float32), np.ones((48, 80), np.float32)
    compiled = tc.define(MATMUL).mm.compile(a, b)
    ir = compiled.stage_text("llvm")
    nr = int(re.search(r"phi\s+<(\d+) x float>", ir).group(1))
    assert nr in (8, 16, 32, 48, 64, 80)
    assert re.search(rf"fmul contract <{nr} x float>", ir)
    assert re.search(rf"fadd reassoc contract <{nr} x float>", ir)
    assert re.search(rf"load <{nr} x float>, <{nr} x float>\* %\S+, align 4", ir)
    assert "fmul contract float" not in ir  # no scalar products left
    assert len(ir) < 200_000
    close(compiled(a, b), a.astype(np.float64) @ b, 48)
    # a transposed operand's lanes are not contiguous: its form depends on the target (a
    # dot tile over the shared stride-1 reduction, a lanes-first copy with 16 vector
    # registers, or scalar code), and its numbers do not
    bt = np.asfortranarray(b)
    transposed = tc.define(MATMUL).mm.compile(a, bt)
    close(transposed(a, bt), a.astype(np.float64) @ b, 48)


FULL_ROWS = re.compile(r"< \d+; c\d+\+\+\) \{  // unrolled\n\s+for \(int c\d+ = 0; c\d+ < \d+; "
                       r"c\d+\+\+\) \{  // unrolled, vectorize")


@pytest.mark.parametrize("m,k,n", [(500, 29, 40), (500, 64, 64), (300, 17, 70)])
def test_rows_not_a_multiple_of_the_tile_keep_the_register_tile(m, k, n):
    """M = 500 with 8-row tiles in 128-row blocks: the full tiles' rows are unrolled (a
    row loop of constant extent, then the lanes), only the last rows keep a loop. The
    prefixes of full tiles came out as a union (`c4 <= 13 or c0 <= 2`) that isl isolated
    only in part, and every step of every block ran its rows as a loop (4.85 ms against
    1.98 for 500x499x501)."""
    (a, b), expected = matmul_case(m, k, n)
    compiled = tc.define(MATMUL).mm.compile(a, b)
    assert FULL_ROWS.search(compiled.loops), compiled.loops
    close(compiled(a, b), expected, k)


def test_double_and_fortran_ordered_inputs():
    (a, b), expected = matmul_case(23, 19, 41, np.float64)
    close(tc.define(DOUBLE_MM).mm(np.asfortranarray(a), b), expected, 19)
    close(tc.define(DOUBLE_MM).mm(a, np.asfortranarray(b)), expected, 19)


def test_batched_and_conv_and_epilogue():
    x, y = rng.standard_normal((3, 11, 13), np.float32), rng.standard_normal((3, 13, 35),
                                                                            np.float32)
    close(tc.define(BMM).bmm(x, y), x.astype(np.float64) @ y, 13)
    i, w = rng.standard_normal((2, 3, 7, 21), np.float32), rng.standard_normal((5, 3, 3, 3),
                                                                            np.float32)
    close(tc.define(CONV).conv(i, w), conv_reference(i, w), 27)
    xs, ws, bs = (rng.standard_normal(s, np.float32) for s in ((9, 17), (17, 33), (33,)))
    expected = np.maximum(xs.astype(np.float64) @ ws + bs, 0)
    close(tc.define(MLP).mlp(xs, ws, bs), expected, 17)


@pytest.mark.parametrize("b,i,o", [(1, 1, 1), (2, 3, 4), (9, 70, 13), (31, 129, 37)])
def test_dot_product_tiles(b, i, o):
    x, w, bias = (rng.standard_normal(s, np.float32) for s in ((b, i), (o, i), (o,)))
    expected = np.maximum(x.astype(np.float64) @ w.T.astype(np.float64) + bias, 0)
    close(tc.define(MLP_T).mlp(x, w, bias), expected, i)


def test_out_argument_starts_from_the_identity():
    """`+=!` starts from zero even when out= holds other values (the peeled first step)."""
    (a, b), expected = matmul_case(19, 23, 40)
    out = np.full((19, 40), 123.0, np.float32)
    tc.define(MATMUL).mm(a, b, out=out)
    close(out, expected, 23)


def test_fma_contraction_in_the_ir_only_where_reductions_may_reorder():
    a, b = np.ones((32, 32), np.float32), np.ones((32, 32), np.float32)
    fast = tc.define(MATMUL).mm.compile(a, b).stage_text("llvm")
    exact = tc.define(MATMUL, options=tc.Options(reorder_reductions=False)).mm.compile(a, b)
    assert "fmul contract" in fast and "fadd reassoc contract" in fast
    assert "contract" not in exact.stage_text("llvm")


MATMUL_TA = "def ta(float(K,M) At, float(K,N) B) -> (C) { C(m, n) +=! At(k, m) * B(k, n) }"


@pytest.mark.parametrize("k,m,n", [(300, 97, 200), (64, 37, 130), (129, 4, 96)])
def test_an_operand_broadcast_with_a_stride_along_the_reduction_is_packed(k, m, n):
    """C = At^T B: At(k, m) is what the rows broadcast, read a row of At apart at every
    reduction step. Its block is packed once per cache tile, where two or more
    register-tile columns reuse it, and the tile reads it from there; the contiguous A of a
    plain matmul is not packed; the results match NumPy, bounds-checked too."""
    at = rng.standard_normal((k, m)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    want = at.T.astype(np.float64) @ b
    compiled = tc.define(MATMUL_TA).ta.compile(at, b)
    from polyhedral import register_tiles
    host = _host_target()
    columns = n // register_tiles.shape_for(host, 4, n, m, k)[1]
    packed = re.search(r"float32 (At_packed\d+)\[\d+\]\[\d+\];", compiled.loops)
    assert bool(packed) == (columns >= 2), compiled.loops
    if packed:
        assert f"ref 0 -> {packed.group(1)}" in compiled.loops
    close(compiled(at, b), want, k)
    checked = tc.define(MATMUL_TA, options=tc.Options(check_bounds=True)).ta
    close(checked(at, b), want, k)
    a = np.ascontiguousarray(at.T)
    assert "A_packed" not in tc.define(MATMUL).mm.compile(a, b).loops
