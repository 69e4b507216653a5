"""Tensor contractions copied into a matrix product's layout before scheduling
(tclang/lang/passes/contraction_layouts.py): results against np.einsum on every backend,
and where the rewrite happens and where it must not."""

from __future__ import annotations

import numpy as np
import pytest

import tclang as tc
from backends.cuda.emulation import build
from polyhedral.pipeline import schedule_definition
from tclang.driver.compiler import compile_target
from tclang.lang.passes.contraction_layouts import CONTRACTION_LAYOUTS

BACKENDS = ["cpu", "reference"] + (["cuda-emulated"] if build.available() else [])

SPECS = [  # (einsum, extents, rewritten on the CPU): interleaved groups, several indices
    # per group, a batch; extents where the copies pay (each copied element feeds at least
    # MIN_WORK_PER_COPY multiply-adds), odd and prime; a batched matrix product, and
    # results in an order the sum cannot write directly, that keep their layouts
    ("uedql,vedl->quv", dict(d=5, e=3, l=2, q=7, u=4, v=41), True),
    ("bkjlp,bklq->bjpq", dict(b=2, j=3, p=5, k=7, l=2, q=37), True),
    ("abk,kcd->abcd", dict(a=3, b=1, c=5, d=7, k=17), False),  # already in layout
    ("spmu,qnp->unsmq", dict(m=3, n=2, p=64, q=29, s=4, u=3), False),
    ("lfub,fv->lvbu", dict(b=4, f=67, l=3, u=5, v=43), False),  # depth in order: packing
    ("tbwp,btucq->wucqp", dict(b=3, c=2, p=33, q=5, t=5, u=3, w=3), True),  # depth (t, b), (b, t)
    ("bhqd,bhkd->bqhk", dict(b=2, h=3, q=5, k=7, d=8), False),
]


def _source(spec: str, dtype: str) -> str:
    ins, out = spec.split("->")
    a, b = ins.split(",")
    dims = lambda idx: ", ".join(f"S{i.upper()}" for i in idx)  # noqa: E731
    return (f"def c({dtype}({dims(a)}) A, {dtype}({dims(b)}) B) -> (O) {{ "
            f"O({', '.join(out)}) +=! A({', '.join(a)}) * B({', '.join(b)}) }}")


def _operands(spec: str, extents: dict, dtype, seed: int = 0):
    rng = np.random.default_rng(seed)
    a, b = spec.split("->")[0].split(",")
    return tuple(rng.standard_normal([extents[i] for i in x]).astype(dtype) for x in (a, b))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("spec, extents, rewritten", SPECS)
def test_permuted_contractions_match_einsum(backend, spec, extents, rewritten):
    if backend == "cpu":
        text = _passes_text(_source(spec, "float"), extents)
        assert (CONTRACTION_LAYOUTS in text) == rewritten, text
    for dtype, rtol in (("float", 1e-4), ("double", 1e-12)):
        A, B = _operands(spec, extents, np.float32 if dtype == "float" else np.float64)
        got = tc.define(_source(spec, dtype), backend=backend).c(A, B)
        np.testing.assert_allclose(got, np.einsum(spec, A, B), rtol=rtol, atol=rtol)


@pytest.mark.parametrize("scale", [1, 3])
def test_odd_prime_and_size_one_extents(scale):
    spec = "uedql,vedl->quv"
    for extents in (dict(d=1, e=1, l=1, q=1, u=1, v=1), dict(d=7, e=2, l=3, q=13, u=1, v=17),
                    dict(d=3 * scale, e=5, l=2, q=2, u=3, v=31)):
        A, B = _operands(spec, extents, np.float32)
        np.testing.assert_allclose(tc.define(_source(spec, "float")).c(A, B),
                                   np.einsum(spec, A, B), rtol=1e-4, atol=1e-5)


def _passes_text(source: str, extents: dict, options=None) -> str:
    options = options or tc.Options()
    defn = tc.define(source).c.definition
    sizes = {f"S{k.upper()}": v for k, v in extents.items()}
    stages: dict[str, str] = {}
    schedule_definition(defn, sizes, options, compile_target("cpu", options), collect=stages)
    return stages["passes"]


def test_an_interleaved_contraction_is_copied_into_layout():
    spec, extents, _ = SPECS[0]
    text = _passes_text(_source(spec, "float"), extents)
    assert CONTRACTION_LAYOUTS in text
    assert "A_rows(q, u, e, d, l) = A(u, e, d, q, l)" in text  # rows, then depth
    assert "B_lanes(e, d, l, v) = B(v, e, d, l)" in text  # depth, then lanes
    assert "O(q, u, v) +=! A_rows(q, u, e, d, l) * B_lanes(e, d, l, v)" in text


@pytest.mark.parametrize("spec", ["mk,kn->mn", "km,kn->mn", "mk,nk->mn", "bmk,bkn->bmn",
                                  "bhqd,bhkd->bhqk", "nchw,mc->nmhw", "hli,lie->eh"])
def test_matrix_products_keep_their_layouts(spec):
    extents = {i: 16 for i in "bhmnkqdcwlie"}
    text = _passes_text(_source(spec, "float"), extents)
    assert CONTRACTION_LAYOUTS not in text


def test_the_order_written_keeps_its_layout():
    spec, extents, _ = SPECS[0]
    text = _passes_text(_source(spec, "float"), extents,
                        tc.Options(reorder_reductions=False))
    assert CONTRACTION_LAYOUTS not in text
