"""Terms: what a definition's output is, written in its inputs alone.

Recognition (tclang.peers) must not depend on how a definition is spelled, so the checked
program is rewritten first:

1. Every statement's value becomes a term in the inputs: temporaries and earlier values
   of a tensor are inlined where they are read (`output_term`), reductions become `Red`
   nodes over fresh variables, sizes become numbers (recognition is for one set of
   sizes), casts are dropped. Index names, temporaries, statement splits and the order of
   factors stop mattering: `rowmax`, `rowsum` and `Y` of a softmax, or the same softmax
   written in one line with `1 / sum` multiplied in, give one term.
2. `normalize` flattens products and quotients (`Prod`: a constant times factors over
   factors, in a canonical order), takes factors that do not move along a sum's variables
   out of it, spells `rsqrt(x)` as `1 / sqrt(x)` and `pow(x, 2)` as `x * x`, and folds
   index arithmetic into one affine index expression (`Lin`).

Variables: `@0`, `@1`, ... are the output's dimensions; `r0`, `r1`, ... the reduction
variables, fresh per statement, so inlining never captures one; `canon` renames bound
variables so that two terms can be compared up to their names (`same`).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, replace

from tclang.lang import program as P


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


def lin_of(coefficients: dict, const: int = 0) -> Lin:
    """The affine index expression sum(coefficient x variable) + const."""
    return Lin(tuple(sorted(((v, c) for v, c in coefficients.items() if c), key=_atom_key)),
               const)


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


def key(t) -> str:
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
    flat_num.sort(key=key)
    flat_den.sort(key=key)
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
