"""Guards out of innermost vector loops (CPU and the reference interpreter).

isl's AST generator puts a statement's guard where the loops around it cannot express it:
a reduction's initialisation fused with its update runs at the first reduction step only
(`if (kh == 0 && kw == 0) O = 0`), a padded or triangular window's update only where the
window lies inside the input (`if (2 * w + kw >= 1) O += ...`). Inside the innermost
vector loop such a branch stops LLVM's vectorizer (or makes it mask every lane): a
depthwise convolution ran 3.4x, a row prefix sum 5.9x slower than with the
initialisation in its own nest (issue 33).

This pass rewrites each innermost `vectorize` loop, with no reordering of any statement
instance, so no dependence can be broken:

- *unswitching*: a comparison in a guard that does not depend on the loop's variable is
  tested once, before the loop: `for w {if (c) A; B}` becomes
  `if (c) for w {A; B} else for w {B}`;
- *index-set splitting*: a comparison affine in the loop's variable, `a*w + r >= 0` (or
  `==`) with `r` invariant in the loop, holds on one interval of the iterations: the loop
  becomes two (or three) consecutive loops over the pieces, each without the test.

Each piece keeps the loop's marks (parallel, vectorize, reduction). A loop is copied at
most `MAX_COPIES` times (only copies with statements left count); comparisons past that,
and those of no affine form (`(x - kw) % 2 == 0`), stay as guards.
"""

from __future__ import annotations

from dataclasses import replace

from polyhedral import loop_ir as L

#: at most this many copies of one vector loop (non-empty ones) come out of the splits
MAX_COPIES = 16
COMPARISONS = ("lt", "le", "gt", "ge", "eq")
TRUE, FALSE = L.Int(1), L.Int(0)


#: a reduction index of at most this many values in a guard makes it a window (3x3)
WINDOW = 16


def automatic_fusion(definition, sizes=None) -> str:
    """The fusion strategy the automatic schedule asks isl for: "min" for a definition
    whose one reduction is a guarded *window* with `!` (its `condition`,
    tclang/lang/guarded_sums.py, names reduction indices of at most WINDOW values, all
    known: a padded or strided convolution or pool; assignments may follow, as an average
    pool's scaling after tclang/lang/reduction_scales.py), so its initialisation gets a
    nest of its own, else "preserve_parallel". Fused, the initialisation pinned the
    window's loops around a guarded update: a padded depthwise convolution, an average
    pool and a transposed convolution ran 10-50x slower than with `fusion="min"`
    (issue 33). A triangle's long reduction (a prefix sum) keeps isl's fusion: apart, its
    reduction got tiled into short sums, 1.2-3x slower. Only the statements and sizes
    decide, so the cache key still says it all."""
    from tclang.lang.affine import condition_indices
    sums = [s for s in definition.statements if s.is_reduction]
    if len(sums) != 1 or not sums[0].reset or sums[0].condition is None:
        return "preserve_parallel"
    st = sums[0]
    window = condition_indices(st.condition) & set(st.reduction_indices)
    try:
        short = window and all(st.range_of(i).extent.evaluate(sizes or {}) <= WINDOW
                               for i in window)
    except (KeyError, TypeError, ValueError):  # a size not known: not a window we know
        short = False
    return "min" if short else "preserve_parallel"


def split_guards(kernel: L.Kernel) -> L.Kernel:
    """The kernel with every innermost vector loop's guards unswitched or split away."""
    return replace(kernel, body=_walk(kernel.body))


def _walk(node: L.Node) -> L.Node:
    match node:
        case L.For() if _splittable(node):
            return _split_loop(node, MAX_COPIES)
        case L.For(body=body) | L.Scratch(body=body):
            return replace(node, body=_walk(body))
        case L.Block(body=items):
            return L.Block(tuple(_walk(i) for i in items))
        case L.If(cond=c, then=t, other=o):
            return L.If(c, _walk(t), _walk(o) if o is not None else None)
    return node


def _splittable(loop: L.For) -> bool:
    """An innermost vector loop of unit step, not a register tile's lane loop."""
    return (loop.vectorize and not loop.unrolled and loop.step == 1
            and not _has(loop.body, (L.For, L.Launch, L.TileContraction, L.Scratch)))


def _has(node: L.Node, kinds: tuple) -> bool:
    if isinstance(node, kinds):
        return True
    match node:
        case L.Block(body=items):
            return any(_has(i, kinds) for i in items)
        case L.If(then=t, other=o):
            return _has(t, kinds) or (o is not None and _has(o, kinds))
    return False


