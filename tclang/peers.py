"""Library operators that compute what a definition computes, recognised from its structure.

`tclang compare` times a kernel beside its peers and `tclang run` checks it against NumPy;
both need to know what the kernel computes in a library's terms. A definition's *name*
proves nothing (`def conv2d` may be anything), so `recognise(definition, sizes)` reads the
checked program instead:

1. Every statement's value is written as a term in the inputs alone (`Term`): temporaries
   and earlier values of a tensor are inlined where they are read, reductions become
   `Red` nodes over fresh variables, sizes become numbers (recognition is for one set of
   sizes), casts are dropped. Index names, temporaries, statement splits and the order of
   factors stop mattering: `rowmax`, `rowsum` and `Y` of a softmax, or the same softmax
   written in one line with `1 / sum` multiplied in, give one term.
2. Products and quotients are flattened (`Prod`: a constant times factors over factors),
   factors that do not move along a sum's variables are taken out of it, `rsqrt(x)` is
   `1 / sqrt(x)`, `pow(x, 2)` is `x * x`.
3. Matchers look for each operator's shape in that term: an einsum (one product of plain
   reads), a convolution (stride, padding, dilation, groups, any layout), pooling (max or
   average), cumsum, softmax, layer normalization, attention (with or without a causal
   mask). Each derives its parameters (stride, axis, scale, epsilon) from the term.

An `Operator` carries the NumPy and PyTorch calls that compute the definition's output from
its inputs, and says what they are. Recognition can be wrong where a term only looks like
an operator (a layer norm's skeleton with another formula inside), so whoever uses a peer
confirms it on the data: `tclang compare` times a peer only if its result matches the
automatic schedule's, and the checks (`tclang.checking`) fall back to the reference
interpreter where NumPy disagrees.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, replace
from typing import Callable

import numpy as np

from tclang.lang import program as P


# ---- terms -------------------------------------------------------------------------------

@dataclass(frozen=True)
class Lin:
    """An integer affine index expression: sum of coefficient x atom, plus a constant. An
    atom is a variable name or an `LDiv` (floor division or modulo by a constant)."""

    terms: tuple = ()
    const: int = 0

    def var(self) -> str | None:
        """The variable, if this is one plain variable."""
        if self.const == 0 and len(self.terms) == 1 and self.terms[0][1] == 1 and \
                isinstance(self.terms[0][0], str):
            return self.terms[0][0]
        return None

    def vars(self) -> frozenset:
        out = set()
        for atom, _ in self.terms:
            out |= {atom} if isinstance(atom, str) else atom.inner.vars()
        return frozenset(out)

    def rename(self, m: dict) -> "Lin":
        terms = {}
        for atom, coef in self.terms:
            atom = m.get(atom, atom) if isinstance(atom, str) else \
                LDiv(atom.inner.rename(m), atom.divisor, atom.kind)
            terms[atom] = terms.get(atom, 0) + coef
        return Lin(tuple(sorted(((a, c) for a, c in terms.items() if c), key=_atom_key)),
                   self.const)

    def coefficient(self, var: str) -> int:
        return dict(self.terms).get(var, 0)


@dataclass(frozen=True)
class LDiv:
    inner: Lin
    divisor: int
    kind: str  # "div" or "mod"


def _atom_key(item) -> str:
    return repr(item[0])


@dataclass(frozen=True)
class In:
    """A read of an input tensor."""

    tensor: str
    subs: tuple


@dataclass(frozen=True)
class Red:
    """A reduction (op "+", "*", "min", "max") of `body` over `axes`: (variable, lo, hi)."""

    op: str
    axes: tuple
    body: object


@dataclass(frozen=True)
class Op:
    """An operation: "add", "sub", "neg", a comparison, "and", "select", a builtin..."""

    name: str
    args: tuple


@dataclass(frozen=True)
class K:
    value: float


@dataclass(frozen=True)
class Ix:
    """An index expression used as a value."""

    lin: Lin


@dataclass(frozen=True)
class Prod:
    """coef x product(num) / product(den), factors in a canonical order."""

    coef: float
    num: tuple
    den: tuple


class NoMatch(Exception):
    """The definition uses something recognition does not follow (a gather, a partial
    write, ...): no operator."""


def free(t) -> frozenset:
    """The free variables of a term."""
    if isinstance(t, In):
        return frozenset().union(*(s.vars() for s in t.subs)) if t.subs else frozenset()
    if isinstance(t, Ix):
        return t.lin.vars()
    if isinstance(t, Red):
        return free(t.body) - {v for v, _, _ in t.axes}
    if isinstance(t, Op):
        return frozenset().union(*(free(a) for a in t.args)) if t.args else frozenset()
    if isinstance(t, Prod):
        return frozenset().union(*(free(a) for a in t.num + t.den)) \
            if t.num or t.den else frozenset()
    return frozenset()


def rename(t, m: dict):
    """`t` with free variables renamed by `m` (all at once). Bound variables are fresh
    names unique to their statement, so no renaming can capture one."""
    if not m:
        return t
    if isinstance(t, In):
        return In(t.tensor, tuple(s.rename(m) for s in t.subs))
    if isinstance(t, Ix):
        return Ix(t.lin.rename(m))
    if isinstance(t, Red):
        bound = {v for v, _, _ in t.axes}
        inner = {k: v for k, v in m.items() if k not in bound}
        return Red(t.op, t.axes, rename(t.body, inner))
    if isinstance(t, Op):
        return Op(t.name, tuple(rename(a, m) for a in t.args))
    if isinstance(t, Prod):
        return Prod(t.coef, tuple(rename(a, m) for a in t.num),
                    tuple(rename(a, m) for a in t.den))
    return t


def canon(t):
    """`t` with its bound variables renamed b0, b1, ... in order of appearance: equal
    canonical forms mean equal terms up to the names of bound variables."""
    counter = itertools.count()

    def go(x, m):
        if isinstance(x, Red):
            names = {v: f"b{next(counter)}" for v, _, _ in x.axes}
            axes = tuple((names[v], lo, hi) for v, lo, hi in x.axes)
            return Red(x.op, axes, go(x.body, {**m, **names}))
        if isinstance(x, Op):
            return Op(x.name, tuple(go(a, m) for a in x.args))
        if isinstance(x, Prod):
            return Prod(x.coef, tuple(go(a, m) for a in x.num), tuple(go(a, m) for a in x.den))
        return rename(x, m)

    return go(t, {})


def same(a, b) -> bool:
    return canon(a) == canon(b)


def _key(t) -> str:
    return repr(canon(t))


def walk_terms(t):
    yield t
    if isinstance(t, Red):
        yield from walk_terms(t.body)
    elif isinstance(t, Op):
        for a in t.args:
            yield from walk_terms(a)
    elif isinstance(t, Prod):
        for a in t.num + t.den:
            yield from walk_terms(a)


# ---- from the checked program to terms ---------------------------------------------------

_COMBINE = {"+": "add", "*": "mul", "min": "min", "max": "max"}


def output_term(defn: P.Definition, sizes: dict):
    """The single output's value as a normalized term in the inputs (variables @0, @1,
    ... for its dimensions), or None where recognition cannot follow the definition."""
    if len(defn.outputs) != 1:
        return None
    try:
        values = _Builder(defn, sizes).run()
        return normalize(values[defn.outputs[0].name])
    except (NoMatch, KeyError, ZeroDivisionError, OverflowError):
        return None


class _Builder:
    def __init__(self, defn: P.Definition, sizes: dict):
        self.defn, self.sizes = defn, sizes
        self.values: dict = {}
        self.fresh = itertools.count()

    def run(self) -> dict:
        for s in self.defn.statements:
            if s.condition is not None:
                raise NoMatch("a guarded sum's condition")
            shape = P.evaluate_shape(self.defn.tensor(s.target).shape, self.sizes)
            names = {}
            for pos, i in enumerate(s.indices):
                r = s.range_of(i)
                if r.lo.evaluate(self.sizes) != 0 or r.hi.evaluate(self.sizes) != shape[pos]:
                    raise NoMatch("a statement writes part of its tensor")
                names[i] = f"@{pos}"
            axes = []
            for i in s.reduction_indices:
                r = s.range_of(i)
                v = f"r{next(self.fresh)}"
                names[i] = v
                axes.append((v, r.lo.evaluate(self.sizes), r.hi.evaluate(self.sizes)))
            rhs = self.term(s.rhs, names)
            if s.op == "=":
                value = rhs
            else:
                value = Red(s.op, tuple(axes), rhs) if axes else rhs
                if not s.reset and s.target in self.values:
                    value = Op(_COMBINE[s.op], (self.values[s.target], value))
                elif not s.reset and s.op != "+":
                    raise NoMatch("a product, min or max into zeros")  # += into zeros: +=!
            self.values[s.target] = value
        return self.values

    def lin(self, a, names: dict) -> Lin:
        terms = {}
        for atom, coef in a.terms:
            if isinstance(atom, str):
                atom = names[atom]
            else:
                atom = LDiv(self.lin(atom.inner, names), atom.divisor, atom.kind)
            terms[atom] = terms.get(atom, 0) + coef
        return Lin(tuple(sorted(((x, c) for x, c in terms.items() if c), key=_atom_key)),
                   a.offset.evaluate(self.sizes))

    def term(self, e, names: dict):
        t = type(e)
        if t is P.Const:
            return K(float(e.value))
        if t is P.IndexValue:
            return Ix(Lin(((names[e.name], 1),), 0))
        if t is P.SizeValue:
            return K(float(self.sizes[e.name]))
        if t is P.Read:
            if any(a is None for a in e.affine):
                raise NoMatch("a gather")
            subs = tuple(self.lin(a, names) for a in e.affine)
            if self.defn.tensor(e.tensor).role == "input":
                return In(e.tensor, subs)
            if e.tensor not in self.values:
                raise NoMatch("a read before any write")
            plain = [s.var() for s in subs]
            if any(v is None for v in plain):
                raise NoMatch("a temporary read off its points")
            return rename(self.values[e.tensor], {f"@{k}": v for k, v in enumerate(plain)})
        if t is P.Unary:
            return Op(e.op, (self.term(e.operand, names),))
        if t is P.Binary or t is P.Compare:
            return Op(e.op, (self.term(e.lhs, names), self.term(e.rhs, names)))
        if t is P.Select:
            return Op("select", (self.term(e.cond, names), self.term(e.then, names),
                                 self.term(e.other, names)))
        if t is P.Call:
            return Op(e.name, tuple(self.term(a, names) for a in e.args))
        if t is P.Cast:
            return self.term(e.operand, names)
        raise NoMatch(f"a {t.__name__}")


_FOLD = {"add": lambda a, b: a + b, "sub": lambda a, b: a - b, "neg": lambda a: -a,
         "exp": math.exp, "sqrt": math.sqrt}


def normalize(t):
    """Products flattened into `Prod`, constants folded, factors that do not move along a
    sum's variables taken out of the sum, rsqrt and pow spelled with sqrt and products."""
    if isinstance(t, Red):
        body = normalize(t.body)
        if t.op == "+" and isinstance(body, Prod):
            bound = {v for v, _, _ in t.axes}
            out_num = tuple(f for f in body.num if not free(f) & bound)
            out_den = tuple(f for f in body.den if not free(f) & bound)
            if out_num or out_den or body.coef != 1:
                inner = prod(1.0, tuple(f for f in body.num if free(f) & bound),
                             tuple(f for f in body.den if free(f) & bound))
                return prod(body.coef, out_num + (Red(t.op, t.axes, inner),), out_den)
        return Red(t.op, t.axes, body)
    if isinstance(t, Prod):
        return prod(t.coef, tuple(normalize(a) for a in t.num),
                    tuple(normalize(a) for a in t.den))
    if not isinstance(t, Op):
        return t
    args = tuple(normalize(a) for a in t.args)
    name = t.name
    index = _index_arithmetic(name, args)
    if index is not None:
        return index
    if name == "mul":
        return prod(1.0, args, ())
    if name in ("div", "fdivide"):
        return prod(1.0, (args[0],), (args[1],))
    if name == "neg":
        return prod(-1.0, args, ())
    if name == "rsqrt":
        return prod(1.0, (), (Op("sqrt", args),))
    if name == "pow" and isinstance(args[1], K):
        x, p = args[0], args[1].value
        if p == 2:
            return prod(1.0, (x, x), ())
        if p == 0.5:
            return Op("sqrt", (x,))
        if p == -0.5:
            return prod(1.0, (), (Op("sqrt", (x,)),))
        if p == 1:
            return x
        if p == -1:
            return prod(1.0, (), (x,))
    if name in _FOLD and all(isinstance(a, K) for a in args):
        try:
            return K(float(_FOLD[name](*(a.value for a in args))))
        except (ValueError, OverflowError):
            pass
    if name == "sub" and isinstance(args[1], K) and args[1].value == 0:
        return args[0]
    if name == "add" and isinstance(args[1], K) and args[1].value == 0:
        return args[0]
    return Op(name, args)


