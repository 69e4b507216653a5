"""Recurrences (issue 35 item 2): statements that read their own target at earlier points.

Scans along one axis of a 1-3 dimensional tensor (a sum, a running max or min, a damped
sum, a `tanh` cell), shifted by 1 or 2, one or two reads back, or along a diagonal
(`O(i - 1, j - 1)`, `O(i - 1, j + 1)`); a recurrence after a first statement that wrote
the tensor (reading its value where the recurrence does not write), with `=` or onto it
with `+=`, `max=`, `min=` or `*=`; a recurrence into a
temporary that a later statement consumes; a forward substitution reading the diagonal
(a non-uniform read); an RNN-style cell; a sum, a max or a product that reads earlier
points of its own target, the forward substitution written as one reduction, per row or
not (and its gradient, a sum inside the reverse scan); a scan over a triangle read whole
by a later statement; a read through a division or remainder (`O(i / 2)`, a heap's
parent `O((i - 1) / 2)`, `O(i % 4)`), whose reverse scan is a sum too. Each read is
guarded so that it reads only points the statement wrote earlier. Values stay bounded
(`tanh`, damping, factors near 1, or small integers). Extents come from the reduction
family's (up to 1025, around vector, warp and block sizes), so a scan loop is long and
the loops beside it are vectorized and parallel.
"""

from __future__ import annotations

import random

from tclang.fuzzing.generator import (STATS, Decl, Features, GeneratedProgram, Model, Node,
                                      Stmt, checked_draw)
from tclang.fuzzing.reductions import VOLUME, _sizes

KINDS = ("scan", "scan", "scan", "diagonal", "after", "consumed", "substitution", "cell",
         "summed", "summed", "triangle", "halving")
_DIMS = ("N", "M", "K")
_IDX = ("i", "j", "k")


def recurrence_program(rng: random.Random) -> GeneratedProgram | None:
    """A random recurrence program (None when the front end or the sizes refuse the draw:
    the caller draws again)."""
    kind = rng.choice(KINDS)
    dtype = rng.choices(("float", "double", "int32"), (60, 20, 20))[0]
    model = {"scan": _scan, "diagonal": _diagonal, "after": _after, "consumed": _consumed,
             "substitution": _substitution, "cell": _cell, "summed": _summed, "triangle": _triangle,
             "halving": _halving}[kind](rng, dtype)
    STATS["attempts"] += 1
    defn = checked_draw(model, f"recurrence {kind}: ")
    if defn is None:
        return None
    sizes = _sizes(defn, rng)
    if sizes is None:
        return None
    STATS["programs"] += 1
    return GeneratedProgram(model.render(), model.name, sizes, model,
                            Features(family=f"recurrence {kind}", volume_cap=VOLUME))


def _step(rng, dtype: str, earlier: list[str], value: str) -> str:
    """The new point from the earlier ones and the input's value, bounded."""
    if dtype == "int32":
        form = rng.choice(("sum", "max", "min"))
        if form == "sum":
            return " + ".join([f"({p} % 97)" for p in earlier] + [value])
        return f"{form}({earlier[0]}, {value})" if len(earlier) == 1 else \
            f"{form}({form}({earlier[0]}, {earlier[1]}), {value})"
    form = rng.choice(("sum", "max", "min", "damped", "cell"))
    if form == "sum":
        return " + ".join(earlier + [value])
    if form in ("max", "min"):
        call = "fmax" if form == "max" else "fmin"
        inner = earlier[0] if len(earlier) == 1 else f"{call}({earlier[0]}, {earlier[1]})"
        return f"{call}({inner}, {value})"
    weights = ("0.5", "0.25")
    damped = " + ".join(f"{w} * {p}" for w, p in zip(weights, earlier))
    return f"{damped} + {value}" if form == "damped" else f"tanh({damped} + {value})"


