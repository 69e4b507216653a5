"""Reverse mode on a checked definition: the adjoint comprehensions, as source text.

The backward of a definition is another definition, written in the language and checked
and compiled like any other (so it is scheduled, fused and cached by the same pipeline).
Statements are visited last to first. For statement k, which writes `T(I) op= e` over the
box of its indices, the gradient arriving at T (`dT`, complete by then: every statement that
reads this value of T comes later) is sent to each tensor element `e` reads:

    dX(s) += dT(I) * de/dX(s)      summed over every index of the statement

- `+=!` spreads dT over the reduction indices; `=` passes it on pointwise.
- `max=!` / `min=!` route it to the elements equal to the result, split evenly between
  ties (a count of ties is computed first: the subgradient torch.amax uses).
- Where X's subscripts are not distinct plain indices covering X (`I(n, c, 2*h + kh, ...)`,
  `I(i - 1)`, `X(i, i)`), the scatter is written as a gather: each subscript gets a new
  index over X's extent, one index of the statement is solved for (h = (y - kh) / 2, with
  `(y - kh) % 2 == 0` and h's range as guards), and the rest stay reduction indices. The
  solved index is the one the statement writes along where there is a choice, so the
  gather sums over the window, not over the output (transposed convolution, not a dense
  product). A gather subscript (`LUT(Ids(b, l), d)`) makes the gradient a scatter-add
  (`dLUT(Ids(b, l), d) += dY(b, l, d)`, after `dLUT = 0`): time proportional to the
  lookups, not to the table. The gradient of a scatter-add (`H(Ids(i)) += X(i)`) is a
  gather of dH (`dX(i) +=! dH(Ids(i))`); that of a scatter by max= or min= a gather routed
  as a max=! reduction's, the ties counted by a scatter-add (_scatter_ties). Without `!`
  (and a reduction without reset onto a whole value written before) the value before is
  one more candidate.
- A tensor written several times has one value per write. The backward reads the values it
  needs as they were when read; values that are not the final ones are saved by the
  forward (an extra output), as PyTorch saves activations. Nothing is recomputed.

The derivative expressions come from derivatives.py; everything here is about indices,
versions and names. `NotDifferentiable` becomes a `TCGradError` naming the statement.
"""

from __future__ import annotations

import itertools
import random
import re
from dataclasses import dataclass, field, replace

from tclang.lang import program as P
from tclang.lang import sizes as Z
from tclang.lang.affine import Affine
from tclang.autodiff import derivatives as D
from tclang.autodiff.source_text import Raw, source
from tclang.autodiff.source_text import affine_level as _affine_level
from tclang.autodiff.source_text import affine_text as _affine_text
from tclang.dtypes import DType
from tclang.autodiff import scans
from tclang.errors import TCGradError, TCSemanticError, TCZeroGradientError
from tclang.lang.passes.rewrite import rewrite_bottom_up
from tclang.lang.program_text import type_name


@dataclass(frozen=True)
class Saved:
    """A value the backward reads besides the inputs: a forward output, or a value the
    training forward writes as an extra output (`name`), with its shape in the sizes."""

    name: str
    dtype: DType
    shape: tuple[Z.SizeExpr, ...]
    is_output: bool


@dataclass(frozen=True)
class GradientSource:
    """The two definitions a gradient runs (docs/autodiff.md).

    `forward`: the definition with the saved values as extra outputs, named `forward_name`
    (the original text when nothing beyond the outputs is saved). `backward`: inputs, then
    `saved`, then the gradients of `seeds` (outputs), -> the gradients of `wrt`, in order.
    `added_sizes` maps each size name the backward adds to the forward size expression it
    stands for (the output gradients' shapes are checked before the backward runs).
    """

    forward: str
    forward_name: str
    backward: str
    backward_name: str
    wrt: tuple[str, ...]
    saved: tuple[Saved, ...]
    seeds: tuple[str, ...]
    seed_names: tuple[str, ...]
    grad_names: tuple[str, ...]
    added_sizes: dict[str, Z.SizeExpr] = field(default_factory=dict)
    # the inputs of `wrt` whose gradient is zero by construction: no output depends on
    # them through anything differentiable (only through a condition, or not at all)
    zero: tuple[str, ...] = ()


# ---- versions ------------------------------------------------------------------------------

@dataclass
class _Version:
    label: str
    tensor: str
    writer: int | None  # the statement that made it; None for an input
    dtype: DType
    extent: tuple[Z.SizeExpr, ...]
    final: bool = False


def _label(tensor: str, writer: int | None) -> str:
    return f"{tensor}@{'in' if writer is None else writer}"


def _adjoint_label(label: str) -> str:
    return f"d:{label}"


def _rename_reads(e: P.Expr, labels: dict[str, str]) -> P.Expr:
    """Every read of `e` (those in subscripts too) of a tensor in `labels` renamed."""
    def go(x: P.Expr) -> P.Expr:
        new = P.with_children(x, tuple(go(k) for k in P.children(x)))
        if isinstance(new, P.Read) and new.tensor in labels:
            new = replace(new, tensor=labels[new.tensor])
        return new
    return go(e)


def _value_reads(e: P.Expr) -> list[P.Read]:
    """The reads whose values `e` computes with (not those that only make a subscript)."""
    out, stack = [], [e]
    while stack:
        x = stack.pop()
        if isinstance(x, P.Read):
            out.append(x)
            continue
        stack.extend(P.children(x))
    return out


# ---- backward statements -----------------------------------------------------------------

@dataclass
class _Emitted:
    """One backward statement before naming: `target(lhs) op expr`, its intended ranges."""

    target: str  # a label
    lhs: tuple[str, ...]
    expr: P.Expr
    index_text: dict[str, tuple[str, int]]  # solved indices as text (source_text.source)
    ranges: dict[str, tuple[Z.SizeExpr, Z.SizeExpr]]  # every index of the statement
    always_where: frozenset[str]  # indices no read bounds: always given a where clause
    reduces: bool
    override: tuple | None = None  # (label, subscripts): printed as target's lhs read
    op: str = ""
    comment: str = ""
    # a scatter-add (the gradient of a gather): per target dimension, the gathered
    # subscript printed instead of `lhs`'s name there, or None; () for no scatter
    scatter: tuple[P.Expr | None, ...] = ()


def build(defn: P.Definition, wrt: tuple[str, ...] | None) -> GradientSource:
    try:
        return _Builder(defn, wrt).run()
    except TCGradError as err:
        raise err.with_source(defn.source) from None


def _range_bounds(s: P.Statement, sigma: dict[str, Affine],
                  of: tuple[str, ...] | None = None) -> list[tuple[str, str]]:
    """The bounds of statement s's `where j in lo:hi` ranges that use other indices, as
    (condition, its negation) texts with solved indices substituted (`sigma`): the
    backward runs over the hull of such a range (its domain) under these conditions, as
    the forward does (range inference adds them to the statement's condition). `of`:
    only the ranges of these indices."""
    out = []
    for name, lo, hi in s.affine_ranges:
        if of is not None and name not in of:
            continue
        index = _affine_text(_substitute(Affine.index(name), sigma))
        if lo.terms:
            bound = _affine_text(_substitute(lo, sigma))
            out.append((f"{index} >= {bound}", f"{index} < {bound}"))
        if hi.terms:
            bound = _affine_text(_substitute(hi, sigma))
            out.append((f"{index} < {bound}", f"{index} >= {bound}"))
    return out