def _as_lin(t) -> Lin | None:
    if isinstance(t, Ix):
        return t.lin
    if isinstance(t, K) and float(t.value).is_integer():
        return Lin((), int(t.value))
    return None


def _index_arithmetic(name: str, args: tuple) -> Ix | None:
    """`i + 1`, `i - j`, `2 * i` on index values as one index expression (so that
    `j < i + 1` and `j <= i` compare alike)."""
    lins = [_as_lin(a) for a in args]
    if any(x is None for x in lins) or not any(isinstance(a, Ix) for a in args):
        return None
    if name == "add":
        return Ix(_sub(lins[0], _sub(Lin((), 0), lins[1])))
    if name == "sub":
        return Ix(_sub(lins[0], lins[1]))
    if name == "neg":
        return Ix(_sub(Lin((), 0), lins[0]))
    if name == "mul" and (not lins[0].terms or not lins[1].terms):
        k, x = (lins[0].const, lins[1]) if not lins[0].terms else (lins[1].const, lins[0])
        return Ix(Lin(tuple((a, c * k) for a, c in x.terms if c * k), x.const * k))
    return None


def prod(coef: float, num: tuple, den: tuple):
    """A canonical product: nested products merged, constants multiplied into `coef`."""
    flat_num, flat_den = [], []

    def add(f, into_num: bool):
        nonlocal coef
        if isinstance(f, Prod):
            coef = coef * f.coef if into_num else coef / f.coef
            for g in f.num:
                add(g, into_num)
            for g in f.den:
                add(g, not into_num)
        elif isinstance(f, K) and (into_num or f.value != 0):
            coef = coef * f.value if into_num else coef / f.value
        else:
            (flat_num if into_num else flat_den).append(f)

    for f in num:
        add(f, True)
    for f in den:
        add(f, False)
    flat_num.sort(key=_key)
    flat_den.sort(key=_key)
    if not flat_num and not flat_den:
        return K(coef)
    if coef == 1 and len(flat_num) == 1 and not flat_den:
        return flat_num[0]
    return Prod(coef, tuple(flat_num), tuple(flat_den))


