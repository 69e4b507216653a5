"""The loop IR's subscripts: every read's quasi-affine forms lowered to index expressions
over the statement's index variables and the sizes (polyhedral/subscripts.py), so that no
`Affine` or `SizeExpr` reaches a backend, and the lowered IR survives the disk cache's JSON."""

import dataclasses
import itertools

import numpy as np
import pytest

import tclang as tc
from polyhedral import loop_ir as L
from polyhedral.loop_serial import FORMAT, kernel_from_json, kernel_to_json
from polyhedral.pipeline import schedule_definition
from polyhedral.subscripts import affine_index
from tclang.lang import affine as A
from tclang.lang import program as P
from tclang.lang import sizes as Z
from tclang.lang.frontend import check_source
from tclang.target import Target

CPU = Target("cpu", "threads", cores=4, vector_bytes=32)

PROGRAMS = {
    "strided": ("def strided(float(N, H) I, float(KH) W) -> (O) {"
                " O(n, h) +=! I(n, 2*h + kh) * W(kh) where h in 0:(H - KH) / 2 }",
                dict(N=3, H=17, KH=3)),
    "divmod": ("def divmod(float(N, H) I) -> (O) {"
               " O(n, h) = I(n, (h + 1) / 3) + I(n, (h + 2) % 5) where h in 0:H - 1 }",
               dict(N=3, H=16)),
    "padded": ("def padded(float(N) I) -> (O) {"
               " O(i) = (i >= 1 && i <= N) ? I(i - 1) : 0 where i in 0:N + 2 }", dict(N=10)),
    "gather": ("def gather(float(V, D) LUT, int32(B) Ids) -> (O) { O(b, d) = LUT(Ids(b), d) }",
               dict(V=7, D=5, B=3)),
    "shifted": ("def shifted(float(N, M) X) -> (Y) { Y(i, j) = X(N - 1 - i, j) }",
                dict(N=6, M=4)),
}
SYMBOLIC = (A.Affine, A.Div, A.Compare, A.Logic, A.Truth, Z.SizeExpr)


def kernel(name, specialized, target=CPU):
    source, sizes = PROGRAMS[name]
    return schedule_definition(check_source(source).definitions[0],
                               sizes if specialized else None, tc.Options(), target).kernel


def values(x):
    """Every value reachable from `x` through dataclass fields and tuples."""
    stack = [x]
    while stack:
        v = stack.pop()
        yield v
        if dataclasses.is_dataclass(v) and not isinstance(v, type):
            stack.extend(getattr(v, f.name) for f in dataclasses.fields(v))
        elif isinstance(v, tuple):
            stack.extend(v)


@pytest.mark.parametrize("specialized", [True, False], ids=["specialized", "generic"])
@pytest.mark.parametrize("name", sorted(PROGRAMS))
@pytest.mark.parametrize("target", [CPU, Target("cuda-emulated", "grid")], ids=["cpu", "gpu"])
def test_the_loop_ir_holds_no_symbolic_forms(name, specialized, target):
    k = kernel(name, specialized, target)
    found = [v for v in values(k) if isinstance(v, SYMBOLIC)]
    assert not found, found[:3]
    for s in k.statements:
        for read in P.reads_of(s.value):
            assert read.guard is None
            for form in read.affine:
                if form is None:
                    continue
                indices = {L.index_name(v) for v in L.variables(form)} - {None}
                assert indices <= set(s.indices), (s.id, form)
                sizes = {v for v in L.variables(form) if L.index_name(v) is None}
                assert not sizes if specialized else sizes <= set(k.sizes), (s.id, form)


@pytest.mark.parametrize("specialized", [True, False], ids=["specialized", "generic"])
@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_the_loop_ir_round_trips_through_json(name, specialized):
    k = kernel(name, specialized)
    assert kernel_from_json(kernel_to_json(k)) == k


def test_a_loop_ir_of_another_format_is_refused():
    blob = kernel_to_json(kernel("shifted", True))
    old = blob.replace(f'"format":{FORMAT}'.encode(), b'"format":1')
    assert old != blob
    with pytest.raises(ValueError, match="format"):
        kernel_from_json(old)


def test_a_lowered_subscript_means_what_its_affine_form_meant():
    i, j = A.Affine.index("i"), A.Affine.index("j")
    n = A.Affine.of_size(Z.size("N"))
    forms = [i.scale(2) + j - n, (i + j.scale(3)).floordiv(4), (i - j).mod(3).scale(-2) + n,
             (i.floordiv(2) + j).mod(5) + A.Affine.of_size(Z.floordiv(Z.size("N") - 1, 2))]
    for form, (vi, vj, vn) in itertools.product(forms, itertools.product(range(-7, 8, 3),
                                                                         range(-5, 6, 2),
                                                                         (1, 4, 9))):
        env = {"i": vi, "j": vj, "N": vn}
        bound = {L.index_var("i").name: vi, L.index_var("j").name: vj, "N": vn}
        assert L.evaluate(affine_index(form, None), bound) == form.evaluate(env), form
        assert L.evaluate(affine_index(form, {"N": vn}), bound) == form.evaluate(env), form


@pytest.mark.parametrize("backend", ["cpu", "reference", "cuda-emulated"])
def test_statement_indices_named_like_loop_variables(backend):
    """isl names its loops c0, c1, ...: a statement whose indices have those names reads
    the right elements (its index variables are `$c0`... in the subscripts)."""
    if backend == "cuda-emulated":
        from backends.cuda.emulation.build import available
        if not available():
            pytest.skip("the emulation needs g++")
    mod = tc.define("def mm(float(M,K) A, float(K,N) B) -> (C) {"
                    " C(c1, c0) +=! A(c1, K - 1 - c2) * B(K - 1 - c2, c0) }",
                    backend=backend)
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    b = np.arange(20, dtype=np.float32).reshape(4, 5) - 7
    np.testing.assert_allclose(mod.mm(a, b), a @ b, rtol=1e-6)