class _Builder:
    def __init__(self, defn: P.Definition, wrt):
        self.defn = defn
        floats = tuple(t.name for t in defn.inputs if t.dtype.is_float)
        if wrt is None:
            wrt = floats
        elif isinstance(wrt, str):
            wrt = (wrt,)
        for name in wrt:
            t = defn.tensors.get(name)
            if t is None or t.role != "input":
                raise TCGradError(f"{name!r} is not an input of {defn.name}; gradients are "
                                  f"taken with respect to inputs ({', '.join(floats) or 'none'})",
                                  defn.span, hint="pass wrt= some of the inputs")
            if not t.dtype.is_float:
                raise TCGradError(f"{name} is {t.dtype.value}: only floating-point inputs have "
                                  "gradients", t.span, hint="leave it out of wrt=")
        if not wrt:
            raise TCGradError(f"{defn.name} has no floating-point input to differentiate "
                              "with respect to", defn.span)
        self.wrt = tuple(wrt)
        self.taken = set(defn.tensors) | set(defn.sizes) | {
            i for s in defn.statements for i in s.all_indices}
        self.emitted: list[_Emitted] = []
        self.written: set[str] = set()  # adjoint labels with a statement already
        # size names the backward adds, each standing for a forward size expression
        # (GradientSource.added_sizes); `named_extents` those statements were written with
        self.added: dict[str, Z.SizeExpr] = {}
        self.named_extents: set[str] = set()

    def named(self, e: Z.SizeExpr) -> Z.SizeExpr:
        """`e` as the size name a statement already runs over in its place (`size_name`),
        so a guard against it and a tensor of that extent read the same name."""
        for known in self.named_extents:
            if (self.added[known] - e).constant == 0:
                return Z.size(known)
        return e

    def size_name(self, e: Z.SizeExpr) -> Z.SizeExpr:
        """The size name the backward's header gives `e` (added where it is new), or `e`
        itself where it is already a polynomial in the sizes. A reverse scan runs over its
        target's inferred extent, which may hold a max, min or floor division
        (`max(0, N - 2) + 1` for `O(i - 1) ... X(i + 1)`), and a where range must be affine in
        the sizes: the added name is (the header binds it through the target's shape)."""
        if isinstance(e, Z.Poly):
            return e
        name = self.added_name(e)
        self.named_extents.add(name)
        return Z.size(name)

    def added_name(self, e: Z.SizeExpr) -> str:
        """The size name the backward adds for forward size expression `e` (one already
        added for an equal expression, else a new one)."""
        for known, expr in self.added.items():
            if (expr - e).constant == 0:
                return known
        name = self.fresh(f"S{len(self.added)}")
        self.added[name] = e
        return name

    def range_bounds(self, s: P.Statement, sigma: dict[str, Affine]) -> list[str]:
        """Statement s's bounds of ranges that use other indices, solved indices
        substituted (`_range_bounds`), as conditions (for tclang/autodiff/scans.py)."""
        return [c for c, _ in _range_bounds(s, sigma)]

    # -- naming
    def fresh(self, base: str) -> str:
        name = base
        for n in itertools.count(2):
            if name not in self.taken:
                break
            name = f"{base}{n}"
        self.taken.add(name)
        return name

    # -- the pass
    def run(self) -> GradientSource:
        self._versions()
        self._activity()
        seeds = self._seeds()
        for k in reversed(range(len(self.defn.statements))):
            self._statement(k)
        return self._assemble(seeds)

    def _versions(self) -> None:
        defn = self.defn
        self.versions: dict[str, _Version] = {}
        current: dict[str, str] = {}
        for t in defn.inputs:
            label = _label(t.name, None)
            self.versions[label] = _Version(label, t.name, None, t.dtype, t.shape, final=True)
            current[t.name] = label
        self.seen_by: list[dict[str, str]] = []  # per statement: tensor -> label it reads
        self.made: list[str] = []  # per statement: the label it writes
        self.before: list[str | None] = []  # per statement: the target's label before it
        extents: dict[str, tuple[Z.SizeExpr, ...]] = {}
        for k, s in enumerate(defn.statements):
            self.seen_by.append(dict(current))
            his = tuple(s.range_of(i).hi for i in s.indices) if not s.is_scatter else \
                defn.tensor(s.target).shape  # any element (tclang/lang/scatters.py)
            old = extents.get(s.target)
            extents[s.target] = his if old is None else tuple(
                Z.maximum(a, b) for a, b in zip(old, his))
            label = _label(s.target, k)
            self.before.append(current.get(s.target))
            self.versions[label] = _Version(label, s.target, k, defn.tensor(s.target).dtype,
                                            extents[s.target])
            current[s.target] = label
            self.made.append(label)
        for label in current.values():
            self.versions[label].final = True
        self.final_label = current
        self.rhs = [scans.own_reads(s, _rename_reads(s.rhs, self.seen_by[k]), self.made[k],
                                    self.before[k])
                    for k, s in enumerate(defn.statements)]

    def _activity(self) -> None:
        self.active = {_label(x, None) for x in self.wrt}
        for k, s in enumerate(self.defn.statements):
            reads = {r.tensor for r in _value_reads(self.rhs[k])}
            if reads & self.active or (not s.reset and s.op != "=" and
                                       self.before[k] in self.active):
                self.active.add(self.made[k])

    def _indices_of(self, label: str) -> tuple[str, ...]:
        if label not in self._index_names:
            self._index_names[label] = tuple(
                self.fresh(f"i{d}") for d in range(len(self.versions[label].extent)))
        return self._index_names[label]

    def _seeds(self) -> list[str]:
        seeds = []
        self.seed_label: dict[str, str] = {}
        self._index_names: dict[str, tuple[str, ...]] = {}
        for out in self.defn.outputs:
            label = self.final_label[out.name]
            if label not in self.active:
                continue
            if not out.dtype.is_float:
                k = self.versions[label].writer
                raise self._error(k, f"it writes {out.dtype.value} output {out.name} from "
                                  f"{self._wrt_text()}: an integer or bool result has no "
                                  "gradient")
            seeds.append(out.name)
            if any(r.tensor == label for rhs in self.rhs for r in _value_reads(rhs)):
                # later statements read it too: their gradients add to the caller's
                self.seed_label[out.name] = f"seed:{label}"
                self._emit(_adjoint_label(label), self._indices_of(label),
                           _read(f"seed:{label}", self._indices_of(label),
                                 self.versions[label].dtype, out.span),
                           {}, {i: (Z.const(0), e) for i, e in
                                zip(self._indices_of(label), self.versions[label].extent)},
                           frozenset(self._indices_of(label)), False)
            else:
                self.seed_label[out.name] = _adjoint_label(label)
                self.written.add(_adjoint_label(label))
        if not seeds:
            raise TCZeroGradientError(f"no output of {self.defn.name} depends on "
                              f"{self._wrt_text()}", self.defn.span,
                              hint="check wrt=: the gradient would be zero")
        return seeds

    def _wrt_text(self) -> str:
        return ", ".join(self.wrt)

    def _error(self, k: int, why: str) -> TCGradError:
        s = self.defn.statements[k]
        return TCGradError(f"cannot differentiate statement {k + 1} ({s.text.strip()}): {why}",
                           s.span, hint="write it with differentiable operations, or leave "
                                        "the inputs it depends on out of wrt=")

    # -- one forward statement, backwards
    def _statement(self, k: int) -> None:
        s = self.defn.statements[k]
        made = self.made[k]
        grad = _adjoint_label(made)
        if grad not in self.written:
            return  # nothing downstream needs this value's gradient
        version = self.versions[made]
        g = _read(grad, s.indices, version.dtype, s.span)
        if s.is_scatter:
            g = self._gathered_gradient(k, grad, version.dtype)
        rhs = self.rhs[k]
        if scans.recurrent(rhs, made):  # the gradient along the chain: a reverse scan
            g = scans.reverse_scan(self, k, rhs, grad, version)
        routed = False  # a scatter by max=/min= routes the old value's gradient itself
        if s.op == "=" or s.op == "+" or \
                (s.op == "*" and s.reset and not s.reduction_indices and not s.is_scatter):
            weight: P.Expr = g  # (`T(i) *=! e` over no index: the product of e alone)
        elif s.is_scatter and s.op in ("max", "min"):
            weight = self._scatter_ties(k, rhs, g)
            routed = True
        elif s.op in ("max", "min") and s.reset:
            weight = self._ties(k, rhs, g)
        elif s.op in ("max", "min") and (self._onto(k) or self._from_zeros(k)):
            self._pass_outside(k, grad)
            weight = self._ties(k, rhs, g, old=self.before[k], from_zeros=self._from_zeros(k))
            routed = True
        elif self._scales(k):
            weight = self._scaled(k, rhs, g, grad)
            routed = True
        elif s.op == "*" and not s.is_scatter and (s.reset or self._onto(k)):
            if not s.reset:
                self._pass_outside(k, grad)
            weight = self._product(k, rhs, g, old=None if s.reset else self.before[k])
            routed = not s.reset
        elif s.op == "*" and self._from_zeros(k):
            weight, routed = None, True  # a product from zero is zero: no gradient
        else:
            what = {"*": "*= without reset", "max": "max= without reset",
                    "min": "min= without reset"}.get(s.op, s.op)
            if s.op in ("max", "min", "*"):
                what += (" onto part of a value written before, or onto none (it starts "
                         "from zeros),")
            raise self._error(k, f"{what} has no gradient rule")
        before = self.before[k]
        if before is not None and before in self.active and not routed:
            if s.op == "+" and not s.reset and scans.recurrent(rhs, made):
                # `O(i) += .. O(k) ..` onto a value: where the statement writes, the value
                # before gets the whole gradient of the point (the scan's), not only what
                # arrived from later statements (dO alone was wrong by 0.07-0.9; found by
                # its test); elsewhere dO, which the scan does not reach where the
                # statement has no point at all
                self._pass_through(k, before, grad, overwrites=True)
                inside = _guarded([c for c, _ in _range_bounds(s, {}, s.indices)], g)
                self._emit(_adjoint_label(before), s.indices, inside, {},
                           {i: (s.range_of(i).lo, s.range_of(i).hi) for i in s.indices},
                           frozenset(), False)
            else:
                self._pass_through(k, before, grad)
        groups: dict[tuple, P.Read] = {}
        for r in _value_reads(rhs):
            if r.tensor in self.active and self.versions[r.tensor].dtype.is_float and \
                    r.tensor != made:
                groups.setdefault((r.tensor, r.subscripts), r)
        for (label, subs), read in groups.items():
            try:
                partial = D.derivative(rhs, lambda x: x.tensor == label and
                                       x.subscripts == subs)
            except D.NotDifferentiable as why:
                raise self._error(k, why.reason) from None
            contribution = D.mul(weight, partial)
            if contribution is None:
                continue
            self._scatter(k, read, contribution, weight)

    def _gathered_gradient(self, k: int, grad: str, dtype: DType) -> P.Read:
        """The gradient arriving at each update of scatter k: dT read where the update
        landed, `dH(Ids(i))` for `H(Ids(i)) += e` (a gather, bounds-checked like any)."""
        s = self.defn.statements[k]
        subs = tuple(_rename_reads(e, self.seen_by[k]) for e in s.scatter)
        forms = tuple(Affine.index(e.name) if type(e) is P.IndexValue else None for e in subs)
        return P.Read(grad, subs, forms, None, 0, dtype, s.span)

    def _scales(self, k: int) -> bool:
        """Whether statement k is `T(i) *= e` with no reduction index, onto a value written
        before: each point of T is multiplied once, by its own factor (a scale in place,
        not a product over anything), so the product rule is its gradient."""
        s = self.defn.statements[k]
        return (s.op == "*" and not s.reset and not s.reduction_indices and not s.is_scatter
                and not s.exists and s.condition is None and self.before[k] is not None
                and not scans.recurrent(self.rhs[k], self.made[k]))

    def _scaled(self, k: int, rhs: P.Expr, g: P.Read, grad: str) -> P.Expr:
        """`T(i) *= e` (_scales): T's new value is old(i) * e(i). The old value's gradient
        is dT * e where the statement runs and dT elsewhere; the weight of e's reads is
        dT * old(i)."""
        s = self.defn.statements[k]
        old = self.before[k]
        version = self.versions[old]
        if old in self.active:
            self._pass_through(k, old, grad, overwrites=True)  # dT where it does not run
            inside = _guarded([c for c, _ in _range_bounds(s, {})], D.mul(g, rhs))
            if inside is not None:
                self._emit(_adjoint_label(old), s.indices, inside, {},
                           {r.name: (r.lo, r.hi) for r in s.domain}, frozenset(), False)
        return D.mul(g, _read(old, s.indices, version.dtype, s.span))

    def _product(self, k: int, rhs: P.Expr, g: P.Read, old: str | None,
                 share_old: bool = True) -> P.Expr:
        """`T(I) *=! e(I, R)`: the gradient reaching factor e(I, R) is dT times the product
        of the other factors. Not T / e, which is 0 / 0 where a factor is zero: two
        statements count the zero factors and multiply the others,
            zeros_T(I) +=! e == 0 ? 1 : 0      nonzero_T(I) *=! e == 0 ? 1 : e
        and the weight is `zeros == 0 ? nonzero / e : (zeros == 1 && e == 0 ? nonzero :
        0)` (PyTorch's prod backward decides the same three cases). Linear in the
        reduction, exact where factors vanish, and made of a product reduction again, so
        the second order takes the same rule. `old`: `T(I) *= e` onto a value written
        before (_onto), one more factor that starts both, and gets its share unless
        `share_old` is False (a recurrence's reverse scan, whose `g` is not dT)."""
        s = self.defn.statements[k]
        made = self.made[k]
        version = self.versions[made]
        t = version.dtype.compute
        factor = self._candidate(k, rhs)
        points = {i: (s.range_of(i).lo, s.range_of(i).hi) for i in s.indices}
        ranges = {r.name: (r.lo, r.hi) for r in s.domain}
        bounds = [c for c, _ in _range_bounds(s, {})]
        zeros, rest = f"zeros:{made}", f"nonzero:{made}"
        counted_already = zeros in self.versions  # (by a recurrence's reverse scan)
        for label, name in ((zeros, "zeros"), (rest, "nonzero")):
            self.versions[label] = _Version(label, f"{name}_{s.target}", None, t,
                                            version.extent)
        one, none = D.const(1, t), D.const(0, t)

        def counted(x: P.Expr) -> tuple[P.Expr, P.Expr]:
            vanishes = D.compare("eq", x, D.const(0, x.dtype))
            return (D.select(vanishes, one, none, t),
                    D.select(vanishes, one, x if x.dtype is t else P.Cast(x, t), t))

        comment = f"# the zero factors of statement {k + 1}'s product, and the others'"
        op = "+=!"
        if counted_already:
            pass
        elif old is not None:
            before = _read(old, s.indices, self.versions[old].dtype, s.span)
            first_zero, first_rest = counted(before)
            self.emitted.append(_Emitted(zeros, s.indices, first_zero, {}, points,
                                         frozenset(points), False, op="=", comment=comment))
            self.emitted.append(_Emitted(rest, s.indices, first_rest, {}, points,
                                         frozenset(points), False, op="="))
            op, comment = "+=", ""
        zero, other = counted(factor)
        if bounds:  # outside a range bounded by other indices: no factor
            guard = Raw(" && ".join(bounds), 2 if len(bounds) > 1 else 3)
            zero, other = D.select(guard, zero, None, t), D.select(guard, other, one, t)
        if not counted_already:
            self.emitted.append(_Emitted(zeros, s.indices, zero, {}, ranges,
                                         frozenset(ranges), True, op=op, comment=comment))
            self.emitted.append(_Emitted(rest, s.indices, other, {}, ranges,
                                         frozenset(ranges), True,
                                         op="*=!" if old is None else "*="))
        count = _read(zeros, s.indices, t, s.span)
        others = _read(rest, s.indices, t, s.span)

        def weight(x: P.Expr) -> P.Expr:
            alone = D.select(D.compare("eq", count, D.const(1, t)), others, None, t)
            return D.mul(g, D.select(D.compare("eq", count, none), D.div(others, x),
                                     D.select(D.compare("eq", x, D.const(0, x.dtype)),
                                              alone, None, t), t))
        if old is not None and old in self.active and share_old:  # the old value's share
            before = _read(old, s.indices, self.versions[old].dtype, s.span)
            self._emit(_adjoint_label(old), s.indices, weight(before), {}, points,
                       frozenset(), False)
        return weight(factor)

    def _onto(self, k: int) -> bool:
        """Whether max=/min=/*= statement k (no `!`) goes onto a value written before, over
        all of it or a box of it (no left-side index bounded by another): that value is
        one more candidate or factor at each point the statement writes (_ties,
        _product), and its gradient passes through elsewhere (_pass_outside)."""
        s = self.defn.statements[k]
        before = self.before[k]
        if before is None or s.is_scatter:
            return False
        # (the language refuses a range bounded by another index on a reduction's
        # left-side index, so the points it writes are a box)
        return len(s.indices) == len(self.versions[before].extent)

    def _from_zeros(self, k: int) -> bool:
        """Whether max=/min=/*= statement k (no `!`) is the first write of its target: it
        starts from zeros (the checker warns), a constant candidate or factor 0."""
        s = self.defn.statements[k]
        return not s.reset and not s.is_scatter and self.before[k] is None

    def _pass_outside(self, k: int, grad: str) -> None:
        """dOld = dT where statement k does not write (_onto over part of the value)."""
        before = self.before[k]
        if before is not None and before in self.active:
            self._pass_through(k, before, grad, overwrites=True)

    def _ties(self, k: int, rhs: P.Expr, g: P.Read, old: str | None = None,
              from_zeros: bool = False, share_old: bool = True) -> P.Expr:
        """max=!/min=!: how many candidates equal the result (a statement), and the weight
        that routes dT to each of them. `old`: max=/min= without reset onto that value
        (written before, at every point the statement writes: _onto), which is one more
        candidate: it starts the count and gets its share of dT (`share_old`: not from a
        recurrence's reverse scan, whose `g` is no gradient of the result). `from_zeros`:
        onto nothing, the constant 0 is that candidate, and its share goes nowhere. The
        count is emitted once, by whichever asks first."""
        s = self.defn.statements[k]
        if not s.reduction_indices and old is None and not from_zeros:
            return g  # one candidate at each point: the result is that candidate
        made = self.made[k]
        version = self.versions[made]
        result = _read(made, s.indices, version.dtype, s.span)
        hit = D.compare("eq", self._candidate(k, rhs), result)
        ties = f"ties:{made}"
        t = version.dtype.compute if version.dtype.is_float else DType.FLOAT32
        share = D.div(g, _read(ties, s.indices, t, s.span))
        ranges = {r.name: (r.lo, r.hi) for r in s.domain}
        points = {i: ranges[i] for i in s.indices}
        start = None
        if old is not None or from_zeros:
            before = D.const(0, version.dtype) if old is None else \
                _read(old, s.indices, self.versions[old].dtype, s.span)
            start = D.compare("eq", before, result)
        if ties not in self.versions:
            self.versions[ties] = _Version(ties, f"ties_{s.target}", None, t,
                                           version.extent)
            self._count_ties(k, ties, hit, start, t, ranges, points)
        if old is not None and old in self.active and share_old:  # the old value's share
            self._emit(_adjoint_label(old), s.indices, D.select(start, share, None, t),
                       {}, points, frozenset(), False)
        return D.select(hit, share, None, t)

    def _count_ties(self, k: int, ties: str, hit: P.Expr, start: P.Expr | None, t: DType,
                    ranges: dict, points: dict) -> None:
        """`ties_T(I) +=! hit ? 1 : 0` over statement k's domain; `start`: the value before
        (or 0) is one more candidate, which begins the count."""
        s = self.defn.statements[k]
        count = _guarded([c for c, _ in _range_bounds(s, {})],
                         D.select(hit, D.const(1, t), None, t))
        mentioned = _mentions(count, {})
        ranges = dict(ranges)
        for i in [i for i in s.reduction_indices if i not in mentioned]:
            # a reduction index the candidates do not use (`where exists C(l)`): each of
            # its points is a candidate, so the count is times its extent, as the weight's
            # statement multiplies by it (`_scatter`); with the index left out of the
            # count's text its sum would be over nothing (fuzz seed 2028, program 1276)
            lo, hi = ranges.pop(i)
            count = D.mul(count, Raw(f"{type_name(t)}({hi - lo})", 7, t))
        if start is not None:
            self.emitted.append(_Emitted(
                ties, s.indices, D.select(start, D.const(1, t), None, t), {}, points,
                frozenset(), False, op="=",
                comment=f"# how many candidates (and the value before) tie for the {s.op} "
                        f"of statement {k + 1}"))
            self.emitted.append(_Emitted(ties, s.indices, count, {}, ranges, frozenset(),
                                         bool(s.reduction_indices), op="+="))
            return
        self.emitted.append(_Emitted(
            ties, s.indices, count, {}, ranges, frozenset(),
            bool(s.reduction_indices), op="+=!" if s.reduction_indices else "=",
            comment=f"# how many candidates tie for the {s.op} of statement {k + 1}"))

    def _reset_scatter(self, k: int) -> bool:
        """Whether scatter k is a `!` form: the checker writes it as the reset of the whole
        target to the identity (`H(s0) = -inf`, the same source statement), then the
        scatter onto it (tclang/lang/scatters.py)."""
        before = self.before[k]
        if before is None:
            return False
        w = self.versions[before].writer
        if w is None:
            return False
        r = self.defn.statements[w]
        s = self.defn.statements[k]
        return r.op == "=" and isinstance(r.rhs, P.Const) and r.span == s.span

    def _scatter_ties(self, k: int, rhs: P.Expr, g: P.Read) -> P.Expr:
        """A scatter by max=/min= (`M(Idx(i)) max=! X(i)`): the rule of a max=!/min=!
        reduction (_ties), each target element a reduction over the updates that land on
        it. The candidates equal to the result share its gradient evenly: a count of ties
        per element (a scatter-add of `hit ? 1 : 0`), then the gradient gathered where
        each update landed, `hit ? dM(Idx(i)) / ties(Idx(i)) : 0` (time proportional to
        the lookups). Without `!` the value written before is one more candidate at each
        element: it starts the count, and gets its share (`old == M ? dM / ties : 0`)."""
        s = self.defn.statements[k]
        made = self.made[k]
        version = self.versions[made]
        t = version.dtype.compute if version.dtype.is_float else DType.FLOAT32
        subs = tuple(_rename_reads(e, self.seen_by[k]) for e in s.scatter)
        forms = tuple(Affine.index(e.name) if type(e) is P.IndexValue else None for e in subs)
        result = P.Read(made, subs, forms, None, 0, version.dtype, s.span)
        hit = D.compare("eq", self._candidate(k, rhs), result)
        ties = f"ties:{made}"
        self.versions[ties] = _Version(ties, f"ties_{s.target}", None, t, version.extent)
        names = tuple(self.fresh(f"i{d}") for d in range(len(version.extent)))
        whole = {n: (Z.const(0), e) for n, e in zip(names, version.extent)}
        before = self.before[k]
        bang = self._reset_scatter(k)
        if bang:
            start: P.Expr = D.const(0, t)
            comment = f"# how many updates tie for the {s.op} of statement {k + 1}"
        else:
            old = _read(before, names, self.versions[before].dtype, s.span)
            kept = D.compare("eq", old, _read(made, names, version.dtype, s.span))
            start = D.select(kept, D.const(1, t), None, t)
            comment = (f"# how many updates (and the value before) tie for the {s.op} of "
                       f"statement {k + 1}")
        self.emitted.append(_Emitted(ties, names, start, {}, whole, frozenset(names), False,
                                     op="=", comment=comment))
        lhs, scatter = [], []
        for e in subs:
            if type(e) is P.IndexValue:
                lhs.append(e.name), scatter.append(None)
            else:
                lhs.append(self.fresh("j")), scatter.append(e)
        self.emitted.append(_Emitted(
            ties, tuple(lhs), D.select(hit, D.const(1, t), None, t), {},
            {r.name: (r.lo, r.hi) for r in s.domain}, frozenset(), True, op="+=",
            scatter=tuple(scatter)))
        if not bang and before in self.active:  # the old value's share
            grad = _read(_adjoint_label(made), names, version.dtype, s.span)
            share = D.select(kept, D.div(grad, _read(ties, names, t, s.span)), None, t)
            self._emit(_adjoint_label(before), names, share, {}, whole, frozenset(names),
                       False)
        return D.select(hit, D.div(g, P.Read(ties, subs, forms, None, 0, t, s.span)),
                        None, t)

    def _candidate(self, k: int, rhs: P.Expr) -> P.Expr:
        """The candidates of max=!/min=! statement k, as the backward compares them with
        the result. Recomputed where that gives the forward's bits (reads, casts, sums,
        calls); but a product feeding a sum may become one FMA, and a division by a value
        the loop does not change a product with the reciprocal, in one kernel and not in
        another (docs/language.md), so a recomputed candidate may miss the max it is: such
        candidates are saved by the training forward (`T_candidates`, the statement's
        whole domain, as PyTorch's amax keeps its input) and read back."""
        if not any(isinstance(x, P.Binary) and x.dtype.is_float and x.op in
                   ("mul", "div", "mod") for x in P.walk(rhs)):
            return rhs
        s = self.defn.statements[k]
        label = f"cand:{self.made[k]}"
        if label not in self.versions:
            self.versions[label] = _Version(label, f"{s.target}_candidates", k, rhs.dtype,
                                            tuple(s.range_of(i).hi for i in s.all_indices))
        return _read(label, s.all_indices, rhs.dtype, s.span)

    def _pass_through(self, k: int, before: str, grad: str, overwrites: bool = False) -> None:
        """The gradient of the value the statement overwrote (or added to): all of dT for
        `T += e`; for `T = e` over part of T (or `overwrites`: the caller routes the rest
        itself), dT where the statement does not write."""
        s = self.defn.statements[k]
        old = self.versions[before]
        overwrites = overwrites or s.reset or s.op == "="
        if overwrites and not any(n in s.indices for n, _, _ in s.affine_ranges) and \
                all(r.lo.constant == 0 and (r.hi - e).constant == 0 for r, e in
                              zip((s.range_of(i) for i in s.indices), old.extent)):
            return  # overwritten everywhere: its old value has no gradient
        names = [self.fresh(f"i{d}") for d in range(len(old.extent))]
        expr = _read(grad, tuple(names), old.dtype, s.span)
        if overwrites:
            outside = " || ".join(
                [f"{n} < {s.range_of(i).lo} || {n} >= {s.range_of(i).hi}"
                 for n, i in zip(names, s.indices)] +
                # (the points it writes: a range of a reduction index bounds no point;
                # `k >= i0` in this text made the backward not check)
                [negated for _, negated in _range_bounds(
                    s, {i: Affine.index(n) for n, i in zip(names, s.indices)}, s.indices)])
            expr = D.select(Raw(outside, 1), expr, None, old.dtype.compute)
        self._emit(_adjoint_label(before), tuple(names), expr, {},
                   {n: (Z.const(0), e) for n, e in zip(names, old.extent)},
                   frozenset(names), False)

    def _scatter(self, k: int, read: P.Read, contribution: P.Expr, weight: P.Expr) -> None:
        """Emit dX(...) += contribution, with X's subscripts turned into left-side indices."""
        s = self.defn.statements[k]
        x = self.versions[read.tensor]
        ranges = {r.name: (r.lo, r.hi) for r in s.domain}
        lhs: list[str] = []
        new: set[str] = set()
        sigma: dict[str, Affine] = {}
        guards: list[str] = []
        # guards on a subscript's solution, rendered after the last subscript is solved: a
        # later subscript may solve an index they mention (`(2*l + y + 1) % 2 == 0` with l
        # solved as P - p9 by the next one; fuzz seed 2032, program 369, second order)
        solved_guards: list[tuple[str, Affine, str]] = []
        gathers: list[tuple[str, P.Expr]] = []
        out_ranges: dict[str, tuple[Z.SizeExpr, Z.SizeExpr]] = {}
        dims = [self._dim_name(x, d) for d in range(len(read.subscripts))]
        for p, (sub, form) in enumerate(zip(read.subscripts, read.affine)):
            extent = x.extent[p]
            if form is None:  # a scatter-add at the gathered point (or a guard, below)
                y = self.fresh(dims[p])
                lhs.append(y)
                out_ranges[y] = (Z.const(0), extent)
                gathers.append((y, sub))
                continue
            a = _substitute(form, sigma)
            if len(a.terms) == 1 and a.terms[0][1] == 1 and isinstance(a.terms[0][0], str) \
                    and a.offset.constant == 0:  # a plain index
                v = a.terms[0][0]
                # after substituting earlier solutions (i := k + 1 for B(i - 1, i - 1)) the
                # index may be one this scatter put on the left (k), not a statement index:
                # then it is no new left-side index but an equality guard (below)
                lo, hi = ranges.get(v, (None, None))
                if v not in lhs and v not in sigma and v in ranges and \
                        lo.constant == 0 and (hi - extent).constant == 0:
                    lhs.append(v)
                    out_ranges[v] = (lo, hi)
                    continue
            y = self.fresh(dims[p])
            lhs.append(y), new.add(y)
            out_ranges[y] = (Z.const(0), extent)
            v = self._pick(a, lhs, sigma, s)
            if v is None:  # every index in it is known: an equality guard
                solved_guards.append((f"{y} == ", a, ""))
                continue
            c = a.coefficient(v)
            rest = a - Affine.index(v).scale(c)
            if c == 1:
                solved = Affine.index(y) - rest
            elif c == -1:
                solved = rest - Affine.index(y)
            else:
                top = Affine.index(y) - rest if c > 0 else rest - Affine.index(y)
                solved_guards.append(("", top, f" % {abs(c)} == 0"))
                solved = top.floordiv(abs(c))
            sigma = {u: _substitute(f, {v: solved}) for u, f in sigma.items()}
            sigma[v] = solved
        guards += [before + _affine_text(_substitute(form, sigma), paren=bool(after)) + after
                   for before, form, after in solved_guards]
        padded = self._padded(k, sigma, weight, contribution, x, lhs, read)
        flipped: dict[str, tuple[str, int]] = {}
        done: set[str] = set()
        if padded is not None:
            contribution, flipped, done = padded
            sigma = {v: f for v, f in sigma.items() if v not in done}
        for v, f in sigma.items():
            lo, hi = (self.named(e) for e in ranges[v])
            text = _affine_text(f)
            # a bound with a min or max in it as several affine ones (Z.pieces), so the
            # guard stays one the language reads as a bound on the backward's reads
            guards += [f"{text} >= {p}" for p in Z.pieces(lo, "max")]
            guards += [f"{text} < {p}" for p in Z.pieces(hi, "min")]
        index_text = {v: (_affine_text(f), _affine_level(f)) for v, f in sigma.items()}
        index_text.update(flipped)
        reduction = [i for i in s.all_indices if i not in lhs and i not in sigma and
                     i not in done]
        for i in reduction:
            out_ranges[i] = ranges[i]
        expr = contribution
        if gathers and (not all(type(sub) is P.Read for _, sub in gathers) or
                        _under_select(self.rhs[k], read)):
            # a left side takes a gather only as a read (H(Ids(i)), not H(Ids(i) / 2)),
            # and a scatter evaluates its subscripts unconditionally (a `?:` around the
            # gather may be what keeps them in range): an equality guard instead, one
            # pass over X's extent per term
            for y, sub in gathers:
                new.add(y)
                expr = D.select(P.Compare("eq", P.IndexValue(y), sub), expr, None,
                                expr.dtype)
            gathers = []
        for y, _ in gathers:
            del out_ranges[y]
        guards += [c for c, _ in _range_bounds(s, sigma)]
        expr = _guarded(guards, expr)
        mentioned = _mentions(expr, index_text).union(
            *(_mentions(sub, index_text) for _, sub in gathers))
        for i in [i for i in reduction if i not in mentioned]:
            # summing a term that does not depend on i: times i's extent
            lo, hi = ranges[i]
            count = Raw(f"{type_name(expr.dtype)}({hi - lo})", 7, expr.dtype)
            expr = D.mul(expr, count)
            reduction.remove(i)
            del out_ranges[i]
        if gathers:
            self._emit_scatter(read.tensor, lhs, dict(gathers), expr, index_text, out_ranges,
                               frozenset(new))
            return
        self._emit(_adjoint_label(read.tensor), tuple(lhs), expr, index_text, out_ranges,
                   frozenset(new), bool(reduction),
                   override=(read.tensor, read.subscripts))

    def _emit_scatter(self, label: str, lhs: list[str], gathered: dict, expr, index_text,
                      ranges, always) -> None:
        """`dX(Ids(b, l), d) += e`: the gradient of a gather, after `dX = 0` where nothing
        wrote dX yet (a scatter's target needs a known shape; a `+=!` would be two
        statements). Its other reads keep the forward's subscripts: every index of the
        forward statement is an index of the scatter."""
        target = _adjoint_label(label)
        x = self.versions[label]
        if target not in self.written:
            names = [self.fresh(f"i{d}") for d in range(len(x.extent))]
            zero = Raw(f"{type_name(x.dtype)}(0)", 7, x.dtype)  # the temporary's type
            self._emit(target, tuple(names), zero, {},
                       {n: (Z.const(0), e) for n, e in zip(names, x.extent)},
                       frozenset(names), False)
        scatter = tuple(gathered.get(y) for y in lhs)
        self._emit(target, tuple(lhs), expr, index_text, ranges, always, True)
        self.emitted[-1].scatter = scatter

    def _padded(self, k: int, sigma: dict, weight: P.Expr, contribution: P.Expr,
                 x: _Version, lhs: list[str], read: P.Read):
        """A stride-1 window solved for the output index (h = y - kh) reads dT(y - kh)
        under a range guard: a transposed convolution that the scheduler sees as a
        guarded, oddly shaped nest. Written as what people write instead, a convolution
        of dT padded by K-1 zeros with the window flipped (kh -> K-1-kh):
            dTpad(.., q, ..) = (q >= K-1 && q < E+K-1) ? dT(.., q - (K-1), ..) : 0
            dX(.., y, ..) +=! dTpad(.., y + kh, ..) * W(.., K-1-kh, ..)
        it runs as fast as the forward. Only where the read covers X exactly (E+K-1 = X's
        extent), the window index starts at 0 and is used by no other solved subscript,
        and the gradient arrives unrouted (not through a max). Returns (contribution,
        index texts of the flipped indices, the solved indices now unguarded) or None."""
        s = self.defn.statements[k]
        if not isinstance(weight, P.Read) or not weight.tensor.startswith("d:") or \
                s.affine_ranges:  # (a window whose range uses other indices: guarded)
            return None
        ranges = {r.name: (r.lo, r.hi) for r in s.domain}
        pads: dict[str, tuple[str, str, Z.SizeExpr, Z.SizeExpr]] = {}  # v -> (y, u, K-1, E)
        used = set()
        for v, f in sigma.items():
            ys = [a for a, c in f.terms if c == 1]
            us = [a for a, c in f.terms if c == -1]
            if len(f.terms) != 2 or f.offset.constant != 0 or len(ys) != 1 or \
                    len(us) != 1 or not isinstance(ys[0], str) or not isinstance(us[0], str):
                continue
            y, u = ys[0], us[0]
            if v not in s.indices or u not in s.reduction_indices or u in used or \
                    ranges[u][0].constant != 0 or ranges[v][0].constant != 0:
                continue
            p = lhs.index(y)
            window, extent = ranges[u][1], ranges[v][1]
            if (x.extent[p] - (extent + window - Z.const(1))).constant != 0:
                continue
            pads[v] = (y, u, window - Z.const(1), extent)
            used.add(u)
        if not pads:
            return None
        others = [r for r in P.reads_of(contribution) if r is not weight and
                  r.tensor != weight.tensor]
        if any(isinstance(n, P.IndexValue) and n.name in pads
               for r in others for sub in r.subscripts for n in P.walk(sub)):
            return None  # the solved index is read elsewhere: it needs its guard
        if any(isinstance(n, P.IndexValue) and n.name in pads
               for n in _walk_except(contribution, weight)):
            # used as a value too (`k <= i`): the padded form leaves it unsolved, with no
            # range (fuzz seed 2029, program 221)
            return None
        if sum(1 for r in P.reads_of(contribution) if r.tensor == weight.tensor) != 1:
            return None
        grad = weight.tensor
        label = f"pad:{grad}:{','.join(sorted(pads))}"
        t = self.versions[grad[2:]]
        if label not in self.versions:
            self.versions[label] = _Version(label, t.tensor, None, t.dtype, ())
            names = [self.fresh(f"q{d}") for d in range(len(s.indices))]
            conds, subs, pad_ranges = [], [], {}
            for name, v in zip(names, s.indices):
                if v in pads:
                    _, _, margin, extent = pads[v]
                    conds.append(f"{name} >= {margin} && {name} < {extent + margin}")
                    subs.append(Raw(f"{name} - ({margin})" if margin.constant is None
                                    else f"{name} - {margin}", 4, DType.INT32))
                    pad_ranges[name] = (Z.const(0), extent + margin * 2)
                else:
                    subs.append(P.IndexValue(name))
                    pad_ranges[name] = (Z.const(0), ranges[v][1])
            source_read = P.Read(grad, tuple(subs), tuple(None for _ in subs), None, 0,
                                 t.dtype, s.span)
            self.emitted.append(_Emitted(
                label, tuple(names),
                D.select(Raw(" && ".join(conds), 2), source_read, None, t.dtype.compute),
                {}, pad_ranges, frozenset(names), False, op="=",
                comment=f"# the gradient of statement {k + 1}, padded with zeros: its "
                        "transposed convolution becomes a convolution"))
        subs = []
        for v in s.indices:
            if v in pads:
                y, u, _, _ = pads[v]
                subs.append(Raw(f"{y} + {u}", 4, DType.INT32))
            else:
                subs.append(P.IndexValue(v))
        padded_read = P.Read(label, tuple(subs), tuple(None for _ in subs), None, 0,
                             weight.dtype, weight.span)
        contribution = rewrite_bottom_up(contribution,
                                         lambda n: padded_read if n is weight else n)
        flipped = {u: (f"{margin} - {u}", 4) for _, u, margin, _ in pads.values()}
        return contribution, flipped, set(pads)

    def _pick(self, a: Affine, lhs, sigma, s: P.Statement) -> str | None:
        """The index to solve subscript `a` for: one the statement writes along if there is
        one (so the gather sums over the small window), else a coefficient of +-1. Never
        one that also stands inside a floor division or modulo of `a`: `l + (l2 - l) / 2`
        solved for l would define l by itself (the backward of a backward of a shifted
        diagonal read; fuzz seed 36, program 52)."""
        nested = frozenset().union(*(atom.inner.indices() for atom, _ in a.terms
                                     if not isinstance(atom, str)))
        free = [atom for atom, c in a.terms
                if isinstance(atom, str) and atom not in lhs and atom not in sigma and
                atom not in nested]
        if not free:
            return None
        return min(free, key=lambda v: (v not in s.indices, abs(a.coefficient(v)) != 1))

    def _dim_name(self, x: _Version, d: int) -> str:
        t = self.defn.tensors.get(x.tensor)
        if t is not None and t.declared and t.shape[d].names() and \
                len(t.shape[d].names()) == 1 and str(t.shape[d]).isidentifier():
            return str(t.shape[d]).lower()
        return f"i{d}"

    def _emit(self, target: str, lhs, expr, index_text, ranges, always, reduces,
              override=None, comment="") -> None:
        version = self.versions.get(target[2:]) if target.startswith("d:") else None
        if version is not None and version.dtype.is_float and expr.dtype.is_float:
            # a narrower tensor read in wider arithmetic (float32 A in A(i) * B(i) with
            # double B) gets a wider contribution: its gradient has A's type, as PyTorch's
            # has, so the contribution is rounded to it (the language never narrows by
            # itself). A narrower contribution (a double T read inside `float32(..)`) is
            # widened: the first write of dT gives dT its type, and a later, wider
            # contribution could not narrow into it (fuzz seed 2041, program 842)
            want = version.dtype.compute
            if version.dtype.is_narrow_float and expr.dtype is not version.dtype:
                expr = P.Cast(expr, version.dtype)  # a half or bfloat16 gradient: rounded
            elif expr.dtype.compute != want:
                expr = P.Cast(expr, want)
        if target not in self.written:
            op = ("+=!" if reduces else "=")
            self.written.add(target)
        else:
            op = "+="
        self.emitted.append(_Emitted(target, tuple(lhs), expr, index_text, ranges,
                                     frozenset(always), reduces, override, op, comment))

    # -- names, signatures, text
    def _assemble(self, seeds: list[str]) -> GradientSource:
        defn = self.defn
        self._drop_copies()
        needed: list[str] = []
        for e in self.emitted:
            for r in P.reads_of(e.expr):
                if not r.tensor.startswith(("d:", "ties:", "seed:", "pad:", "zeros:",
                                            "nonzero:")) and \
                        r.tensor not in needed:
                    needed.append(r.tensor)
        names: dict[str, str] = {}
        for t in defn.inputs:
            names[_label(t.name, None)] = t.name
        saved: list[Saved] = []
        copies: dict[int, tuple[str, str]] = {}
        candidates: dict[int, str] = {}  # statement -> the tensor saving its candidates
        for label in needed:
            v = self.versions[label]
            if v.writer is None:
                continue
            if label.startswith("cand:"):
                names[label] = candidates[v.writer] = self.fresh(v.tensor)
                saved.append(Saved(names[label], v.dtype, v.extent, False))
                continue
            if v.final:
                names[label] = v.tensor
                is_output = defn.tensor(v.tensor).role == "output"
            else:
                names[label] = self.fresh(f"{v.tensor}{self._write_number(v)}")
                copies[v.writer] = (v.tensor, names[label])
                is_output = False
            saved.append(Saved(names[label], v.dtype, v.extent, is_output))
        grad_names: dict[str, str] = {}
        for x in self.wrt:
            names[_adjoint_label(_label(x, None))] = grad_names[x] = self.fresh(f"d{x}")
        seed_names = []
        for out in seeds:
            label = self.seed_label[out]
            names[label] = self.fresh(f"d{out}")
            seed_names.append(names[label])
        for e in self.emitted:
            for label in (e.target, *[r.tensor for r in P.reads_of(e.expr)]):
                if label not in names:
                    names[label] = self.fresh(self._adjoint_base(label))
        unused = []
        for x in self.wrt:  # an input no output depends on: its gradient is zero
            label = _adjoint_label(_label(x, None))
            if label not in self.written:
                unused.append(x)
                t = defn.tensor(x)
                idx = [self.fresh(f"i{d}") for d in range(t.rank)]
                # a half or bfloat16 zero is written as a cast: a literal 0.0 is float32,
                # which the language will not narrow into the gradient by itself
                zero = D.const(0, t.dtype) if not t.dtype.is_narrow_float else \
                    Raw(f"{type_name(t.dtype)}(0.0)", 7, t.dtype)
                self.emitted.append(_Emitted(label, tuple(idx), zero,
                                             {}, {i: (Z.const(0), e) for i, e in
                                                  zip(idx, t.shape)},
                                             frozenset(idx), False, op="="))
        added = self.added
        forward_name = defn.name if not any(not s.is_output for s in saved) else \
            self.fresh(f"{defn.name}_saving")
        backward_name = self.fresh(f"{defn.name}_grad")
        forward = self._forward_text(forward_name, saved, copies, candidates, names)
        backward = _Backward(self, names, saved, seeds, seed_names, grad_names, added,
                             backward_name).text()
        return GradientSource(forward, forward_name, backward, backward_name, self.wrt,
                              tuple(saved), tuple(seeds), tuple(seed_names),
                              tuple(grad_names[x] for x in self.wrt), added, tuple(unused))

    def _adjoint_base(self, label: str) -> str:
        if label.startswith("pad:"):
            return f"{self._adjoint_base(label.split(':', 1)[1].rsplit(':', 1)[0])}pad"
        if label.startswith("ties:"):
            return f"ties_{self.versions[label[5:]].tensor}"
        if label.startswith(("zeros:", "nonzero:")):  # a product's counts (_product)
            return self.versions[label].tensor
        v = self.versions[label[2:]]
        return f"d{v.tensor}" if v.final else f"d{v.tensor}{self._write_number(v)}"

    def _drop_copies(self) -> None:
        """`dT2(i, j) = dT(i, j)` with nothing else writing dT2 and nothing writing dT
        after it: dT2 is dT (the gradient passes through `T = T + b` unchanged)."""
        grads = {_adjoint_label(_label(x, None)) for x in self.wrt}
        i = 0
        while i < len(self.emitted):
            e = self.emitted[i]
            x = e.expr
            plain = isinstance(x, P.Read) and not e.index_text and \
                tuple(getattr(y, "name", None) for y in x.subscripts) == e.lhs
            if e.op == "=" and plain and e.target not in grads and \
                    sum(f.target == e.target for f in self.emitted) == 1 and \
                    not any(f.target == x.tensor for f in self.emitted[i + 1:]):
                del self.emitted[i]
                for f in self.emitted[i:]:
                    f.expr = _rename_reads(f.expr, {e.target: x.tensor})
                    f.scatter = tuple(y if y is None else _rename_reads(y, {e.target: x.tensor})
                                      for y in f.scatter)
                continue
            i += 1

    def _write_number(self, v: _Version) -> int:
        writers = [k for k, s in enumerate(self.defn.statements) if s.target == v.tensor]
        return writers.index(v.writer) + 1

    def _forward_text(self, name: str, saved: list[Saved], copies: dict,
                      candidates: dict, names: dict) -> str:
        defn = self.defn
        extra = [s.name for s in saved if not s.is_output]
        if not extra:
            return defn.source
        lines = [f"def {name}({', '.join(_param(t) for t in defn.inputs)}) -> "
                 f"({', '.join([_output(t) for t in defn.outputs] + extra)}) {{"]
        for k, text in enumerate(_statement_texts(defn)):
            if k in candidates:  # T(I) max=! e  ->  C(I, R) = e;  T(I) max=! C(I, R)
                s = defn.statements[k]
                every = ", ".join(s.all_indices)
                where = ", ".join(_range_text(s, i) for i in s.all_indices)
                target = f"{s.target}({', '.join(s.indices)})" if s.indices else s.target
                bang = "!" if s.reset else ""
                if s.is_scatter:  # its subscripts as written; `!` where it reset
                    target = f"{s.target}({', '.join(source(e) for e in s.scatter)})"
                    bang = "!" if self._reset_scatter(k) else ""
                # the type said (a reprinted literal may type otherwise): the backward
                # declares the saved tensor with it
                dtype = self.versions[f"cand:{self.made[k]}"].dtype
                value = source(s.rhs) if isinstance(s.rhs, P.Cast) and \
                    s.rhs.dtype is dtype else f"{type_name(dtype)}({source(s.rhs)})"
                # no where at all over no index (`O max= e`: an empty clause did not
                # parse; fuzz seed 2035, program 575)
                clause = f" where {where}" if where else ""
                if scans.recurrence_reads(s):
                    # a max=! reading earlier points of its own target: the candidates
                    # can only follow it (they read what it wrote), then the max of the
                    # saved candidates is the result, so that the backward's ties are
                    # exact (it differs from the first max by a rounding at most); without
                    # `!`, of the value before (its saved copy, or 0) and the candidates
                    lines.append("    " + text)
                    lines.append(f"    {candidates[k]}({every}) = {value}{clause}")
                    if s.op != "*":  # (a product's zeros are the same in both)
                        if not s.reset:
                            before = self.before[k]
                            start = f"{type_name(dtype)}(0)" if before is None else \
                                f"{names[before]}({', '.join(s.indices)})"
                            box = ", ".join(_range_text(s, i) for i in s.indices)
                            lines.append(f"    {target} = {start}" +
                                         (f" where {box}" if box else ""))
                        lines.append(f"    {target} {s.op}={bang} "
                                     f"{candidates[k]}({every}){clause}")
                else:
                    lines.append(f"    {candidates[k]}({every}) = {value}{clause}")
                    lines.append(f"    {target} {s.op}={bang} {candidates[k]}({every}){clause}")
            else:
                if text:  # (a scatter's reset shares its statement's text)
                    lines.append("    " + text)
            if k in copies:
                tensor, copy = copies[k]
                v = self.versions[self.made[k]]
                idx = [self.fresh(f"i{d}") for d in range(len(v.extent))]
                where = ", ".join(f"{i} in 0:{e}" for i, e in zip(idx, v.extent))
                subs = f"({', '.join(idx)})" if idx else ""
                lines.append(f"    {copy}{subs} = {tensor}{subs}" +
                             (f" where {where}" if where else ""))
        return "\n".join(lines + ["}"])