def _scan(rng, dtype: str) -> Model:
    """A scan along one axis of a 1-3 dimensional input, 1 or 2 reads back."""
    rank = rng.choice((1, 2, 2, 3))
    dims, idx = _DIMS[:rank], _IDX[:rank]
    axis = rng.randrange(rank)
    shifts = rng.choice(((1,), (1,), (2,), (1, 2)))
    reads = [_shifted("O", idx, {axis: -c}) for c in shifts]
    value = f"X({', '.join(idx)})"
    guard = f"{idx[axis]} >= {max(shifts)}"
    rhs = f"({guard}) ? {_step(rng, dtype, reads, value)} : {value}"
    return _model("scan", [Decl("X", dtype, dims)], [Stmt("O", idx, "=", Node(rhs))])


def _diagonal(rng, dtype: str) -> Model:
    """Along a diagonal or an anti-diagonal of a matrix (per batch member or not)."""
    batch = rng.random() < 0.3
    pre, pdims = (("b",), ("B",)) if batch else ((), ())
    anti = rng.random() < 0.5
    idx = pre + ("i", "j")
    read = _shifted("O", idx, {len(pre): -1, len(pre) + 1: 1 if anti else -1})
    guard = "i >= 1 && j < M - 1" if anti else "i >= 1 && j >= 1"
    value = f"X({', '.join(idx)})"
    rhs = f"({guard}) ? {_step(rng, dtype, [read], value)} : {value}"
    return _model("diag", [Decl("X", dtype, pdims + ("N", "M"))],
                  [Stmt("O", idx, "=", Node(rhs))])


def _after(rng, dtype: str) -> Model:
    """A first statement writes O; the recurrence, over all but the first points of its
    axis, reads what the first wrote there."""
    rows = rng.random() < 0.5
    idx, dims = (("r", "i"), ("R", "N")) if rows else (("i",), ("N",))
    start = rng.choice((1, 2))
    value = f"X({', '.join(idx)})"
    first = Stmt("O", idx, "=", Node(value if dtype == "int32" else f"{value} * 0.5"))
    read = _shifted("O", idx, {len(idx) - 1: -start})
    # onto the first value without reset too: a sum, a max or a product with it, whose
    # reverse scan gives the value before the whole gradient where it writes
    op = rng.choice(("=", "=", "+=", "max=", "min=") + (("*=",) if dtype != "int32" else ()))
    step = _step(rng, dtype, [read], value)
    if op == "*=":
        step = f"0.5 + 0.25 * tanh({read})"
    elif op == "+=" and dtype != "int32":
        step = f"0.5 * tanh({step})"
    second = Stmt("O", idx, op, Node(step), (Node(f"i in {start}:N"),))
    return _model("after", [Decl("X", dtype, dims)], [first, second])


def _consumed(rng, dtype: str) -> Model:
    """A per-row scan into a temporary, then an elementwise use or a row reduction."""
    value = "X(r, i)"
    read = "T(r, i - 1)"
    scan = Stmt("T", ("r", "i"), "=",
                Node(f"(i >= 1) ? {_step(rng, dtype, [read], value)} : {value}"))
    if rng.random() < 0.5:
        use = Stmt("O", ("r", "i"), "=", Node("T(r, i) * 2" if dtype == "int32" else
                                              "T(r, i) * 0.5 + X(r, i)"))
    else:
        use = Stmt("O", ("r",), rng.choice(("+=!", "max=!")), Node("T(r, i)"))
    return _model("consumed", [Decl("X", dtype, ("R", "N"))], [scan, use])


def _substitution(rng, dtype: str) -> Model:
    """Forward substitution, bounded: P(i, j) reads the diagonal P(j - 1, j - 1)."""
    if dtype == "int32":
        dtype = "float"
    rhs = ("(j == 0) ? b(i) : P(i, j - 1) - 0.5 * L(i, j - 1) * tanh(P(j - 1, j - 1) / "
           "(fabs(L(j - 1, j - 1)) + 1.0))")
    body = [Stmt("P", ("i", "j"), "=", Node(rhs), (Node("j in 0:i + 1"),)),
            Stmt("x", ("i",), "=", Node("P(i, i) / (fabs(L(i, i)) + 1.0)"))]
    return _model("trsv", [Decl("L", dtype, ("N", "N")), Decl("b", dtype, ("N",))], body,
                  "x")


