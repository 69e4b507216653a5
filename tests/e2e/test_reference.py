"""Every corpus case on the reference backend, under each schedule knob, against NumPy.

The reference backend interprets the scheduled loop IR, so these tests check the front end
and the polyhedral middle end (scheduling, fusion, tiling, code generation) end to end:
- the automatic schedule, each fusion strategy and three tile sizes, on every shape
  (ids like `matmul-fusion=min-shape1`);
- shape-generic code (`specialize=False`): compiled once per case, then run on every shape
  (`matmul-specialize=False-shape2`);
- Fortran-ordered inputs under the automatic schedule (one shape per case);
- the corpus's own rules.

The disk cache is pointed at a fresh directory for this module, so every kernel is really
compiled by the checked-out code.

Known tclang bugs are strict xfails (KNOWN_BUGS): when one is fixed its tests XPASS and
fail, and the entry must go.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

import tclang
from tclang.dtypes import DType
from tests.corpus import (CASES, Case, as_numpy, assert_close, check_call, define, is_tensor,
                          make_inputs, run_case)

OPTIONS = {
    "auto": None,
    "fusion=max": tclang.Options(fusion="max"),
    "fusion=min": tclang.Options(fusion="min"),
    "fusion=preserve_parallel": tclang.Options(fusion="preserve_parallel"),
    "tile=1": tclang.Options(tile=1),
    "tile=3": tclang.Options(tile=3),
    "tile=32": tclang.Options(tile=32),
}
GENERIC = tclang.Options(specialize=False)

# test id (a regular expression, matched in full) -> why it fails. Keep these precise.
KNOWN_BUGS: dict[str, str] = {}


@pytest.fixture(scope="module", autouse=True)
def fresh_disk_cache(tmp_path_factory):
    """Compile everything afresh: the disk cache's key names tclang's version, not its code,
    so entries written by an older checkout would hide a scheduler change."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TCLANG_CACHE_DIR", str(tmp_path_factory.mktemp("tclang-cache")))
        yield


def _marks(test_id: str):
    for pattern, reason in KNOWN_BUGS.items():
        if re.fullmatch(pattern, test_id):
            return [pytest.mark.xfail(strict=True, reason=reason)]
    return []


def _param(*values, id: str):
    return pytest.param(*values, id=id, marks=_marks(id))


SPECIALIZED = [_param(case, name, k, id=f"{case.name}-{name}-shape{k}")
               for case in CASES for name in OPTIONS for k in range(len(case.shapes))]


@pytest.mark.parametrize("case,option,k", SPECIALIZED)
def test_specialized(case: Case, option: str, k: int):
    outputs, expected = run_case(case, case.shapes[k], "reference", OPTIONS[option])
    assert_close(outputs, expected, case)


_generic: dict[str, tuple] = {}


def _generic_kernel(case: Case):
    """One Module and one compilation per case, shared by the case's shape tests."""
    if case.name not in _generic:
        kernel = define(case, "reference", GENERIC)[case.entry]
        compiled = kernel.compile(*make_inputs(case, case.shapes[0]))
        _generic[case.name] = (kernel, compiled)
    return _generic[case.name]


GENERIC_PARAMS = [_param(case, k, id=f"{case.name}-specialize=False-shape{k}")
                  for case in CASES for k in range(len(case.shapes))]


@pytest.mark.parametrize("case,k", GENERIC_PARAMS)
def test_shape_generic(case: Case, k: int):
    kernel, compiled = _generic_kernel(case)
    assert compiled.sizes is None, "specialize=False must give shape-generic code"
    inputs = make_inputs(case, case.shapes[k])
    assert kernel.compile(*inputs) is compiled, "shape-generic code was compiled again"
    outputs, expected = check_call(case, compiled, inputs)
    assert_close(outputs, expected, case)


# one shape per case (the last): the layout only changes argument binding and strides
FORTRAN = [_param(case, len(case.shapes) - 1,
                  id=f"{case.name}-layout=F-shape{len(case.shapes) - 1}") for case in CASES]


@pytest.mark.parametrize("case,k", FORTRAN)
def test_fortran_layout(case: Case, k: int):
    outputs, expected = run_case(case, case.shapes[k], "reference", None, layout="F")
    assert_close(outputs, expected, case)


# ---- the corpus's own rules -------------------------------------------------------------

def _extents(case: Case, shape: dict[str, int]) -> list[int]:
    """Every extent of every input of `shape`."""
    return [n for a in make_inputs(case, shape) for n in np.shape(a)]