def factors(t) -> tuple[float, tuple, tuple]:
    """(coef, numerator factors, denominator factors) of any term."""
    if isinstance(t, Prod):
        return t.coef, t.num, t.den
    if isinstance(t, K):
        return t.value, (), ()
    return 1.0, (t,), ()


def inequality(cond) -> Lin | None:
    """A comparison of index expressions as `lin >= 0`, or None."""
    if not isinstance(cond, Op) or cond.name not in ("lt", "le", "gt", "ge") or \
            len(cond.args) != 2:
        return None
    sides = []
    for a in cond.args:
        if isinstance(a, Ix):
            sides.append(a.lin)
        elif isinstance(a, K) and float(a.value).is_integer():
            sides.append(Lin((), int(a.value)))
        else:
            return None
    a, b = sides
    diff = _sub(a, b) if cond.name in ("ge", "gt") else _sub(b, a)
    return replace(diff, const=diff.const - 1) if cond.name in ("lt", "gt") else diff


def _sub(a: Lin, b: Lin) -> Lin:
    terms = dict(a.terms)
    for atom, coef in b.terms:
        terms[atom] = terms.get(atom, 0) - coef
    return Lin(tuple(sorted(((x, c) for x, c in terms.items() if c), key=_atom_key)),
               a.const - b.const)


# ---- operators ---------------------------------------------------------------------------

@dataclass
class Operator:
    """A recognised operator: NumPy and PyTorch calls computing the definition's output
    from its inputs (in the definition's order), and what they are called."""

    name: str  # e.g. "conv2d, stride 2, padding 1"
    numpy: Callable  # numpy(arrays) -> the output
    numpy_text: str  # e.g. "np.einsum('ik,kj->ij', optimize=True)"
    torch: Callable | None = None  # torch(tensors) -> the output
    torch_text: str | None = None


def recognise(defn: P.Definition, sizes: dict) -> Operator | None:
    """The library operator `defn` computes for `sizes`, from its structure; None if it
    is none that tclang knows, or has no single floating-point output."""
    if len(defn.outputs) != 1 or not defn.outputs[0].dtype.is_float or \
            not all(t.dtype.is_float for t in defn.inputs):
        return None
    term = output_term(defn, sizes)
    if term is None:
        return None
    shape = {t.name: P.evaluate_shape(t.shape, sizes) for t in defn.inputs}
    out = P.evaluate_shape(defn.outputs[0].shape, sizes)
    order = [t.name for t in defn.inputs]
    for match in (_einsum, _convolution, _pooling, _cumsum, _softmax, _layernorm,
                  _attention, _with_bias):
        try:
            found = match(term, shape, out, order)
        except NoMatch:
            found = None
        if found is not None:
            return found
    return None


