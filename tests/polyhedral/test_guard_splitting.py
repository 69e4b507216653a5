"""Guards out of innermost vector loops (polyhedral/guard_splitting.py): no branch stays in
a vector loop where a comparison can be unswitched or split away, and every statement
instance runs in the very order it ran before (the rewrite reorders nothing)."""

from __future__ import annotations

import pytest

import tclang as tc
from polyhedral import guard_splitting
from polyhedral import loop_ir as L
from polyhedral import pipeline
from polyhedral.guard_splitting import split_guards
from polyhedral.pipeline import schedule_definition
from tclang.lang.frontend import check_source
from tclang.target import Target

CPU = Target("cpu", "threads", cores=4, vector_bytes=32)
DEPTHWISE = """def dw(float(N,C,H,W) I, float(C,3,3) Wt) -> (O) {
  O(n,c,h,w) +=! (2*h+kh-1 >= 0 && 2*h+kh-1 < H && 2*w+kw-1 >= 0 && 2*w+kw-1 < W)
      ? I(n,c,2*h+kh-1,2*w+kw-1) * Wt(c,kh,kw) : 0.0
    where h in 0:(H+1)/2, w in 0:(W+1)/2, kh in 0:3, kw in 0:3
}"""
PREFIX = """def prefix(float(N,M) A) -> (O) {
  O(i,j) +=! (k <= j) ? A(i,k) : 0.0 where j in 0:M, k in 0:M
}"""
TRACE = "def trace(float(B,N,N) A) -> (T) { T(b) +=! A(b,i,i) }"
POOL = """def pool(float(N,C,H,W) I) -> (O) {
  O(n,c,h,w) max=! (h+kh-1 >= 0 && h+kh-1 < H && w+kw-1 >= 0 && w+kw-1 < W)
      ? I(n,c,h+kh-1,w+kw-1) : -3.0e38 where h in 0:H, w in 0:W, kh in 0:3, kw in 0:3
}"""


def instances(node: L.Node, env: dict) -> list[tuple]:
    """Every statement instance `node` runs, in order, with its index values."""
    out: list[tuple] = []

    def walk(n, env):
        match n:
            case L.Run(statement=s, indices=args):
                out.append((s, tuple(L.evaluate(a, env) for a in args)))
            case L.For(var=v, lo=lo, hi=hi, step=step, body=b):
                for value in range(L.evaluate(lo, env), L.evaluate(hi, env), step):
                    walk(b, {**env, v: value})
            case L.If(cond=c, then=t, other=o):
                if L.evaluate(c, env):
                    walk(t, env)
                elif o is not None:
                    walk(o, env)
            case L.Block(body=items):
                for item in items:
                    walk(item, env)
            case L.Scratch(body=b):
                walk(b, env)
    walk(node, env)
    return out


def guards_in_vector_loops(node: L.Node, inside: bool = False) -> list[L.IExpr]:
    match node:
        case L.For(body=b):
            return guards_in_vector_loops(b, inside or (node.vectorize and not node.unrolled))
        case L.If(cond=c, then=t, other=o):
            found = [c] if inside else []
            return found + guards_in_vector_loops(t, inside) + \
                (guards_in_vector_loops(o, inside) if o is not None else [])
        case L.Block(body=items):
            return [g for i in items for g in guards_in_vector_loops(i, inside)]
        case L.Scratch(body=b):
            return guards_in_vector_loops(b, inside)
    return []


def unsplit(source: str, sizes: dict, monkeypatch,
            options=tc.Options(fusion="preserve_parallel")) -> L.Kernel:
    """The kernel as scheduled before the guards are split (the pass switched off); the
    initialisation fused with the update, as isl's strategy alone puts it."""
    monkeypatch.setattr(pipeline, "split_guards", lambda kernel: kernel)
    defn = check_source(source).definitions[0]
    return schedule_definition(defn, sizes, options, CPU).kernel


@pytest.mark.parametrize("source, sizes", [
    (DEPTHWISE, dict(N=1, C=2, H=7, W=37)), (DEPTHWISE, dict(N=1, C=1, H=1, W=64)),
    (PREFIX, dict(N=17, M=131)), (TRACE, dict(B=37, N=5)), (POOL, dict(N=1, C=2, H=3, W=41)),
])
def test_split_guards_leave_no_branch_in_a_vector_loop_and_keep_the_order(
        source, sizes, monkeypatch):
    before = unsplit(source, sizes, monkeypatch)
    assert guards_in_vector_loops(before.body), "the fixture has no guard to split"
    after = split_guards(before)
    assert guards_in_vector_loops(after.body) == []
    assert instances(after.body, {}) == instances(before.body, {})


