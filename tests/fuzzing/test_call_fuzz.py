"""Call fuzzing: compiled kernels called with every kind of argument a user can pass.

Each call either raises a clear `TCArgumentError` (wrong count, rank, dtype or size, a bad
`out=`) or gives the right result (non-contiguous, negative-stride, broadcast, misaligned,
read-only and overlapping views as inputs, empty dimensions, a non-contiguous out=); no
other exception, and no input is ever modified. Overlapping views are legal inputs but
must be refused as out=. The right result is the reference interpreter's on contiguous
copies. Kernels are shape-generic or specialized (then on few sizes, to bound compiles).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from numpy.lib.stride_tricks import as_strided

import tclang

SOURCE = """
def mm(float(M, K) A, float(K, N) B) -> (C) {
    C(m, n) +=! A(m, k) * B(k, n)
}
def ew(float(N, M) A, float(M) B, float s) -> (O) {
    O(i, j) = A(i, j) * B(j) + s
}
def gather(float(E, D) T, int32(L) I) -> (O) {
    O(l, d) = T(I(l), d)
}
def two(double(N) X, int64(N) Y) -> (P, Q) {
    P(i) = X(i) * 2.0
    Q(i) = Y(i) + 1
}
def pad(float(N, 3) A) -> (O) {
    O(i, j) = (i >= 1 && i <= N) ? A(i - 1, j) : 0 where i in 0:N + 2, j in 0:3
}
"""
NAMES = ("mm", "ew", "gather", "two", "pad")
MODULES = {"specialized": tclang.define(SOURCE),
           "generic": tclang.define(SOURCE, options=tclang.Options(specialize=False))}
ORACLE = tclang.define(SOURCE, backend="reference", options=tclang.Options(specialize=False))

INPUT_MUTATIONS = ("none", "fortran", "strided", "negative", "broadcast", "overlap",
                   "readonly", "misaligned", "list", "wrong-dtype", "wrong-rank", "wrong-size",
                   "too-few", "too-many", "python-scalar")
OUT_MODES = ("none", "none", "good", "noncontiguous", "readonly", "wrong-shape", "wrong-dtype",
             "alias", "count", "overlap")


def base_arguments(defn, sizes, rng) -> list:
    args = []
    for t in defn.inputs:
        shape = tuple(d.evaluate(sizes) for d in t.shape)
        if t.name == "I":
            values = rng.integers(0, max(sizes["E"], 1), size=shape)
        elif t.dtype.is_float:
            values = rng.standard_normal(shape)
        else:
            values = rng.integers(-5, 6, size=shape)
        args.append(np.asarray(values).astype(t.dtype.numpy))
    return args


def overlapping(shape, dtype, rng) -> np.ndarray:
    """A view whose elements overlap: every stride one element (a Hankel-like window)."""
    base = rng.standard_normal(sum(shape) + 1).astype(dtype)
    return as_strided(base, shape, (base.itemsize,) * len(shape))


def mutate(a: np.ndarray, how: str, rng):
    """(the new argument, what a call with it must do: "accept", "refuse" or "either")."""
    if how == "fortran":
        return np.asfortranarray(a), "accept"
    if how == "strided" and a.ndim:
        big = np.zeros(a.shape[:-1] + (2 * a.shape[-1],), a.dtype)
        big[..., ::2] = a
        return big[..., ::2], "accept"
    if how == "negative" and a.ndim:
        return np.ascontiguousarray(a[::-1])[::-1], "accept"
    if how == "broadcast" and a.size:
        return np.broadcast_to(a.reshape(-1)[:1].reshape((1,) * a.ndim), a.shape), "accept"
    if how == "overlap" and a.ndim and a.size and a.dtype.kind == "f":
        return overlapping(a.shape, a.dtype, rng), "accept"
    if how == "readonly":
        b = a.copy()
        b.setflags(write=False)
        return b, "accept"
    if how == "misaligned":
        raw = np.zeros(a.nbytes + 1, np.uint8)
        b = np.frombuffer(raw.data, a.dtype, a.size, offset=1).reshape(a.shape)
        b[...] = a
        return b, "accept"
    if how == "list":
        return a.tolist(), "either"
    if how == "wrong-dtype":
        return a.astype(np.float64 if a.dtype != np.float64 else np.float32), "refuse"
    if how == "wrong-rank":
        return a[..., None], "refuse"
    return a, "accept"


def call_plan(data, defn):
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16), label="seed"))
    values = (0, 1, 3) if data.draw(st.booleans(), label="few sizes") else (0, 1, 2, 5)
    sizes = {s: data.draw(st.sampled_from(values), label=s) for s in defn.sizes}
    args = base_arguments(defn, sizes, rng)
    how = data.draw(st.sampled_from(INPUT_MUTATIONS), label="mutation")
    j = data.draw(st.integers(0, len(args) - 1), label="argument")
    expect = "accept"
    if how == "too-few":
        args, expect = args[:-1], "refuse"
    elif how == "too-many":
        args, expect = args + [args[0]], "refuse"
    elif how == "python-scalar":
        scalars = [k for k, t in enumerate(defn.inputs) if t.rank == 0]
        if scalars:
            args[scalars[0]] = float(args[scalars[0]])
    elif how == "wrong-size":
        args[j], expect = resized(defn, args[j], j, rng)
    else:
        args[j], expect = mutate(args[j], how, rng)
    return sizes, args, expect, how


def resized(defn, a, j, rng):
    """One dimension grown by one: refused when another dimension or a literal fixes it."""
    t = defn.inputs[j]
    if not t.rank:
        return a, "accept"
    dim = int(rng.integers(0, t.rank))
    shape = list(a.shape)
    shape[dim] += 1
    b = np.zeros(shape, a.dtype)
    name = str(t.shape[dim])
    uses = sum(str(d) == name for u in defn.inputs for d in u.shape)
    fixed = t.shape[dim].constant is not None or uses > 1
    return b, "refuse" if fixed else "accept"


def make_out(mode, expected, args, rng):
    """(out=, what the call must do, whether it may write into an input)."""
    if mode == "count":
        outs = tuple(np.zeros_like(e) for e in expected)
        return (outs + outs[:1] if len(outs) > 1 else outs * 2), "refuse"
    outs = [np.zeros_like(e) for e in expected]
    expect = "accept"
    e = expected[0]
    if mode == "noncontiguous" and e.ndim:
        big = np.zeros(e.shape[:-1] + (2 * e.shape[-1],), e.dtype)
        outs[0] = big[..., ::2]
    elif mode == "readonly":
        outs[0].setflags(write=False)
        expect = "refuse"
    elif mode == "wrong-shape":
        outs[0] = np.empty((e.shape[0] + 1,) + e.shape[1:] if e.ndim else (1,), e.dtype)
        expect = "refuse"
    elif mode == "wrong-dtype":
        outs[0] = outs[0].astype(np.float16 if e.dtype != np.float16 else np.float32)
        expect = "refuse"
    elif mode == "alias":
        same = [a for a in args if isinstance(a, np.ndarray) and a.shape == e.shape and
                a.dtype == e.dtype and a.flags.writeable and a.size]
        if not same:
            return None, "skip"
        outs[0], expect = same[0], "either"
    elif mode == "overlap":
        if sum(d > 1 for d in e.shape) < 2 or e.dtype.kind != "f":  # else no overlap
            return None, "skip"
        outs[0], expect = overlapping(e.shape, e.dtype, rng), "refuse"
    return (outs[0] if len(outs) == 1 else tuple(outs)), expect


def as_tuple(x):
    return x if isinstance(x, tuple) else (x,)


def assert_same(actual, expected):
    for a, e in zip(as_tuple(actual), expected):
        assert a.shape == e.shape and a.dtype == e.dtype, (a.shape, a.dtype, e.shape, e.dtype)
        np.testing.assert_allclose(a, e, rtol=1e-5, atol=1e-5)


@settings(max_examples=1000, derandomize=True, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.data())
def test_calls_give_a_clear_error_or_the_right_result(data):
    variant = data.draw(st.sampled_from(("generic", "generic", "specialized")), label="kind")
    name = data.draw(st.sampled_from(NAMES), label="kernel")
    kernel = MODULES[variant][name]
    defn = kernel.definition
    sizes, args, expect, how = call_plan(data, defn)
    rng = np.random.default_rng(0)
    expected = None
    if expect != "refuse":
        try:
            clean = [np.array(a, dtype=t.dtype.numpy, order="C") for a, t in zip(args, defn.inputs)]
            expected = as_tuple(ORACLE[name](*clean))
        except tclang.TCError as err:
            expected = err
    mode = data.draw(st.sampled_from(OUT_MODES), label="out")
    out = None
    if mode != "none" and isinstance(expected, tuple):
        out, out_expect = make_out(mode, expected, args, rng)
        if out_expect == "refuse" or expect == "accept":
            expect = out_expect if out_expect != "skip" else expect
    before = [np.array(a, copy=True) if isinstance(a, np.ndarray) else a for a in args]
    try:
        result = kernel(*args, out=out) if out is not None else kernel(*args)
    except tclang.TCArgumentError as err:
        str(err)
        assert expect in ("refuse", "either") or isinstance(expected, tclang.TCArgumentError), \
            f"refused a valid call ({expect}): {err}"
        result = None
    except tclang.TCError as err:
        assert isinstance(expected, type(err)), f"{type(err).__name__}: {err}"
        event(f"{type(err).__name__}, as the reference")
        result = None
    event(f"{how}/{mode}: {'accepted' if result is not None else 'refused'}")
    if result is not None:
        assert expect != "refuse", "accepted a call it must refuse"
        assert isinstance(expected, tuple), f"the oracle refused it ({expected})"
        assert_same(result, expected)
        if out is not None:
            assert_same(out, expected)
    written = [o for o in as_tuple(out)] if out is not None and result is not None else []
    for a, b in zip(args, before):
        if isinstance(a, np.ndarray) and not any(np.may_share_memory(a, o) for o in written):
            np.testing.assert_array_equal(a, b, err_msg="an input was modified")


@pytest.mark.parametrize("variant", ["specialized", "generic"])
def test_the_hot_path_rechecks_what_it_must(variant):
    """A second call with the same shapes and strides (the hot path) on misaligned,
    read-only, overlapping or wrongly typed arrays: the same answers as the first call."""
    kernel = MODULES[variant]["ew"]
    rng = np.random.default_rng(1)
    A, B = rng.standard_normal((3, 4)).astype(np.float32), rng.standard_normal(4).astype(np.float32)
    s = np.float32(0.5)
    expected = A * B + s
    np.testing.assert_allclose(kernel(A, B, s), expected, rtol=1e-6)
    for how in ("misaligned", "readonly"):
        A2, _ = mutate(A, how, rng)
        np.testing.assert_allclose(kernel(A2, B, s), expected, rtol=1e-6)
    with pytest.raises(tclang.TCArgumentError):
        kernel(A.astype(np.float64), B, s)
    with pytest.raises(tclang.TCArgumentError):
        kernel(A, B)


def test_overlapping_out_is_refused():
    """An out= whose elements overlap cannot hold a result: it must be refused."""
    kernel = MODULES["specialized"]["ew"]
    A, B = np.ones((3, 3), np.float32), np.arange(3, dtype=np.float32)
    out = overlapping((3, 3), np.float32, np.random.default_rng(2))
    with pytest.raises(tclang.TCArgumentError):
        kernel(A, B, np.float32(0), out=out)


@pytest.mark.parametrize("shape, strides, overlaps", [
    ((3, 3), (1, 1), True),     # a sliding window
    ((2, 2), (0, 1), True),     # a broadcast row
    ((3, 2), (2, 3), False),    # interleaved: offsets 0 2 4 3 5 7, all distinct
    ((3, 2), (2, 2), True),     # offsets 0 2 4 2 4 6
    ((1, 4), (1, 1), False),    # one real dimension: no two elements meet
    ((4, 3), (-3, 1), False),   # rows reversed
])
def test_overlap_is_decided_exactly(shape, strides, overlaps):
    from tclang.runtime.arguments import _overlaps_itself
    base = np.zeros(64, np.float32)[32:]
    view = as_strided(base, shape, tuple(4 * s for s in strides))
    assert _overlaps_itself(view) is overlaps
    assert not _overlaps_itself(np.zeros((5, 7), np.float32)[:, ::2].T)