def _cell(rng, dtype: str) -> Model:
    """An RNN-style cell: S(t, h) from X(t, h) and two units of S(t - 1)."""
    if dtype == "int32":
        dtype = "float"
    rhs = ("(t == 0) ? tanh(X(0, h)) : tanh(X(t, h) + S(t - 1, 0) * W(h, 0) + "
           "S(t - 1, H - 1) * W(h, H - 1))")
    return _model("cell", [Decl("X", dtype, ("T", "H")), Decl("W", dtype, ("H", "H"))],
                  [Stmt("S", ("t", "h"), "=", Node(rhs))], "S")


def _triangle(rng, dtype: str) -> Model:
    """A scan along each row of the lower triangle (`where j in 0:i + 1`), then a statement
    reading the whole square: the points above the diagonal are zeros no forward point
    computed, so their gradient must go nowhere (tc.grad sent it back along the scan, from
    points outside its domain, until the reverse scan bounded them)."""
    value = "X(i, j)"
    scan = Stmt("P", ("i", "j"), "=",
                Node(f"(j >= 1) ? {_step(rng, dtype, ['P(i, j - 1)'], value)} : {value}"),
                (Node("j in 0:i + 1"),))
    if rng.random() < 0.5:
        use = Stmt("O", ("i",), "+=!", Node("P(i, j)"), (Node("j in 0:N"),))
    else:
        use = Stmt("O", ("i", "j"), "=", Node("P(i, j) * 2" if dtype == "int32" else
                                              "P(i, j) * 0.5 + X(i, j)"))
    return _model("triangle", [Decl("X", dtype, ("N", "N"))], [scan, use])


def _summed(rng, dtype: str) -> Model:
    """A reduction reading earlier points of its own target: O(i) is X(i) plus (or the
    max with) a weighted, bounded term of every O(k) before it, per row or not."""
    rows = rng.random() < 0.5
    idx, dims, pre = (("r", "i"), ("R", "N"), "r, ") if rows else (("i",), ("N",), "")
    earlier = f"O({pre}k)"
    if dtype == "int32":
        term = f"(W(i, k) % 5) * ({earlier} % 97)"
    else:
        term = f"0.5 * W(i, k) * tanh({earlier})" if rng.random() < 0.7 else \
            f"W(i, k) * {earlier} / float(N)"
    op = rng.choice(("+=!", "+=!", "max=!", "*=!"))
    if op == "*=!":  # factors near 1 (a product of N of them stays bounded)
        if dtype == "int32":
            op = "+=!"
        else:
            term = f"1.0 + 0.25 * W(i, k) * tanh({earlier}) / float(N)"
    rhs = f"(k == i) ? X({pre}i) : {term}"
    return _model("summed", [Decl("X", dtype, dims), Decl("W", dtype, ("N", "N"))],
                  [Stmt("O", idx, op, Node(rhs), (Node("k in 0:i + 1"),))])


def _halving(rng, dtype: str) -> Model:
    """A read of an earlier point through a quotient or remainder (a tree laid out in an
    array: O(i / 2), the heap parent O((i - 1) / 2)), alone or with O(i - 1), per row or
    not: not a constant shift, so its gradient is the reverse scan with a sum inside."""
    rows = rng.random() < 0.4
    idx, dims, pre = (("r", "i"), ("R", "N"), "r, ") if rows else (("i",), ("N",), "")
    sub, guard = rng.choice((("i / 2", "i >= 1"), ("(i - 1) / 2", "i >= 1"),
                             ("i / 3", "i >= 1"), ("i % 4", "i >= 4")))
    reads = [f"O({pre}{sub})"] + ([f"O({pre}i - 1)"] if rng.random() < 0.4 else [])
    value = f"X({pre}i)"
    rhs = f"({guard}) ? {_step(rng, dtype, reads, value)} : {value}"
    return _model("halving", [Decl("X", dtype, dims)], [Stmt("O", idx, "=", Node(rhs))])


def _shifted(name: str, idx: tuple[str, ...], shift: dict[int, int]) -> str:
    subs = [f"{i} {'+' if shift[k] > 0 else '-'} {abs(shift[k])}" if shift.get(k) else i
            for k, i in enumerate(idx)]
    return f"{name}({', '.join(subs)})"


def _model(name: str, inputs: list[Decl], body: list[Stmt], output: str = "O") -> Model:
    return Model(name, tuple(inputs), (Decl(output, None),), tuple(body))
