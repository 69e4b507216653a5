"""Guarded, masked and triangular reductions at the extents where reduction code changes
shape: around a warp (31, 32, 33), a block or a vector loop (63-65, 127-129, 255-257) and
1024 (1023-1025), and small odd sizes.

The generic generator keeps every extent at 18 or less (its reference is a Python loop),
so a reduction split across GPU threads or vector lanes never gets past its first block:
the block-reduction path of the emulated GPU dropped the guard of
`Z(i) +=! (j <= i) ? S(i, j) : 0.0 where i in 0:T, j in 0:T` from T = 33 on, and no
generated program reached it. These programs are built from templates instead: a value
under a guard on the indices (a triangle, a band, padding) or on data (a mask), reduced
with `+=!`, `max=!` or `min=!` (or `+=` after an initialization), one or two reduction
indices, a batch index or none, in float32, float64, int32, half or bfloat16 (both
accumulated in float32). They are `Model`s like the generic ones, so the shrinker works on them.
"""

from __future__ import annotations

import random

from tclang.fuzzing.generator import (STATS, Decl, Features, GeneratedProgram, Model, Node,
                                      Stmt, bfloat16_callable, checked_draw, fits)

NARROW = ("half", "bf16")  # stored in 16 bits, computed in float32
KINDS = ("triangular", "guarded", "masked", "prefix", "softmax", "ranged", "unbounded",
         "permuted", "accumulated")
# extents near the warp, vector, block and 1024 boundaries, and small odd ones
EXTENTS = (1, 2, 3, 5, 7, 31, 32, 33, 31, 32, 33, 63, 64, 65, 127, 128, 129, 255, 256, 257,
           511, 1023, 1024, 1025)
# a permuted contraction's: around one and two AVX2 vectors (the one- and two-vector
# register tiles, issue 33 item 1), size-1 and small odd ones
PERMUTED_EXTENTS = (1, 2, 3, 5, 7, 8, 9, 13, 15, 16, 17, 19)
# the sums into one target's: multiples of both vector widths (4 doubles, 8 floats), where
# the CPU splits a reduction loop into lanes, and small odd ones
ACCUMULATED_EXTENTS = (1, 2, 3, 4, 4, 5, 8, 8, 16)
VOLUME = 40_000  # statement instances: the reference interpreter runs ~150,000 a second

# `where j in lo:hi` with bounds that use i (issue 35 item 4): triangles, bands, a diagonal
_RANGES = (("0", "i + 1"), ("0", "i"), ("i", "T"), ("i + 1", "T"), ("0", "T - i"),
           ("T - 1 - i", "T"), ("i", "i + 1"), ("(i + 1) / 2", "T"), ("0", "(i + 2) / 2"))
_TRIANGLES = ("j <= i", "j < i", "j >= i", "j > i", "i + j < T", "i + j >= T - 1",
              "j <= i + 1", "j >= i - 2 && j <= i + 2", "j <= i && j >= i - 3")


def reduction_program(rng: random.Random) -> GeneratedProgram | None:
    """A random reduction program of one of KINDS with sizes from EXTENTS (None if the
    front end or the sizes refuse the draw: the caller draws again)."""
    kind = rng.choice(KINDS)
    dtype = rng.choices(("float", "double", "int32", "half", "bf16"),
                        (60, 15, 15, 10, 5 if bfloat16_callable() else 0))[0]
    model = {"triangular": _triangular, "guarded": _guarded, "masked": _masked,
             "prefix": _prefix, "softmax": _softmax, "ranged": _ranged,
             "unbounded": _unbounded, "permuted": _permuted,
             "accumulated": _accumulated}[kind](rng, dtype)
    STATS["attempts"] += 1
    defn = checked_draw(model, f"{kind}: ")
    if defn is None:
        return None
    sizes = _sizes(defn, rng, {"permuted": PERMUTED_EXTENTS,
                               "accumulated": ACCUMULATED_EXTENTS}.get(kind, EXTENTS))
    if sizes is None:
        STATS["rejected"] += 1
        STATS[f"reject:{kind}: no sizes fit"] += 1
        return None
    STATS["programs"] += 1
    return GeneratedProgram(model.render(), model.name, sizes, model,
                            Features(family=kind, volume_cap=VOLUME))