def _with_bias(term, shape, out, order) -> Operator | None:
    """A contraction or a convolution, plus a bias broadcast along the output, then
    optionally a ReLU (`fmax(x, 0)`): an MLP layer, a convolution layer."""
    relu = False
    if isinstance(term, Op) and term.name in ("fmax", "max") and len(term.args) == 2:
        zero = [a for a in term.args if isinstance(a, K) and a.value == 0]
        if len(zero) == 1:
            term = next(a for a in term.args if a is not zero[0])
            relu = True
    bias, core = None, term
    if isinstance(term, Op) and term.name == "add":
        for a, b in (term.args, term.args[::-1]):
            subs = [x.var() for x in b.subs] if isinstance(b, In) else None
            if subs is not None and None not in subs and len(set(subs)) == len(subs) and \
                    set(subs) <= set(_outvars(out)) and isinstance(a, Red):
                bias, core = b, a
                break
    if bias is None and not relu:
        return None
    found = None
    for match in (_einsum, _convolution):
        found = match(core, shape, out, order)
        if found is not None:
            break
    if found is None:
        return None
    subs = [x.var() for x in bias.subs] if bias is not None else []
    dims = [subs.index(v) if v in subs else None for v in _outvars(out)]
    bi = order.index(bias.tensor) if bias is not None else None
    inner_numpy, inner_torch = found.numpy, found.torch

    def numpy(xs):
        y = inner_numpy(xs)
        if bi is not None:
            y = y + _arrange(xs[bi], dims)
        return np.maximum(y, 0) if relu else y

    def torch_call(ts):
        import torch
        y = inner_torch(ts)
        if bi is not None:
            y = y + _arrange(ts[bi], dims)
        return torch.relu(y) if relu else y

    extra = (" + bias" if bias is not None else "") + (", then ReLU" if relu else "")
    return Operator(found.name + extra, numpy, found.numpy_text + extra, torch_call,
                    found.torch_text + extra)


def _outvars(out) -> list[str]:
    return [f"@{k}" for k in range(len(out))]


def _plain_reads(fs) -> bool:
    return all(isinstance(f, In) and all(s.var() is not None for s in f.subs) for f in fs)


def _einsum(term, shape, out, order) -> Operator | None:
    axes, body = ((), term)
    if isinstance(term, Red) and term.op == "+":
        axes, body = term.axes, term.body
    coef, num, den = factors(body)
    if coef != 1 or den or not num or not _plain_reads(num):
        return None
    num = sorted(num, key=lambda f: order.index(f.tensor))  # operands as the inputs come
    extent = dict(zip(_outvars(out), out))
    for v, lo, hi in axes:
        if lo != 0:
            return None
        extent[v] = hi
    used = set()
    for f in num:
        for s, n in zip(f.subs, shape[f.tensor]):
            if extent.get(s.var()) != n:
                return None
            used.add(s.var())
    if not set(_outvars(out)) <= used or len(extent) > 52:
        return None
    letters = {v: "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"[k]
               for k, v in enumerate(extent)}
    spec = ",".join("".join(letters[s.var()] for s in f.subs) for f in num) + "->" + \
        "".join(letters[v] for v in _outvars(out))
    spec = _pretty_spec(spec)
    picks = [order.index(f.tensor) for f in num]

    def numpy(xs):
        return np.einsum(spec, *[xs[k] for k in picks], optimize=True)

    def torch_call(ts):
        import torch
        return torch.einsum(spec, *[ts[k] for k in picks])

    return Operator(f"einsum {spec!r}", numpy, f"np.einsum({spec!r}, optimize=True)",
                    torch_call, f"torch.einsum({spec!r})")


def _pretty_spec(spec: str) -> str:
    """Letters renamed i, j, k, ... in order of first appearance (what a person writes)."""
    names = {}
    pool = iter("ijklmnopqrstuvwxyzabcdefghABCDEFGHIJKLMNOPQRSTUVWXYZ")
    out = []
    for ch in spec:
        if ch.isalpha():
            if ch not in names:
                names[ch] = next(pool)
            out.append(names[ch])
        else:
            out.append(ch)
    return "".join(out)


def _unguard(t, empty: float):
    """`t` without `?:` guards whose other branch is the constant `empty` (padding), in
    the term or in its factors; (term, whether a guard was removed)."""
    guarded = False
    while isinstance(t, Op) and t.name == "select" and isinstance(t.args[2], K) and \
            _is(t.args[2].value, empty):
        t, guarded = t.args[1], True
    if isinstance(t, Prod) and empty == 0:
        num = []
        for f in t.num:
            g, was = _unguard(f, 0.0)
            num.append(g)
            guarded |= was
        t = Prod(t.coef, tuple(num), t.den)
    return t, guarded


def _is(value: float, empty: float) -> bool:
    if empty == -math.inf:
        return value <= -1e9
    return value == empty


@dataclass
class _Window:
    """One windowed dimension of a read: input dim `dim` at stride x out + dilation x
    kernel variable + offset (offset <= 0: padding)."""

    dim: int
    out: str
    kernel: str | None
    stride: int
    dilation: int
    offset: int


def _window(sub: Lin, dim: int, outs: set, kernels: dict) -> _Window | None:
    if any(not isinstance(a, str) for a, _ in sub.terms) or sub.const > 0:
        return None
    o = [(a, c) for a, c in sub.terms if a in outs]
    k = [(a, c) for a, c in sub.terms if a in kernels]
    if len(o) != 1 or len(k) > 1 or len(o) + len(k) != len(sub.terms) or o[0][1] < 1 or \
            (k and k[0][1] < 1) or (not k and o[0][1] == 1 and sub.const == 0):
        return None
    return _Window(dim, o[0][0], k[0][0] if k else None, o[0][1], k[0][1] if k else 1,
                   sub.const)


def _right_pads(windows, sizes, kernel_extents, out_extents):
    """Padding after the data so that every output's window fits."""
    pads = []
    for w, n, kx, o in zip(windows, sizes, kernel_extents, out_extents):
        need = w.stride * (o - 1) + w.dilation * (kx - 1) + 1
        pads.append(max(0, need - (n - w.offset)))
    return pads