def _split_loop(loop: L.For, copies: int) -> L.Node | None:
    """`loop` with its first splittable comparison gone, the pieces split further within
    `copies`; None where nothing of it runs."""
    body = _simplify(loop.body)
    if body is None:
        return None
    loop = replace(loop, body=body)
    for atom in _atoms(body):
        pieces = _pieces(loop, atom)
        if pieces is None:
            continue
        kept = [p for p in pieces if p[1] is not None]
        if len(kept) > copies:
            continue
        share = max(1, copies // max(1, len(kept)))
        return _join([(guard, _split_loop(piece, share) if piece is not None else None)
                      for guard, piece in pieces])
    return loop


def _pieces(loop: L.For, atom: L.IExpr) -> list[tuple[L.IExpr | None, L.For | None]] | None:
    """(a guard outside the loop or None, the loop's piece with `atom` decided) for each
    piece the atom cuts the loop into, in the loops' order; None if it cuts nothing."""
    if not L.uses_var(atom, loop.var):  # unswitch: the test before the loop
        return [(atom, _assume(loop, atom, TRUE)), (_negate(atom), _assume(loop, atom, FALSE))]
    cut = _threshold(atom, loop.var)
    if cut is None:
        return None
    kind, t = cut  # kind "ge": holds from t on; "lt": below t; "eq": at t only
    points = [loop.lo] + [_clamp(p, loop.lo, loop.hi) for p in
                          ((t,) if kind != "eq" else (t, L.add(t, L.Int(1))))] + [loop.hi]
    truths = {"ge": (FALSE, TRUE), "lt": (TRUE, FALSE), "eq": (FALSE, TRUE, FALSE)}[kind]
    return [(None, _assume(replace(loop, lo=a, hi=b), atom, truth))
            for a, b, truth in zip(points, points[1:], truths)]


def _join(parts: list[tuple[L.IExpr | None, L.Node | None]]) -> L.Node | None:
    """Consecutive pieces as one node; an unswitched pair as `if (c) A else B`."""
    if parts and parts[0][0] is not None:  # unswitched: [(c, A), (not c, B)]
        (cond, then), (_, other) = parts
        if then is None and other is None:
            return None
        if then is None:
            return L.If(_negate(cond), other)
        return L.If(cond, then, other)
    nodes = tuple(n for _, n in parts if n is not None)
    return None if not nodes else nodes[0] if len(nodes) == 1 else L.Block(nodes)


def _assume(loop: L.For, atom: L.IExpr, truth: L.Int) -> L.For | None:
    """The loop with `atom` replaced by `truth` in its guards; None if nothing is left or
    its bounds are numbers that make it empty."""
    if isinstance(loop.lo, L.Int) and isinstance(loop.hi, L.Int) and \
            loop.lo.value >= loop.hi.value:
        return None
    body = _simplify(_decide(loop.body, atom, truth))
    return None if body is None else replace(loop, body=body)


def _decide(node: L.Node, atom: L.IExpr, truth: L.Int) -> L.Node:
    match node:
        case L.Block(body=items):
            return L.Block(tuple(_decide(i, atom, truth) for i in items))
        case L.If(cond=c, then=t, other=o):
            return L.If(_replace(c, atom, truth), _decide(t, atom, truth),
                        _decide(o, atom, truth) if o is not None else None)
    return node


def _replace(e: L.IExpr, atom: L.IExpr, truth: L.Int) -> L.IExpr:
    if e == atom:
        return truth
    if isinstance(e, L.Op) and e.op in ("and", "or", "not"):
        return L.Op(e.op, tuple(_replace(a, atom, truth) for a in e.args))
    return e


def _simplify(node: L.Node | None) -> L.Node | None:
    """Conditions folded where their comparisons were decided; empty parts dropped."""
    match node:
        case L.Block(body=items):
            kept = tuple(n for n in (_simplify(i) for i in items) if n is not None)
            return None if not kept else kept[0] if len(kept) == 1 else L.Block(kept)
        case L.If(cond=c, then=t, other=o):
            c = _fold(c)
            if isinstance(c, L.Int):
                return _simplify(t if c.value else o)
            t, o = _simplify(t), _simplify(o)
            if t is None and o is None:
                return None
            return L.If(_fold(L.Op("not", (c,))), o) if t is None else L.If(c, t, o)
    return node


def _fold(c: L.IExpr) -> L.IExpr:
    """and/or/not over decided comparisons (1 or 0) folded."""
    if not (isinstance(c, L.Op) and c.op in ("and", "or", "not")):
        return c
    args = tuple(_fold(a) for a in c.args)
    if c.op == "not":
        (a,) = args
        if isinstance(a, L.Int):
            return FALSE if a.value else TRUE
        return a.args[0] if isinstance(a, L.Op) and a.op == "not" else L.Op("not", args)
    absorbing, neutral = (FALSE, TRUE) if c.op == "and" else (TRUE, FALSE)
    if absorbing in args:
        return absorbing
    rest = tuple(a for a in args if a != neutral)
    return neutral if not rest else rest[0] if len(rest) == 1 else L.Op(c.op, rest)


def _atoms(node: L.Node) -> list[L.IExpr]:
    """The comparisons of every guard in `node`, invariant ones (unswitched) first."""
    found: list[L.IExpr] = []

    def conds(n: L.Node) -> None:
        match n:
            case L.Block(body=items):
                for i in items:
                    conds(i)
            case L.If(cond=c, then=t, other=o):
                comparisons(c)
                conds(t)
                if o is not None:
                    conds(o)

    def comparisons(e: L.IExpr) -> None:
        if isinstance(e, L.Op) and e.op in ("and", "or", "not"):
            for a in e.args:
                comparisons(a)
        elif isinstance(e, L.Op) and e.op in COMPARISONS and e not in found:
            found.append(e)

    conds(node)
    return found


def _negate(atom: L.IExpr) -> L.IExpr:
    return L.Op("not", (atom,))


def _clamp(p: L.IExpr, lo: L.IExpr, hi: L.IExpr) -> L.IExpr:
    """min(max(p, lo), hi), folded where the operands are numbers."""
    def bound(op: str, a: L.IExpr, b: L.IExpr) -> L.IExpr:
        if isinstance(a, L.Int) and isinstance(b, L.Int):
            return L.Int(max(a.value, b.value) if op == "max" else min(a.value, b.value))
        return a if a == b else L.Op(op, (a, b))
    return bound("min", bound("max", p, lo), hi)


def _threshold(atom: L.Op, var: str) -> tuple[str, L.IExpr] | None:
    """Where the comparison holds along `var`: ("ge", t) from t on, ("lt", t) below t,
    ("eq", t) at t only; None where it is not affine in `var` with the rest invariant."""
    lhs, rhs = atom.args
    diff = _linear(L.sub(lhs, rhs), var)
    if diff is None:
        return None
    a, r = diff  # the comparison is between a*var + r and 0
    if a == 0:
        return None
    if atom.op == "eq":
        if abs(a) != 1:
            return None
        return "eq", (_neg(r) if a == 1 else r)
    if atom.op in ("gt", "lt"):  # a*v + r > 0  <=>  a*v + r - 1 >= 0
        r = L.sub(r, L.Int(1)) if atom.op == "gt" else L.add(r, L.Int(1))
    if atom.op in ("lt", "le"):  # a*v + r <= 0  <=>  -a*v - r >= 0
        a, r = -a, _neg(r)
    if a > 0:  # v >= ceil(-r / a) = -floor(r / a)
        return "ge", _neg(r if a == 1 else L.Op("floordiv", (r, L.Int(a))))
    # r - b*v >= 0  <=>  v <= floor(r / b)  <=>  v < floor(r / b) + 1
    return "lt", L.add(r if a == -1 else L.Op("floordiv", (r, L.Int(-a))), L.Int(1))


def _neg(e: L.IExpr) -> L.IExpr:
    return L.Int(-e.value) if isinstance(e, L.Int) else L.Op("neg", (e,))


def _linear(e: L.IExpr, var: str) -> tuple[int, L.IExpr] | None:
    """(a, r) with e = a*var + r and r free of var; None where e is not of that form."""
    if not L.uses_var(e, var):
        return 0, e
    match e:
        case L.Var():
            return 1, L.Int(0)
        case L.Op(op="add" | "sub", args=(x, y)):
            lx, ly = _linear(x, var), _linear(y, var)
            if lx is None or ly is None:
                return None
            if e.op == "add":
                return lx[0] + ly[0], L.add(lx[1], ly[1])
            return lx[0] - ly[0], L.sub(lx[1], ly[1])
        case L.Op(op="neg", args=(x,)):
            lx = _linear(x, var)
            return None if lx is None else (-lx[0], _neg(lx[1]))
        case L.Op(op="mul", args=(x, y)):
            k, other = (x, y) if isinstance(x, L.Int) else (y, x)
            lo = _linear(other, var)
            if not isinstance(k, L.Int) or lo is None:
                return None
            r = L.Int(k.value * lo[1].value) if isinstance(lo[1], L.Int) else \
                L.Op("mul", (k, lo[1]))
            return k.value * lo[0], r
    return None