def test_a_shape_generic_kernel_splits_at_run_time_bounds(monkeypatch):
    before = unsplit(DEPTHWISE, None, monkeypatch)
    after = split_guards(before)
    assert guards_in_vector_loops(after.body) == []
    for sizes in (dict(N=1, C=1, H=1, W=1), dict(N=1, C=2, H=6, W=11)):
        env = dict(sizes, KH=3, KW=3)
        assert instances(after.body, env) == instances(before.body, env)


def _loop(body: L.Node, hi=L.Var("n")) -> L.For:
    return L.For("w", L.Int(0), hi, 1, body, parallel=True, vectorize=True)


def _run(name: str) -> L.Run:
    return L.Run(name, (L.Var("k"), L.Var("w")))


W, K = L.Var("w"), L.Var("k")
FIXTURES = {
    # w == k: three pieces (before, at, after)
    "equal": L.If(L.Op("eq", (W, K)), _run("S")),
    # 3 - 2w + k >= 0 (a coefficient of -2) or else another statement
    "strided": L.If(L.Op("ge", (L.Op("add", (L.Op("sub", (L.Int(3), L.Op("mul", (
        L.Int(2), W)))), K)), L.Int(0))), _run("S"), _run("T")),
    # an invariant test and one on w together: unswitched, then split
    "both": L.Block((L.If(L.Op("eq", (K, L.Int(0))), _run("I")),
                     L.If(L.Op("and", (L.Op("lt", (W, L.Op("add", (K, L.Int(2))))),
                                       L.Op("gt", (W, L.Int(1))))), _run("S")))),
}


def test_a_guarded_window_gets_its_initialisation_apart():
    """automatic_fusion: a padded window's reduction (the depthwise convolution, an
    average pool with its scaling after it) gets "min", its initialisation a nest of its
    own; a triangle's long reduction (the prefix sum) and an unguarded one keep isl's."""
    from tclang.lang.guarded_sums import restrict_guarded_sums
    from benchmarks.guarded_families import avg_pool

    def fusion(source, sizes):
        defn = check_source(source).definitions[0]
        defn = pipeline.scop_definition(defn, sizes, tc.Options(), [])
        return guard_splitting.automatic_fusion(defn, sizes)

    assert fusion(DEPTHWISE, dict(N=1, C=2, H=9, W=9)) == "min"
    assert fusion(DEPTHWISE, None) == "min"  # its window's extents are numbers
    assert fusion(avg_pool(2, 1, 3), dict(N=1, C=2, H=9, W=9)) == "min"
    assert fusion(PREFIX, dict(N=17, M=131)) == "preserve_parallel"
    assert fusion(TRACE, dict(B=4, N=5)) == "preserve_parallel"
    prefix = restrict_guarded_sums(check_source(PREFIX).definitions[0])
    assert prefix.statements[0].condition is not None  # guarded, but not a window
    kernel = schedule_definition(check_source(DEPTHWISE).definitions[0],
                                 dict(N=1, C=2, H=9, W=37), tc.Options(), CPU).kernel
    assert isinstance(kernel.body, L.Block) and len(kernel.body.body) == 2


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_hand_built_guards_split_in_order(name):
    kernel = L.For("k", L.Int(0), L.Int(4), 1, _loop(FIXTURES[name]))
    after = guard_splitting._walk(kernel)
    assert guards_in_vector_loops(after) == []
    for n in (0, 1, 2, 5, 9):
        assert instances(after, {"n": n}) == instances(kernel, {"n": n})


def test_a_guard_of_no_affine_form_stays():
    parity = L.If(L.Op("eq", (L.Op("rem", (W, L.Int(2))), L.Int(0))), _run("S"))
    kernel = _loop(parity)
    assert guard_splitting._walk(kernel) == kernel


def test_the_copies_of_one_loop_are_bounded():
    conds = [L.Op("eq", (K, L.Int(v))) for v in range(8)]
    body = L.Block(tuple(L.If(c, _run(f"S{v}")) for v, c in enumerate(conds)))
    after = guard_splitting._walk(L.For("k", L.Int(0), L.Int(9), 1, _loop(body)))
    loops = [n for n in _fors(after) if n.vectorize]
    assert len(loops) <= guard_splitting.MAX_COPIES


def _fors(node):
    match node:
        case L.For(body=b):
            return [node] + _fors(b)
        case L.If(then=t, other=o):
            return _fors(t) + (_fors(o) if o is not None else [])
        case L.Block(body=items):
            return [f for i in items for f in _fors(i)]
    return []