class _Backward:
    """The backward definition's text, with where clauses only where range inference
    would not give the intended ranges by itself."""

    def __init__(self, b: _Builder, names, saved, seeds, seed_names, grad_names, added, name):
        self.b, self.names, self.saved, self.seeds = b, names, saved, seeds
        self.seed_names, self.grad_names, self.added, self.name = \
            seed_names, grad_names, added, name
        self.bound: set[str] = set()  # added size names some parameter's shape binds
        self.header = self._header()

    def _dims(self, shape) -> str:
        parts = []
        for e in shape:
            if e.constant is not None or (str(e).isidentifier() and
                                          str(e) in self.b.defn.sizes):
                parts.append(str(e))
                continue
            name = self.b.added_name(e)
            self.bound.add(name)  # a parameter's shape binds it
            parts.append(name)
        return f"({', '.join(parts)})" if parts else ""

    def _header(self) -> list[str]:
        defn = self.b.defn
        params = [_param(t) for t in defn.inputs]
        params += [f"{type_name(s.dtype)}{self._dims(s.shape)} {s.name}" for s in self.saved]
        for out, seed in zip(self.seeds, self.seed_names):
            extent = self.b.versions[self.b.final_label[out]].extent
            params.append(f"{type_name(defn.tensor(out).dtype)}{self._dims(extent)} {seed}")
        outs = [f"{type_name(defn.tensor(x).dtype)}{_shape_text(defn.tensor(x).shape)} "
                f"{self.grad_names[x]}" for x in self.b.wrt]
        unbound = sorted(self.b.named_extents - self.bound)
        if unbound:  # a linear scan of an intermediate: nothing the backward takes has
            # its shape, so the added size cannot be bound
            extent = self.added[unbound[0]]
            raise TCGradError(
                f"cannot differentiate {defn.name}: a recurrence runs over the extent "
                f"{extent} of a tensor that is neither an output nor saved, and tc.grad "
                "does not yet pass such an extent to the backward", defn.span,
                hint="give the recurrence's indices where ranges in the sizes (e.g. "
                     "`where i in 0:N`), or make its target an output")
        lines = [f"def {self.name}({', '.join(params)}) -> ({', '.join(outs)}) {{"]
        for new, e in self.added.items():
            lines.append(f"    # {new} = {e}")
        return lines

    def _statement(self, e: _Emitted, where: set[str]) -> str:
        names = self.names
        tensor = names[e.target]
        lhs = f"{tensor}({', '.join(e.lhs)})" if e.lhs else tensor

        def rename(x: P.Expr) -> P.Expr:
            kids = P.children(x)
            new = P.with_children(x, tuple(rename(c) for c in kids))
            if isinstance(x, P.Read) and e.override is not None and \
                    (x.tensor, x.subscripts) == e.override:
                return _read(names[x.tensor], e.lhs, x.dtype, x.span)
            if isinstance(new, P.Read):
                return replace(new, tensor=names[new.tensor])
            return new
        body = source(rename(e.expr), e.index_text)
        if e.scatter:  # the gathered subscripts on the left
            subs = [name if x is None else source(rename(x), e.index_text)
                    for name, x in zip(e.lhs, e.scatter)]
            lhs = f"{tensor}({', '.join(subs)})"
        order = [i for i in e.ranges if i in where]
        clause = ", ".join(f"{i} in {self._bound(e.ranges[i][0])}:{self._bound(e.ranges[i][1])}"
                           for i in order)
        text = f"    {lhs} {e.op} {body}" + (f" where {clause}" if clause else "")
        return text

    def _bound(self, e: Z.SizeExpr) -> Z.SizeExpr:
        """A where range's bound as the size name the header binds for it (`S0` for
        `M - 1`): a temporary written over `0:S0` by one statement (a saved tensor's
        extent) and `0:M - 1` by another got the extent `max(M - 1, S0)`, and the backward
        of this backward, which writes such an extent as a where range, could not (fuzz
        seed 2034, program 1286)."""
        for name in sorted(self.bound):
            if (self.added[name] - e).constant == 0:
                return Z.size(name)
        return e

    def text(self) -> str:
        from tclang.lang.frontend import check_source
        wheres = [set(e.always_where) for e in self.b.emitted]
        for _ in range(len(wheres) + 4):
            src = self._render(wheres)
            try:
                checked = check_source(src)[self.name]
            except TCSemanticError as err:
                k = self._statement_at(err.line)
                if k is None or wheres[k] == set(self.b.emitted[k].ranges):
                    raise TCGradError(f"the backward of {self.b.defn.name} does not check "
                                      f"({err.message}); please report it with the "
                                      "definition", self.b.defn.span) from None
                if len(src) > ALL_WHERES_CHARS:  # each check costs seconds: one more only
                    wheres = [set(e.ranges) for e in self.b.emitted]
                else:
                    wheres[k] = set(self.b.emitted[k].ranges)
                continue
            changed = False
            for k, (e, st) in enumerate(zip(self.b.emitted, checked.statements)):
                for r in st.domain:
                    want = e.ranges.get(r.name)
                    # an inferred bound with a min or max in it is given as a where
                    # range too, even where it equals the intended one: the backward of
                    # this backward (second order) writes its ranges into where clauses,
                    # whose bounds must be affine
                    if want is not None and r.name not in wheres[k] and \
                            (not self._same(want, (r.lo, r.hi)) or
                             any(f in str(b) for b in (r.lo, r.hi) for f in ("min(", "max("))):
                        wheres[k].add(r.name)
                        changed = True
            if not changed:
                return src
        return src

    def _render(self, wheres) -> str:
        lines = list(self.header)
        self.lines_of = []
        for e, where in zip(self.b.emitted, wheres):
            if e.comment:
                lines.append(f"    {e.comment}")
            self.lines_of.append(len(lines) + 1)
            lines.append(self._statement(e, where))
        return "\n".join(lines + ["}"])

    def _statement_at(self, line: int | None) -> int | None:
        if line is None:
            return None
        for k, start in enumerate(self.lines_of):
            if start == line:
                return k
        return None

    def _same(self, want, got) -> bool:
        """The intended range (forward sizes) equals the inferred one (backward sizes, where
        the added sizes stand for forward expressions)? Compared at random sizes."""
        rng = random.Random(0)
        for _ in range(16):
            env = {n: rng.randint(17, 61) for n in self.b.defn.sizes}
            env.update({n: e.evaluate(env) for n, e in self.added.items()})
            try:
                if any(a.evaluate(env) != b.evaluate(env) for a, b in zip(want, got)):
                    return False
            except (KeyError, ZeroDivisionError):
                return False
        return True