def _sizes(defn, rng: random.Random, extents=EXTENTS) -> dict[str, int] | None:
    """Extents from `extents` within VOLUME; the largest allowed comes down every ten
    attempts, so that a program with three sizes still gets some near 32 or 1024."""
    for attempt in range(60):
        limit = max(extents) >> (attempt // 10)
        values = [v for v in extents if v <= limit] or [1]
        sizes = {s: rng.choice(values) for s in defn.sizes}
        if fits(defn, sizes, VOLUME):
            return sizes
    return None


# ---- values ---------------------------------------------------------------------------

def _value(rng, read: str, dtype: str) -> str:
    """What is reduced: the read itself or a function of it that stays moderate."""
    if dtype == "int32":
        return rng.choice((read, f"{read} * 2", f"({read} % 3)"))
    value = rng.choice((read, read, f"{read} * 0.5", f"tanh({read})", f"{read} * {read}"))
    return f"float({value})" if dtype in NARROW else value


def _identity(op: str, dtype: str) -> str:
    """The value of a guarded-off term: 0 for a sum, far below or above every real value
    for max and min (any constant is legal; these keep the guard visible)."""
    floats = dtype != "int32"
    if op.startswith("max"):
        return "-1000000.0" if floats else "(-1000000)"
    if op.startswith("min"):
        return "1000000.0" if floats else "1000000"
    return "0.0" if floats else "0"


def _op(rng) -> str:
    return rng.choices(("+=!", "max=!", "min=!", "+="), (60, 15, 15, 10))[0]


def _statements(rng, target: str, lhs: tuple[str, ...], op: str, rhs: str,
                where: tuple[str, ...], dtype: str, inputs: list | None = None) -> list[Stmt]:
    """The reduction, preceded by its initialization when the operator does not reset;
    or, given the template's `inputs`, sometimes onto a value an earlier statement wrote
    from a new input Y, over part of it (its first left-side index from 1), with or
    without reset: the value's gradient passes through where the reduction does not
    write, and without reset it is one more candidate where it does (a reset reduction
    there with a range bounded by another index gave a backward that did not check)."""
    body = []
    extent = {w.split()[0]: w.split(" in ")[1].split(":") for w in where}
    if inputs is not None and lhs and all(i in extent and extent[i][0] == "0" and
                                          extent[i][1].isidentifier() for i in lhs) and \
            rng.random() < 0.25:
        inputs.append(_decl(dtype, "Y", tuple(extent[i][1] for i in lhs)))
        body.append(Stmt(target, lhs, "=", Node(f"Y({', '.join(lhs)})"),
                         tuple(Node(f"{i} in 0:{extent[i][1]}") for i in lhs)))
        first = lhs[0]
        where = tuple(f"{first} in 1:{extent[first][1]}" if w.split()[0] == first else w
                      for w in where)
        op = rng.choice((op, op.rstrip("!")))
        body.append(Stmt(target, lhs, op, Node(rhs), tuple(Node(w) for w in where)))
        return body
    if op == "+=":
        zero = {"int32": "0", "double": "double(0.0)"}.get(dtype, "0.0")
        ranges = tuple(w for w in where if w.split()[0] in lhs)
        body.append(Stmt(target, lhs, "=", Node(zero), tuple(Node(w) for w in ranges)))
    body.append(Stmt(target, lhs, op, Node(rhs), tuple(Node(w) for w in where)))
    return body


def _model(name, inputs, outputs, body) -> Model:
    return Model(name, tuple(inputs), tuple(Decl(o, None) for o in outputs), tuple(body))


def _decl(dtype: str, name: str, dims: tuple[str, ...]) -> Decl:
    return Decl(name, dtype, dims)


# ---- templates ------------------------------------------------------------------------

def _triangular(rng, dtype: str) -> Model:
    """A triangle, a band or an anti-diagonal of a square matrix (per batch member)."""
    batch = rng.random() < 0.25
    cond = rng.choice(_TRIANGLES)
    op = _op(rng)
    pre = ("b",) if batch else ()
    read = f"S({', '.join(pre + ('i', 'j'))})"
    value = _value(rng, read, dtype)
    if rng.random() < 0.3 and dtype != "int32":
        value = f"{value} * X(j)"
    lhs = pre + rng.choice((("i",), ("i",), ("j",), ()))
    where = (("b in 0:B",) if batch else ()) + ("i in 0:T", "j in 0:T")
    rhs = f"({cond}) ? {value} : {_identity(op, dtype)}"
    inputs = [_decl(dtype, "S", (("B",) if batch else ()) + ("T", "T"))]
    if "X(j)" in value:
        inputs.append(_decl(dtype, "X", ("T",)))
    return _model("tri", inputs, ["Z"], _statements(rng, "Z", lhs, op, rhs, where, dtype,
                                                      inputs))


def _guarded(rng, dtype: str) -> Model:
    """Padding: a shifted read under the affine guard that keeps it in bounds (a 1-D
    convolution with zero padding, or a shifted row sum)."""
    op = _op(rng)
    pad = rng.choice((0, 1, 2, 3))
    if rng.random() < 0.5:  # Z(i) = sum_k X(i + k - pad) * W(k), padded
        s = f"i + k - {pad}" if pad else "i + k"
        w = "W(k)" if dtype != "int32" else "W(k)"
        value = f"{_value(rng, f'X({s})', dtype)} * {w}" if dtype not in NARROW else \
            f"float(X({s})) * float(W(k))"
        rhs = f"({s} >= 0 && {s} < N) ? {value} : {_identity(op, dtype)}"
        where = ("i in 0:N", "k in 0:K")
        inputs = [_decl(dtype, "X", ("N",)), _decl(dtype, "W", ("K",))]
        lhs = ("i",)
    else:  # Z(r) = sum_j S(r, j - pad) over a padded row
        s = f"j - {pad}" if pad else "j"
        value = _value(rng, f"S(r, {s})", dtype)
        rhs = f"({s} >= 0 && {s} <= N - 1) ? {value} : {_identity(op, dtype)}"
        where = ("r in 0:R", f"j in 0:N + {2 * pad}")
        inputs = [_decl(dtype, "S", ("R", "N"))]
        lhs = rng.choice((("r",), ()))
    return _model("pad", inputs, ["Z"], _statements(rng, "Z", lhs, op, rhs, where, dtype,
                                                      inputs))


def _masked(rng, dtype: str) -> Model:
    """A mask from data: a bool input, or a comparison of the value itself (relu-sums);
    sometimes also under a triangle."""
    op = _op(rng)
    read = "S(i, k)"
    value = _value(rng, read, dtype)
    zero = "0" if dtype == "int32" else "0.0"
    inputs = [_decl(dtype, "S", ("N", "K"))]
    if rng.random() < 0.5:
        inputs.append(_decl("bool", "Mk", ("N", "K")))
        cond = "Mk(i, k)"
    else:
        cond = f"S(i, k) {rng.choice(('>', '<=', '!='))} {zero}"
    where: tuple[str, ...] = ()
    if rng.random() < 0.3:
        cond = f"k <= i && {cond}"
        where = ("i in 0:N", "k in 0:K")
        inputs[0] = _decl(dtype, "S", ("N", "K"))
    if op == "+=!" and rng.random() < 0.3 and "Mk" in cond and not where:
        rhs = f"{'int32' if dtype == 'int32' else 'float'}(Mk(i, k)) * {value}"
    else:
        rhs = f"({cond}) ? {value} : {_identity(op, dtype)}"
    lhs = rng.choice((("i",), ("i",), ()))
    return _model("masked", inputs, ["Z"], _statements(rng, "Z", lhs, op, rhs, where, dtype,
                                                      inputs))


def _prefix(rng, dtype: str) -> Model:
    """A prefix (or suffix) sum written as a triangle over a vector, per row or not."""
    op = rng.choice(("+=!", "+=!", "max=!", "min=!"))
    cond = rng.choice(("k <= i", "k < i", "k >= i"))
    rows = rng.random() < 0.4
    read = "X(r, k)" if rows else "X(k)"
    rhs = f"({cond}) ? {_value(rng, read, dtype)} : {_identity(op, dtype)}"
    where = (("r in 0:R",) if rows else ()) + ("i in 0:N", "k in 0:N")
    lhs = (("r",) if rows else ()) + ("i",)
    inputs = [_decl(dtype, "X", ("R", "N") if rows else ("N",))]
    return _model("prefix", inputs, ["Z"], _statements(rng, "Z", lhs, op, rhs, where, dtype,
                                                      inputs))


def _softmax(rng, dtype: str) -> Model:
    """Causal (or banded) softmax: a guarded max, guarded exponentials, a sum, a division."""
    if dtype == "int32" or dtype in NARROW:
        dtype = "float"
    cond = rng.choice(("j <= i", "j >= i", "j <= i && j >= i - 4"))
    body = (Stmt("Mx", ("i",), "max=!", Node(f"({cond}) ? S(i, j) : -1000000.0"),
                 (Node("i in 0:T"), Node("j in 0:T"))),
            Stmt("E", ("i", "j"), "=", Node(f"({cond}) ? exp(S(i, j) - Mx(i)) : 0.0"),
                 (Node("i in 0:T"), Node("j in 0:T"))),
            Stmt("Sm", ("i",), "+=!", Node("E(i, j)")),
            Stmt("P", ("i", "j"), "=", Node("E(i, j) / Sm(i)")))
    return Model("softmax", (Decl("S", dtype, ("T", "T")),), (Decl("P", None),), body)


def _ranged(rng, dtype: str) -> Model:
    """A reduction over `j in lo:hi` with bounds that use i (no guard: the range is the
    triangle), or an `=` statement writing only a triangle of its target."""
    batch = rng.random() < 0.25
    lo, hi = rng.choice(_RANGES)
    pre = ("b",) if batch else ()
    value = _value(rng, f"S({', '.join(pre + ('i', 'j'))})", dtype)
    inputs = [_decl(dtype, "S", (("B",) if batch else ()) + ("T", "T"))]
    if rng.random() < 0.3 and dtype != "int32":
        value = f"{value} * X(j)"
        inputs.append(_decl(dtype, "X", ("T",)))
    where = (("b in 0:B",) if batch else ()) + ("i in 0:T", f"j in {lo}:{hi}")
    if rng.random() < 0.2:  # an assignment to the triangle only
        body = [Stmt("Z", pre + ("i", "j"), "=", Node(value), tuple(Node(w) for w in where))]
        return _model("ranged", inputs, ["Z"], body)
    op = _op(rng)
    lhs = pre + rng.choice((("i",), ("i",), ()))
    return _model("ranged", inputs, ["Z"], _statements(rng, "Z", lhs, op, value, where, dtype,
                                                      inputs))


def _permuted(rng, dtype: str) -> Model:
    """A sum of products whose operands and result hold their indices in random orders
    (issue 33 item 1): 1-2 free indices of each operand and 1-2 reduction indices, so the
    register tile's lanes, rows and packing meet every layout (a stride-1 index read with
    a stride, a reduction a row apart, a sliver already contiguous)."""
    if dtype in NARROW:
        dtype = "float"
    counts = [rng.randint(1, 2) for _ in range(3)]
    names = "ijklmnop"[:sum(counts)]
    free_a, free_b = names[:counts[0]], names[counts[0]:counts[0] + counts[1]]
    red = names[counts[0] + counts[1]:]
    a, b, o = (rng.sample(list(x), len(x)) for x in (free_a + red, free_b + red,
                                                     free_a + free_b))
    operands = [(list(a), [i.upper() for i in a]), (list(b), [i.upper() for i in b])]
    if rng.random() < 0.35:
        # a read that is no plain index: a strided lane (2*l), and sometimes the same index
        # again a row apart in a dimension of its own, so that the read moves with the rows
        # and the lanes at once (`A(m - 1, 2*l - 4, m + 1, l)`, whose register tile recursed
        # without end: the permuted draws had no such read)
        subs, dims = rng.choice(operands)
        d = rng.randrange(len(subs))
        x = subs[d]
        # (`x + 1` of a result index would start the result at -1: the language refuses)
        subs[d] = rng.choice((f"2*{x}", f"2*{x} + 1", f"{x} - 1") +
                             ((f"{x} + 1",) if x in red else ()))
        if rng.random() < 0.5:
            at = rng.randrange(len(subs) + 1)
            subs.insert(at, f"{rng.choice(red)} {rng.choice(('-', '+'))} 1")
            dims.insert(at, "W")
    (sub_a, dims_a), (sub_b, dims_b) = operands
    rhs = f"P({', '.join(sub_a)}) * Q({', '.join(sub_b)})"
    inputs = [_decl(dtype, "P", tuple(dims_a)), _decl(dtype, "Q", tuple(dims_b))]
    op = rng.choice(("+=!", "+=!", "+="))
    return _model("permuted", inputs, ["Z"], _statements(rng, "Z", tuple(o), op, rhs, (),
                                                         dtype))


def _accumulated(rng, dtype: str) -> Model:
    """Two or three sums into one target, each over reduction indices of its own and
    operands in their own layouts: a gradient's shape (`dB(i, j) += ...` once per use of
    B). isl fuses them into one nest and shifts a loop to keep them apart (`l = c3 - 1`),
    and the CPU splits a reduction loop whose trip is a multiple of the vector width into
    lanes: that split read lane 0's element for every lane under a shifted loop (fuzz
    seed 2031, program 291, found only through a gradient)."""
    if dtype in NARROW or dtype == "int32":
        dtype = rng.choice(("float", "double"))
    out = rng.sample(["i", "j"], rng.randint(1, 2))
    inputs, body = [], []
    nested = rng.random() < 0.6  # each sum over the last one's indices and one more
    for n in range(rng.randint(2, 3)):
        red = ["k", "l", "m"][:n + 1] if nested else rng.sample(["k", "l", "m"],
                                                                rng.randint(1, 2))
        idx = rng.sample(out + red, len(out) + len(red)) if rng.random() < 0.5 else \
            rng.sample(out, len(out)) + red  # the reduction innermost: lanes split along it
        name = "PQR"[n]
        inputs.append(_decl(dtype, name, tuple(i.upper() for i in idx)))
        rhs = f"{name}({', '.join(idx)})"
        if rng.random() < 0.5:
            scale = "XYV"[n]
            rhs += f" * {scale}({red[0]})"
            inputs.append(_decl(dtype, scale, (red[0].upper(),)))
        if n == 0:  # (an initialization's indices need their ranges: it reads nothing)
            body += _statements(rng, "Z", tuple(out), rng.choice(("+=!", "+=")), rhs,
                                tuple(f"{i} in 0:{i.upper()}" for i in out), dtype)
        else:
            body.append(Stmt("Z", tuple(out), "+=", Node(rhs), ()))
    return _model("accumulated", inputs, ["Z"], body)


def _unbounded(rng, dtype: str) -> Model:
    """Guarded reads that bound the indices with no `where` (issue 35 item 1): TC's concat,
    a concatenation along the guarded index, a padded row reduction whose rows no `where`
    ranges."""
    shape = rng.choice(("tc_concat", "concat", "padded_rows"))
    if shape == "tc_concat":
        a, b = _value(rng, "A(m, n)", dtype), _value(rng, "B(m, n)", dtype)
        body = [Stmt("Z", ("n", "c", "m"), "=", Node(f"(c == 0) ? {a} : {b}"),
                     (Node("c in 0:2"),))]
        inputs = [_decl(dtype, "A", ("M", "N")), _decl(dtype, "B", ("M", "N"))]
        return _model("concat", inputs, ["Z"], body)
    if shape == "concat":
        a, b = _value(rng, "A(i, k)", dtype), _value(rng, "B(i - M, k)", dtype)
        body = [Stmt("Z", ("i", "k"), "=", Node(f"(i < M) ? {a} : {b}"))]
        inputs = [_decl(dtype, "A", ("M", "K")), _decl(dtype, "B", ("N", "K"))]
        return _model("concat", inputs, ["Z"], body)
    op = rng.choice(("+=!", "max=!", "min=!"))
    pad = rng.choice((1, 2, 3))
    value = _value(rng, f"S(r, j - {pad})", dtype)
    rhs = f"(j - {pad} >= 0 && j - {pad} <= N - 1) ? {value} : {_identity(op, dtype)}"
    body = [Stmt("Z", ("r",), op, Node(rhs), (Node(f"j in 0:N + {2 * pad}"),))]
    return _model("pad", [_decl(dtype, "S", ("R", "N"))], ["Z"], body)