def _arrange(a, dims):
    """`a` transposed so its axes follow `dims` (axis numbers of `a`), with size-1 axes
    where `dims` has None (NumPy arrays and PyTorch tensors alike)."""
    present = [d for d in dims if d is not None]
    a = a.permute(*present) if hasattr(a, "permute") else a.transpose(present)
    shape, it = [], iter(a.shape)
    for d in dims:
        shape.append(next(it) if d is not None else 1)
    return a.reshape(tuple(shape))


def _unarrange(y, dims):
    """The inverse of `_arrange` for an output: `y`'s axes are roles, `dims[r]` the
    output axis of role r (None: a size-1 axis to drop)."""
    keep = [r for r, d in enumerate(dims) if d is not None]
    y = y.reshape(tuple(y.shape[r] for r in keep))
    where = [dims[r] for r in keep]
    perm = [where.index(p) for p in range(len(where))]
    return y.permute(*perm) if hasattr(y, "permute") else y.transpose(perm)


def _convolution(term, shape, out, order) -> Operator | None:
    if not isinstance(term, Red) or term.op != "+":
        return None
    body, padded = _unguard(term.body, 0.0)
    coef, num, den = factors(body)
    if coef != 1 or den or len(num) != 2 or not all(isinstance(f, In) for f in num):
        return None
    kernels = {v: (lo, hi) for v, lo, hi in term.axes}
    if any(lo != 0 for lo, _ in kernels.values()):
        return None
    outs = set(_outvars(out))
    plain = [all(s.var() is not None for s in f.subs) for f in num]
    if plain[0] == plain[1]:
        return None
    w, x = (num[0], num[1]) if plain[0] else (num[1], num[0])
    if x.tensor == w.tensor:
        return None
    windows, x_plain = [], {}
    for dim, s in enumerate(x.subs):
        if s.var() is not None:
            x_plain[s.var()] = dim
            continue
        win = _window(s, dim, outs, kernels)
        if win is None:
            return None
        windows.append(win)
    w_plain = {s.var(): dim for dim, s in enumerate(w.subs)}
    if len(w_plain) != len(w.subs) or len(x_plain) + len(windows) != len(x.subs) or \
            not 1 <= len(windows) <= 3:
        return None
    batch = [v for v in x_plain if v in outs and v not in w_plain]
    group = [v for v in x_plain if v in outs and v in w_plain]
    channel = [v for v in x_plain if v in kernels and v in w_plain]
    out_channel = [v for v in w_plain if v in outs and v not in x_plain]
    kernel_vars = [win.kernel for win in windows if win.kernel is not None]
    if len(batch) > 1 or len(group) > 1 or len(channel) > 1 or len(out_channel) > 1 or \
            len(set(kernel_vars)) != len(kernel_vars) or \
            set(w_plain) != set(group + channel + out_channel + kernel_vars) or \
            set(kernels) != set(channel + kernel_vars) or \
            set(x_plain) != set(batch + group + channel):
        return None
    out_dims = {v: int(v[1:]) for v in outs}
    spatial_outs = [win.out for win in windows]
    if len(set(spatial_outs)) != len(spatial_outs) or \
            outs != set(batch + group + out_channel + spatial_outs):
        return None
    nd = len(windows)
    kext = [kernels[win.kernel][1] if win.kernel else 1 for win in windows]
    xs = [shape[x.tensor][win.dim] for win in windows]
    os_ = [out[out_dims[win.out]] for win in windows]
    left = [-win.offset for win in windows]
    if any(p > 0 for p in left) and not padded:
        return None
    right = _right_pads(windows, xs, kext, os_)
    stride = [win.stride for win in windows]
    dilation = [win.dilation for win in windows]
    groups = shape[x.tensor][x_plain[group[0]]] if group else 1
    x_dims = [x_plain.get(v) for v in batch[:1] or [None]] + \
        [x_plain[group[0]] if group else None] + \
        [x_plain[channel[0]] if channel else None] + [win.dim for win in windows]
    k_dims = [w_plain[group[0]] if group else None] + \
        [w_plain[out_channel[0]] if out_channel else None] + \
        [w_plain[channel[0]] if channel else None] + \
        [w_plain[win.kernel] if win.kernel else None for win in windows]
    o_dims = [out_dims[batch[0]] if batch else None] + \
        [out_dims[group[0]] if group else None] + \
        [out_dims[out_channel[0]] if out_channel else None] + \
        [out_dims[win.out] for win in windows]
    xi, wi = order.index(x.tensor), order.index(w.tensor)

    def prepare(xs_):
        a = _arrange(xs_[xi], x_dims)  # (N, G, C, *S)
        b = _arrange(xs_[wi], k_dims)  # (G, M, C, *K)
        a = a.reshape((a.shape[0], a.shape[1] * a.shape[2]) + tuple(a.shape[3:]))
        b = b.reshape((b.shape[0] * b.shape[1],) + tuple(b.shape[2:]))
        return a, b

    def finish(y):
        y = y.reshape((y.shape[0], groups, y.shape[1] // groups) + tuple(y.shape[2:]))
        return _unarrange(y[(Ellipsis,) + tuple(slice(0, o) for o in os_)], o_dims)

    def numpy(xs_):
        a, b = prepare(xs_)
        a = np.pad(a, [(0, 0), (0, 0)] + list(zip(left, right)))
        return finish(_numpy_conv(a, b, groups, stride, dilation, os_))

    def torch_call(ts):
        import torch.nn.functional as F
        a, b = prepare(ts)
        a = F.pad(a, [p for pair in reversed(list(zip(left, right))) for p in pair])
        conv = (F.conv1d, F.conv2d, F.conv3d)[nd - 1]
        return finish(conv(a, b, stride=stride, dilation=dilation, groups=groups))

    words = [f"conv{nd}d"]
    if any(s != 1 for s in stride):
        words.append(f"stride {_tuple_text(stride)}")
    if any(left) or any(right):
        words.append("padding " + (_tuple_text(left) if left == right or not any(right)
                                   else f"{_tuple_text(left)} before, {_tuple_text(right)} after"))
    if any(d != 1 for d in dilation):
        words.append(f"dilation {_tuple_text(dilation)}")
    if groups != 1:
        words.append(f"{groups} groups")
    return Operator(", ".join(words), numpy, "NumPy sliding windows + np.einsum (it has "
                    "no convolution)", torch_call, f"torch.nn.functional.conv{nd}d")


def _tuple_text(values) -> str:
    return str(values[0]) if len(set(values)) == 1 else "x".join(map(str, values))


def _windows_of(a, spans, stride, dilation, outs):
    """NumPy: every output position's window of `a` (its last len(spans) axes): shape
    (..., *outs, *kernel)."""
    nd = len(spans)
    view = np.lib.stride_tricks.sliding_window_view(a, spans, axis=tuple(range(-nd, 0)))
    index = (Ellipsis,) + tuple(slice(0, s * (o - 1) + 1, s) for s, o in zip(stride, outs)) \
        + tuple(slice(None, None, d) for d in dilation)
    return view[index]


def _numpy_conv(a, b, groups, stride, dilation, outs):
    nd = len(outs)
    n, gc = a.shape[:2]
    gm, c = b.shape[:2]
    kernel = b.shape[2:]
    spans = [d * (k - 1) + 1 for d, k in zip(dilation, kernel)]
    win = _windows_of(a, spans, stride, dilation, outs)  # (N, G*C, *outs, *kernel)
    win = win.reshape((n, groups, c) + tuple(outs) + tuple(kernel))
    wg = b.reshape((groups, gm // groups, c) + tuple(kernel))
    o, k = "xyz"[:nd], "uvw"[:nd]
    y = np.einsum(f"ngc{o}{k},gmc{k}->ngm{o}", win, wg, optimize=True)
    return y.reshape((n, gm) + tuple(outs))


def _pooling(term, shape, out, order) -> Operator | None:
    coef, num, den = factors(term)
    red = num[0] if len(num) == 1 and not den else None
    if not isinstance(red, Red) or red.op not in ("max", "+") or \
            (red.op == "max" and coef != 1):
        return None
    body, padded = _unguard(red.body, -math.inf if red.op == "max" else 0.0)
    inner, body_num, body_den = factors(body)
    if len(body_num) != 1 or body_den or (red.op == "max" and inner != 1):
        return None
    body, coef = body_num[0], coef * inner
    if not isinstance(body, In):
        return None
    kernels = {v: (lo, hi) for v, lo, hi in red.axes}
    if any(lo != 0 for lo, _ in kernels.values()):
        return None
    outs = set(_outvars(out))
    windows, plain = [], {}
    for dim, s in enumerate(body.subs):
        if s.var() in outs:
            plain[s.var()] = dim
            continue
        win = _window(s, dim, outs, kernels)
        if win is None or win.kernel is None:
            return None
        windows.append(win)
    if not 1 <= len(windows) <= 3 or \
            sorted(w.kernel for w in windows) != sorted(kernels) or \
            outs != set(plain) | {w.out for w in windows} or \
            len({w.out for w in windows}) != len(windows):
        return None
    nd = len(windows)
    kext = [kernels[w.kernel][1] for w in windows]
    xs = [shape[body.tensor][w.dim] for w in windows]
    out_dims = {v: int(v[1:]) for v in outs}
    os_ = [out[out_dims[w.out]] for w in windows]
    left = [-w.offset for w in windows]
    if any(p > 0 for p in left) and not padded:
        return None
    right = _right_pads(windows, xs, kext, os_)
    stride = [w.stride for w in windows]
    dilation = [w.dilation for w in windows]
    lead = [plain[v] for v in sorted(plain, key=lambda v: plain[v])]
    o_dims = [out_dims[v] for v in sorted(plain, key=lambda v: plain[v])] + \
        [out_dims[w.out] for w in windows]
    xi = order.index(body.tensor)
    fill = -math.inf if red.op == "max" else 0.0
    scale = coef * math.prod(kext) if red.op == "+" else 1.0

    def flat(a):
        a = _arrange(a, lead + [w.dim for w in windows])
        return a.reshape((1, math.prod(a.shape[:len(lead)])) + tuple(a.shape[len(lead):]))

    def finish(y):
        y = y[(Ellipsis,) + tuple(slice(0, o) for o in os_)]
        y = y.reshape(tuple(shape[body.tensor][d] for d in lead) + tuple(os_))
        return _unarrange(y, o_dims)

    def numpy(xs_):
        a = np.pad(flat(xs_[xi]), [(0, 0), (0, 0)] + list(zip(left, right)),
                   constant_values=fill)
        win = _windows_of(a, [d * (k - 1) + 1 for d, k in zip(dilation, kext)], stride,
                          dilation, os_)
        axes = tuple(range(-nd, 0))
        y = win.max(axis=axes) if red.op == "max" else win.sum(axis=axes) * coef
        return finish(y)

    def torch_call(ts):
        import torch.nn.functional as F
        a = F.pad(flat(ts[xi]), [p for pair in reversed(list(zip(left, right)))
                                 for p in pair], value=fill)
        if red.op == "max":
            pool = (F.max_pool1d, F.max_pool2d, F.max_pool3d)[nd - 1]
            return finish(pool(a, kext, stride, dilation=dilation))
        pool = (F.avg_pool1d, F.avg_pool2d, F.avg_pool3d)[nd - 1]
        y = pool(a, kext, stride)
        return finish(y * scale if scale != 1 else y)

    if red.op == "+" and any(d != 1 for d in dilation):
        return None  # PyTorch's average pooling has no dilation
    kind = "max" if red.op == "max" else "avg"
    words = [f"{kind}_pool{nd}d, window {_tuple_text(kext)}"]
    if stride != kext:
        words.append(f"stride {_tuple_text(stride)}")
    if any(left) or any(right):
        words.append(f"padding {_tuple_text(left)}")
    if any(d != 1 for d in dilation):
        words.append(f"dilation {_tuple_text(dilation)}")
    if scale != 1:
        words.append(f"times {scale:g}")
    return Operator(", ".join(words), numpy,
                    f"NumPy sliding windows + np.{'max' if kind == 'max' else 'sum'}",
                    torch_call, f"torch.nn.functional.{kind}_pool{nd}d")


def _identity_read(t, out) -> In | None:
    """`t` if it reads an input at exactly the output's point (X(@0, @1, ...))."""
    if isinstance(t, In) and [s.var() for s in t.subs] == _outvars(out):
        return t
    return None


def _cumsum(term, shape, out, order) -> Operator | None:
    if not isinstance(term, Red) or term.op != "+" or len(term.axes) != 1:
        return None
    (j, lo, hi), body = term.axes[0], term.body
    cond = None
    if isinstance(body, Op) and body.name == "select" and isinstance(body.args[2], K) and \
            body.args[2].value == 0:
        cond, body = body.args[0], body.args[1]
    elif isinstance(body, Prod) and body.coef == 1 and not body.den and len(body.num) == 2:
        compare = [f for f in body.num if inequality(f) is not None]
        if len(compare) == 1:
            cond = compare[0]
            body = next(f for f in body.num if f is not cond)
    if cond is None or not isinstance(body, In) or lo != 0:
        return None
    subs = [s.var() for s in body.subs]
    outs = _outvars(out)
    if len(subs) != len(outs) or subs.count(j) != 1:
        return None
    axis = subs.index(j)
    if [v for k, v in enumerate(subs) if k != axis] != [v for k, v in enumerate(outs)
                                                       if k != axis] or \
            hi != out[axis] or list(shape[body.tensor]) != list(out):
        return None
    if inequality(cond) != Lin(tuple(sorted(((outs[axis], 1), (j, -1)), key=_atom_key)), 0):
        return None  # only the inclusive prefix sum: j <= i
    xi = order.index(body.tensor)

    def torch_call(ts):
        import torch
        return torch.cumsum(ts[xi], dim=axis)

    return Operator(f"cumsum over axis {axis}", lambda xs: np.cumsum(xs[xi], axis=axis),
                    f"np.cumsum(axis={axis})", torch_call, f"torch.cumsum(dim={axis})")


def _exp_of(t):
    """The argument u of exp(u), or None."""
    if isinstance(t, Op) and t.name in ("exp", "expf") and len(t.args) == 1:
        return t.args[0]
    return None


def _unshift(u, axis_var: str):
    """softmax is shift-invariant: exp(u - c) with c constant along the axis is exp(u)."""
    if isinstance(u, Op) and u.name == "sub" and axis_var not in free(u.args[1]):
        return u.args[0]
    return u


def _normalized_exp(term, out_vars):
    """(E, axis variable, sum's variable) when term = E / sum over the axis of E."""
    coef, num, den = factors(term)
    if coef != 1 or len(den) != 1 or not isinstance(den[0], Red) or den[0].op != "+" or \
            len(den[0].axes) != 1:
        return None
    (r, lo, hi), total = den[0].axes[0], den[0].body
    rest = num
    for k, e in enumerate(rest):
        for v in out_vars:
            if v in free(e) and same(rename(e, {v: r}), total):
                return e, v, (lo, hi), rest[:k] + rest[k + 1:]
    return None


def _softmax(term, shape, out, order) -> Operator | None:
    found = _normalized_exp(term, _outvars(out))
    if found is None:
        return None
    e, v, (lo, hi), rest = found
    axis = int(v[1:])
    u = _exp_of(e)
    if rest or u is None or lo != 0 or hi != out[axis]:
        return None
    u = _unshift(u, v)
    scale, num, den = factors(u)
    x = _identity_read(num[0], out) if len(num) == 1 and not den else None
    if x is None or list(shape[x.tensor]) != list(out):
        return None
    xi = order.index(x.tensor)

    def numpy(xs):
        z = xs[xi] * scale if scale != 1 else xs[xi]
        z = np.exp(z - z.max(axis=axis, keepdims=True))
        return z / z.sum(axis=axis, keepdims=True)

    def torch_call(ts):
        import torch
        return torch.softmax(ts[xi] * scale if scale != 1 else ts[xi], dim=axis)

    what = f"softmax over axis {axis}" + (f" of {scale:g} x the input" if scale != 1 else "")
    return Operator(what, numpy, f"NumPy exp / sum over axis {axis}", torch_call,
                    f"torch.softmax(dim={axis})")


def _layernorm(term, shape, out, order) -> Operator | None:
    """Y = (X - mean) / sqrt(var + eps) [* gamma] [+ beta] over one axis. The formula
    inside is not checked term by term (mean and variance have many spellings): the
    skeleton is, and users of the peer confirm it on the data."""
    reads = [t for t in walk_terms(term) if isinstance(t, In)]
    xs = {r.tensor for r in reads if _identity_read(r, out) is not None}
    if len(xs) != 1:
        return None
    x = xs.pop()
    if list(shape[x]) != list(out):
        return None
    reds = [t for t in walk_terms(term) if isinstance(t, Red)]
    if not reds or any(r.op != "+" or len(r.axes) != 1 for r in reds):
        return None
    bound = {r.axes[0][0] for r in reds}
    axes = set()
    for read in reads:
        if read.tensor != x:
            continue  # the scale and shift vectors: checked below
        subs = [s.var() for s in read.subs]
        moved = [k for k, v in enumerate(subs) if v != f"@{k}"]
        if len(moved) > 1 or (moved and subs[moved[0]] not in bound):
            return None
        axes.update(moved)
    if len(axes) != 1:
        return None
    axis = axes.pop()
    av = f"@{axis}"
    if any(r.axes[0][1] != 0 or r.axes[0][2] != out[axis] for r in reds):
        return None
    roots = list({_key(t): t for t in walk_terms(term)
                  if isinstance(t, Op) and t.name == "sqrt"}.values())
    centred = [t for t in walk_terms(term) if isinstance(t, Op) and t.name == "sub" and
               _identity_read(t.args[0], out) is not None and av not in free(t.args[1]) and
               any(isinstance(s, Red) for s in walk_terms(t.args[1]))]
    if len(roots) != 1 or not centred:
        return None
    inside = roots[0].args[0]
    eps = 0.0
    if isinstance(inside, Op) and inside.name == "add":
        constants = [a.value for a in inside.args if isinstance(a, K)]
        eps = constants[0] if constants else 0.0
    vectors = {r.tensor for r in reads if r.tensor != x}
    if any(len(shape[v]) != 1 or shape[v][0] != out[axis] for v in vectors):
        return None
    beta = gamma = None
    main = term
    if isinstance(term, Op) and term.name == "add":
        for a, b in (term.args, term.args[::-1]):
            if isinstance(b, In) and b.tensor in vectors and [s.var() for s in b.subs] == [av]:
                beta, main = b.tensor, a
                break
    for f in factors(main)[1]:
        if isinstance(f, In) and f.tensor in vectors and [s.var() for s in f.subs] == [av]:
            gamma = f.tensor
    if vectors != {v for v in (gamma, beta) if v is not None}:
        return None
    xi = order.index(x)
    gi = order.index(gamma) if gamma else None
    bi = order.index(beta) if beta else None

    def numpy(xs_):
        a = np.moveaxis(xs_[xi], axis, -1)
        mean = a.mean(axis=-1, keepdims=True)
        var = ((a - mean) ** 2).mean(axis=-1, keepdims=True)
        y = (a - mean) / np.sqrt(var + eps)
        if gi is not None:
            y = y * xs_[gi]
        if bi is not None:
            y = y + xs_[bi]
        return np.moveaxis(y, -1, axis)

    def torch_call(ts):
        import torch.nn.functional as F
        a = ts[xi].movedim(axis, -1)
        y = F.layer_norm(a, (a.shape[-1],), ts[gi] if gi is not None else None,
                         ts[bi] if bi is not None else None, eps)
        return y.movedim(-1, axis)

    parts = [p for p, v in (("scale", gamma), ("shift", beta)) if v]
    what = f"layer_norm over axis {axis}, eps {eps:g}" + \
        (f", with {' and '.join(parts)}" if parts else "")
    return Operator(what, numpy, "NumPy mean / var", torch_call,
                    f"torch.nn.functional.layer_norm(eps={eps:g})")


def _attention(term, shape, out, order) -> Operator | None:
    """O = sum_j softmax_j(scale x sum_d Q(i, d) K(j, d) [causal mask]) V(j, e), with
    optional leading batch dimensions shared by Q, K, V and O."""
    found = _normalized_exp_sum(term)
    if found is None:
        return None
    e, j, v_read = found
    mask = None
    if isinstance(e, Op) and e.name == "select" and isinstance(e.args[2], K) and \
            e.args[2].value == 0:
        mask, e = e.args[0], e.args[1]
    u = _exp_of(e)
    if u is None:
        return None
    u = _unshift(u, j)
    if isinstance(u, Op) and u.name == "select" and isinstance(u.args[2], K) and \
            u.args[2].value <= -1e9:
        if mask is not None:
            return None
        mask, u = u.args[0], u.args[1]
    scale, num, den = factors(u)
    if den or len(num) != 1 or not isinstance(num[0], Red) or num[0].op != "+" or \
            len(num[0].axes) != 1:
        return None
    (d, dlo, dhi), dot = num[0].axes[0], num[0].body
    dc, pair, pden = factors(dot)
    if dc != 1 or pden or len(pair) != 2 or not _plain_reads(pair + (v_read,)):
        return None
    outs = _outvars(out)
    i_var, e_var = outs[-2], outs[-1]
    batch = outs[:-2]
    q = next((r for r in pair if [s.var() for s in r.subs] == batch + [i_var, d]), None)
    k = next((r for r in pair if [s.var() for s in r.subs] == batch + [j, d]), None)
    if q is None or k is None or [s.var() for s in v_read.subs] != batch + [j, e_var]:
        return None
    causal = False
    if mask is not None:
        if inequality(mask) != Lin(tuple(sorted(((i_var, 1), (j, -1)), key=_atom_key)), 0):
            return None
        causal = True
    qi, ki, vi = (order.index(r.tensor) for r in (q, k, v_read))
    if dlo != 0 or dhi != shape[q.tensor][-1]:
        return None

    def numpy(xs):
        s = np.matmul(xs[qi], np.swapaxes(xs[ki], -1, -2)) * scale
        if causal:
            s = np.where(np.tril(np.ones(s.shape[-2:], bool)), s, -np.inf)
        s = np.exp(s - s.max(axis=-1, keepdims=True))
        return np.matmul(s / s.sum(axis=-1, keepdims=True), xs[vi])

    def torch_call(ts):
        import torch.nn.functional as F
        return F.scaled_dot_product_attention(ts[qi], ts[ki], ts[vi], is_causal=causal,
                                              scale=scale)

    what = f"attention, scale {scale:g}" + (", causal mask" if causal else "")
    return Operator(what, numpy, "NumPy matmul, softmax, matmul", torch_call,
                    f"torch.nn.functional.scaled_dot_product_attention(is_causal={causal})")


def _normalized_exp_sum(term):
    """(E, j, V) when term = sum_j E V / sum_j E (E's division taken out of the sum)."""
    coef, num, den = factors(term)
    if coef != 1 or len(num) != 1 or len(den) != 1:
        return None
    top, bottom = num[0], den[0]
    if not (isinstance(top, Red) and isinstance(bottom, Red) and top.op == bottom.op == "+"
            and len(top.axes) == len(bottom.axes) == 1):
        return None
    (j, lo, hi), (j2, lo2, hi2) = top.axes[0], bottom.axes[0]
    if (lo, hi) != (lo2, hi2) or lo != 0:
        return None
    tc, tn, td = factors(top.body)
    if tc != 1 or td or len(tn) != 2:
        return None
    for e, v in (tn, tn[::-1]):
        if isinstance(v, In) and same(rename(e, {j: j2}), bottom.body):
            return e, j, v
    return None