ALL_WHERES_CHARS = 50_000
"""A backward's text past which a statement that does not check gives every statement its
where ranges at once, instead of one statement per check: the front end checks about 50 KB
a second, and a second derivative of 224 KB was checked ten times over (fuzz seed 2032,
program 369: a minute per differentiation, reported as a hang)."""


# ---- helpers -----------------------------------------------------------------------------

def _guarded(guards: list[str], expr: P.Expr) -> P.Expr:
    """`expr` where every guard (conditions on indices, as text) holds, else 0."""
    if not guards:
        return expr
    return D.select(Raw(" && ".join(guards), 2 if len(guards) > 1 else 3), expr, None,
                    expr.dtype)


def _read(tensor: str, indices, dtype: DType, span) -> P.Read:
    return P.Read(tensor, tuple(P.IndexValue(i) for i in indices),
                  tuple(Affine.index(i) for i in indices), None, 0, dtype, span)


def _under_select(e: P.Expr, read: P.Read) -> bool:
    """Whether `read` is (or is in) a branch of a `?:` in `e`: evaluated only sometimes."""
    for x in P.walk(e):
        if isinstance(x, P.Select) and any(n is read for branch in (x.then, x.other)
                                           for n in P.walk(branch)):
            return True
    return False


def _walk_except(e: P.Expr, skip: P.Expr):
    """The nodes of `e` (as P.walk) outside the subtree `skip`."""
    if e is skip:
        return
    yield e
    for kid in P.children(e):
        yield from _walk_except(kid, skip)