def test_corpus_rules():
    assert len(CASES) >= 45
    names = [c.name for c in CASES]
    assert len(set(names)) == len(names), "case names must be unique"
    extents = set()
    for case in CASES:
        assert re.fullmatch(r"[a-z][a-z0-9_]*", case.name), case.name
        assert len(case.shapes) >= 3, f"{case.name}: fewer than 3 shapes"
        assert len({tuple(sorted(s.items())) for s in case.shapes}) == len(case.shapes), \
            f"{case.name}: repeated shape"
        for shape in case.shapes:
            extents.update(_extents(case, shape))
            assert all(0 < v <= 16 for v in shape.values()), f"{case.name}: {shape} too big"
    assert 1 in extents, "no size-1 extent in the corpus"
    assert extents & {7, 11, 13}, "no prime extent in the corpus"


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_case_rules(case: Case):
    """Declared dtypes and ranks, defs present, a size-1 and a prime extent per case."""
    module = define(case, "reference")
    assert case.entry in module.names
    definition = module[case.entry].definition
    params = definition.inputs
    all_extents = set()
    for shape in case.shapes:
        assert set(shape) == set(definition.sizes), \
            f"{case.name}: {shape} does not name exactly the sizes {definition.sizes}"
        inputs = make_inputs(case, shape)
        assert len(inputs) == len(params), f"{case.name}: wrong number of inputs"
        for array, param in zip(inputs, params):
            if param.dtype is DType.BFLOAT16:  # NumPy has none: torch's (tests/corpus.py)
                assert "bfloat16" in case.tags, f"{case.name}: not tagged bfloat16"
                assert is_tensor(array) and str(array.dtype) == "torch.bfloat16", \
                    f"{case.name}: {param.name} is not a torch.bfloat16 tensor"
                array = as_numpy(array)
            else:
                assert isinstance(array, np.ndarray), f"{case.name}: {param.name} not an ndarray"
                assert array.dtype == param.dtype.numpy, \
                    f"{case.name}: {param.name} is {array.dtype}, declared {param.dtype.numpy}"
            assert array.shape == tuple(d.evaluate(shape) for d in param.shape), \
                f"{case.name}: {param.name} has shape {array.shape} for {shape}"
        all_extents.update(shape.values())
        # the same seed gives the same inputs
        again = make_inputs(case, shape)
        for a, b in zip(inputs, again):
            np.testing.assert_array_equal(as_numpy(a), as_numpy(b))
    if all_extents:
        assert 1 in all_extents, f"{case.name}: no size-1 extent among its shapes"
        assert all_extents & {7, 11, 13}, f"{case.name}: no prime extent among its shapes"


def test_fortran_inputs_are_copies():
    """run_case's layout="F" converts without touching the C-ordered originals."""
    case = next(c for c in CASES if c.name == "matmul")
    c_inputs = make_inputs(case, case.shapes[0])
    f_inputs = make_inputs(case, case.shapes[0], layout="F")
    for a, b in zip(c_inputs, f_inputs):
        np.testing.assert_array_equal(a, b)
        assert b.flags.f_contiguous


PROGRAM_ORDER = tclang.Options(fusion="min", tile=(), reorder_reductions=False)


@pytest.mark.parametrize("L", [2, 3])
def test_program_order_reduction_over_a_where_range_and_a_where_local(L: int):
    """Fuzz program 262: a reduction in program order over j (a where range), k, l and m,
    all of extent 2, whose where-local x reads B(i + j, k). isl linearizes the reduction to
    8j + 4k + 2l + m and its AST generator then ran only the instances with l = 0, so the
    fuzzer's oracle (this very schedule) returned about half the sum."""
    source = """
def f(float(M) A, int32(L, M) B, float(L, M) W) -> (O) {
    O(i, n) +=! (x / (fabs(W(l, m)) + 1.0)) where j in 0:2, n in 0:L + 1,
        x = (A(k) / (fabs(float32(B(i + j, k))) + 1.0))
}
"""
    M = 2
    rng = np.random.default_rng(262)
    A = rng.uniform(0.5, 1.5, M).astype(np.float32)
    B = rng.integers(-3, 4, (L, M)).astype(np.int32)
    W = rng.uniform(-2.0, 2.0, (L, M)).astype(np.float32)
    x = np.stack([A / (np.abs(B[i:i + 2].astype(np.float32)) + 1.0)
                  for i in range(L - 1)])  # (i, j, k)
    total = x.sum(axis=(1, 2)) * (1.0 / (np.abs(W) + 1.0)).sum()
    expected = np.repeat(total[:, None], L + 1, axis=1)
    for options in (PROGRAM_ORDER, None):
        got = tclang.define(source, backend="reference", options=options).f(A, B, W)
        np.testing.assert_allclose(got, expected, rtol=1e-5)