def _mentions(e: P.Expr, index_text: dict) -> set[str]:
    """The index names a backward statement's text will contain."""
    found: set[str] = set()
    for x in P.walk(e):
        if isinstance(x, P.IndexValue):
            found |= set(re.findall(r"[A-Za-z_]\w*", index_text[x.name][0])) \
                if x.name in index_text else {x.name}
        elif isinstance(x, Raw):
            found |= set(re.findall(r"[A-Za-z_]\w*", x.text))
    return found


def _substitute(a: Affine, sigma: dict[str, Affine]) -> Affine:
    out = Affine.of_size(a.offset)
    for atom, coef in a.terms:
        if isinstance(atom, str):
            term = sigma.get(atom, Affine.index(atom))
        else:
            inner = _substitute(atom.inner, sigma)
            term = inner.floordiv(atom.divisor) if atom.kind == "div" else \
                inner.mod(atom.divisor)
        out = out + term.scale(coef)
    return out


def _statement_texts(defn: P.Definition) -> list[str]:
    """Each statement as written, on one line, its where clause included: the training
    forward repeats the definition's statements, and `Statement.text` ends with the right
    side (a range or a `where x = ...` it needs would be lost, and the copy would not
    check). A statement runs from its target to the next statement's target (the last to
    the definition's closing brace); comments and a closing `;` are dropped."""
    src = defn.source
    starts = [0]
    for line in src.split("\n")[:-1]:
        starts.append(starts[-1] + len(line) + 1)

    def offset(line: int, column: int) -> int:
        return starts[line - 1] + column - 1

    texts = []
    statements = defn.statements
    for k, s in enumerate(statements):
        begin = offset(s.span.line, s.span.column)
        if k + 1 < len(statements):
            nxt = statements[k + 1].span
            text = _without_comments(src[begin:offset(nxt.line, nxt.column)])
        else:  # the language has no braces inside a statement: the first one ends the body
            text = _without_comments(src[begin:])
            text = text[:text.index("}")]
        texts.append(" ".join(text.split()).rstrip(";").rstrip())
    return texts


def _range_text(s: P.Statement, index: str) -> str:
    """`index in lo:hi` as statement s ranges it: its `where` range where that uses other
    indices (`j in 0:i + 1`), else its inferred range."""
    for name, lo, hi in s.affine_ranges:
        if name == index:
            return f"{name} in {_affine_text(lo)}:{_affine_text(hi)}"
    r = s.range_of(index)
    return f"{index} in {r.lo}:{r.hi}"


def _without_comments(text: str) -> str:
    return re.sub(r"#[^\n]*", "", text)


def _shape_text(shape) -> str:
    return f"({', '.join(str(d) for d in shape)})" if shape else ""


def _param(t: P.Tensor) -> str:
    return f"{type_name(t.dtype)}{_shape_text(t.shape)} {t.name}"


def _output(t: P.Tensor) -> str:
    return f"{type_name(t.dtype)}{_shape_text(t.shape)} {t.name}" if t.declared else t.name


