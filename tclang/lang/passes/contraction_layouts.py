"""Tensor contractions copied into a matrix product's layout (CPU, specialized sizes,
automatic schedule): TTGT, as np.einsum, TCCG and TBLIS compute them.

`O(q, u, v) +=! A(u, e, d, q, l) * B(v, e, d, l)` is a matrix product in disguise: rows
(q, u), depth (e, d, l), lanes v. The CPU's register tiles and packing
(polyhedral/register_tiles.py, packing.py) take one loop for the rows, one for the lanes
and reduction loops that walk both operands in order; where the operands interleave the
groups (A's q between its depth indices) they got a tile around the wrong loops: 3.3
GFLOP/s, 0.09x of np.einsum, on that example. Here an operand whose indices are not in the
order `R(batch..., rows..., depth...)` (the operand without the result's stride-1 index)
or `L(batch..., depth..., lanes...)` (the one with it) is copied into a temporary in that
order by a statement of its own (a transpose the compiler schedules like any), and the sum
reads the copies. Each copy is O(elements); the sum is then the batched, multi-index
matrix product the register tiles are built for (the example: 174 ms -> 21-25 ms,
np.einsum 15-19 ms, one core, under load). Two more copies make it one where the tensors
alone do not:
- lanes of several indices whose innermost is short (`v, e, m` at 31, 17, 3) are one
  flat index `v_e_m` of the lanes copy, read as `v = v_e_m / 51, e = (v_e_m / 3) % 17,
  m = v_e_m % 3`: the vectors run along the innermost loop, and 3 lanes left them
  nearly empty (uhlpg,vuempl->gvehm: 1.1-1.6 s -> 50-60 ms, np.einsum 25-30, under load);
  rows and depth of several indices whose innermost is shorter than 16 too;
- a result in another order than (batch, outer, rows, lanes), or with flat lanes, is
  summed into a temporary in that order and copied where it belongs, `Z(g, v, e, h, m) =
  Z_sum(g, h, (v*17 + e)*3 + m)`.
Such a definition is scheduled with `fusion="min"` (polyhedral/pipeline.py): fused, isl
aligned the result's copy with the product's loops for seconds. Where the result's
stride-1 index is a batch index, either operand may give the lanes: the cheaper plan.

Left alone, because the register tiles run them well as they are: every tensor already in
its groups' order (a 1x1 convolution's `O(n, m, h, w)` from `I(n, c, h, w)`: lanes h, w,
n an outer loop), and lanes whose innermost index is the stride-1 index of both the lanes
operand and the result and at least LONG_LANES long (awnmi: 25 ms as it is, 56-82 ms
copied; np.einsum 40).

The orders of each group are chosen among the ones the tensors already have so that the
fewest elements are copied (an operand already in layout is read as it is), and only where
the copies are small next to the work (each copied element feeds at least
`MIN_WORK_PER_COPY` multiply-adds), and only where the depth indices are not one run of
adjacent dimensions in the same order in both operands (`_walks_in_order`) or the result's
stride-1 index is shorter than PACKED_LANES: otherwise the register tiles' packing copies
what needs it block by block already. So matrix products, batched or not (attention's
Q K^T), keep their layouts.
Exact: the copies move values, the sum adds the same products (its reduction order is
the scheduler's anyway; `Options(reorder_reductions=False)`, which fixes it to the order
written, turns this pass off, as do `Options(passes=False)`, a manual tile or loop order,
and the GPU, whose contractions are tiled as implicit GEMMs whatever their layouts
(polyhedral/tile_contraction.py).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, replace
from typing import Mapping

from tclang.dtypes import DType
from tclang.lang import program as P
from tclang.lang.affine import Affine
from tclang.lang.passes.rewrite import fresh_tensor_name
from tclang.lang.program_text import expression_text
from tclang.lang import sizes as Z
from tclang.lang.sizes import known_value

CONTRACTION_LAYOUTS = "tensor contractions copied into a matrix product's layout"
MIN_WORK_PER_COPY = 16
LONG_LANES = 32  # a lane index this long fills several vectors of any CPU's
MIN_LANES = 16  # fewer lanes than this left to the vectors only where there are no more
PACKED_LANES = 128
"""A result's stride-1 index at least this long, with depth indices that walk both operands
in order, keeps its layout: the register tiles' packing copies the operands block by block
and the vectors fill (bhvk 2.1x np.einsum as it is, 1.4x copied; hli 0.64-0.77x, 0.54x).
Shorter ones are copied into layout (ksdnv, 3 lanes: 0.05x -> 0.70x; spmu, 23: 0.15x ->
0.41x; qjbw, 80: 0.23x -> 0.62x; one thread, under load)."""
_DTYPES = (DType.FLOAT32, DType.FLOAT64)


def pack_contractions(defn: P.Definition, sizes: Mapping[str, int] | None):
    """(`defn` with each qualifying contraction rewritten, explain's notes)."""
    if sizes is None:
        return defn, []
    notes = []
    k = 0
    while k < len(defn.statements):
        plan = _plan(defn, defn.statements[k], sizes)
        if plan is None:
            k += 1
            continue
        defn, added, copies_after, note = _rewrite(defn, k, plan)
        notes.append(note)
        k += added + 1 + copies_after
    return defn, notes


def _plain(read: P.Read) -> tuple[str, ...] | None:
    """The index names a read's subscripts are, each once; None for anything else."""
    if read.guard is not None:
        return None
    names = tuple(x.name if type(x) is P.IndexValue else None for x in read.subscripts)
    if None in names or len(set(names)) != len(names):
        return None
    return names


@dataclass(frozen=True)
class Groups:
    """A contraction's indices by their part in the matrix product, each group in the
    order chosen: the result is (batch, outer, rows, lanes), the rows operand (batch,
    rows, depth), the lanes operand (batch, outer, depth, lanes)."""

    batch: tuple[str, ...]
    outer: tuple[str, ...]  # lane indices that lead, as batch indices do
    rows: tuple[str, ...]
    lanes: tuple[str, ...]
    depth: tuple[str, ...]
    # the groups of several indices made one flat index of the copies: lanes whose
    # innermost is shorter than LONG_LANES (3 lanes of (v, e, m) = 31*17*3: the vectors
    # run along the innermost loop), rows and depth whose innermost is shorter than
    # MIN_LANES (the register tile's rows, the depth blocks); the others are loops of
    # their own, as the register tiles take them
    flat: frozenset[tuple[str, ...]] = frozenset()

    @staticmethod
    def chosen(batch, outer, rows, lanes, depth, extents) -> "Groups":
        flat = frozenset(g for g, short in ((lanes, LONG_LANES), (rows, MIN_LANES),
                                            (depth, MIN_LANES))
                         if len(g) > 1 and extents[g[-1]] < short)
        return Groups(batch, outer, rows, lanes, depth, flat)

    def dims(self, role: str) -> tuple[tuple[str, ...], ...]:
        """The role's dimensions in the product: a flat group is one, each other index
        one of its own."""
        return tuple(d for g in self.of(role) for d in
                     ((g,) if g in self.flat else tuple((i,) for i in g)))

    def of(self, role: str) -> tuple[tuple[str, ...], ...]:
        """The groups of the result ("out"), the rows or the lanes operand, in order."""
        return {"out": (self.batch, self.outer, self.rows, self.lanes),
                "rows": (self.batch, self.rows, self.depth),
                "lanes": (self.batch, self.outer, self.depth, self.lanes)}[role]

    def in_order(self, role: str, indices: tuple[str, ...]) -> bool:
        """Whether a tensor read or written at `indices` has its groups in this order."""
        return tuple(i for g in self.of(role) for i in g) == indices

    def in_place(self, role: str, indices: tuple[str, ...]) -> bool:
        """Whether a tensor read or written at `indices` is the product's as it is: its
        groups in this order, none of them flat."""
        return self.in_order(role, indices) and \
            not any(g in self.flat for g in self.of(role))


def _walks_in_order(ir: tuple[str, ...], il: tuple[str, ...], depth: set[str]) -> bool:
    """Whether the depth indices are one run of adjacent dimensions in both operands, in
    the same order: then the reduction is one flattened index to the register tiles, and
    an operand read with a stride along the lanes or rows is what their packing copies,
    block by block (polyhedral/packing.py). Copying it whole then only added work: a
    (f) * (f, v) contraction with its lanes in another order, 38.7 -> 49.3 ms."""
    def run(indices):
        at = [k for k, i in enumerate(indices) if i in depth]
        return tuple(indices[k] for k in at) if at[-1] - at[0] == len(at) - 1 else None
    first = run(ir)
    return first is not None and first == run(il)


def _plan(defn: P.Definition, s: P.Statement, sizes: Mapping[str, int]):
    """(rows read, lanes read, their Groups, the extents), or None where statement s is
    no contraction to copy into layout."""
    if not (s.op == "+" and s.reset and s.reduction_indices and s.condition is None
            and not s.exists and not s.affine_ranges and s.scatter is None):
        return None
    rhs = s.rhs
    if type(rhs) is not P.Binary or rhs.op != "mul" or type(rhs.lhs) is not P.Read or \
            type(rhs.rhs) is not P.Read:
        return None
    dtype = defn.tensor(s.target).dtype
    if dtype not in _DTYPES or {rhs.dtype, rhs.lhs.dtype, rhs.rhs.dtype} != {dtype}:
        return None
    a, b = rhs.lhs, rhs.rhs
    ia, ib, out = _plain(a), _plain(b), s.indices
    if ia is None or ib is None or s.target in (a.tensor, b.tensor) or not out:
        return None
    if any(str(r.lo) != "0" for r in s.domain):
        return None
    extents = {}
    for index in s.all_indices:
        extents[index] = known_value(s.range_of(index).extent, sizes)
        if extents[index] is None:
            return None
    if out[-1] in ib and out[-1] not in ia:
        roles = [((a, ia), (b, ib))]
    elif out[-1] in ia and out[-1] not in ib:
        roles = [((b, ib), (a, ia))]
    else:  # the result's stride-1 index is a batch index: either operand gives the lanes
        roles = [((a, ia), (b, ib)), ((b, ib), (a, ia))]
    plans = [p for p in (_roles_plan(rows, ir, lanes, il, out, s, extents)
                         for (rows, ir), (lanes, il) in roles) if p is not None]
    if not plans:
        return None
    cost, rows, lanes, groups = min(plans, key=lambda p: p[0])
    if cost[0] * MIN_WORK_PER_COPY > math.prod(extents.values()):
        return None  # the copies would cost about what the layout saves
    return rows, lanes, groups, extents


def _roles_plan(rows: P.Read, ir: tuple[str, ...], lanes: P.Read, il: tuple[str, ...],
                out: tuple[str, ...], s: P.Statement, extents: dict[str, int]):
    """(cost, rows, lanes, groups) of the cheapest layout with these operands as the rows
    and the lanes, or None where it keeps its layout."""
    so, sr, sl = set(out), set(ir), set(il)
    batch, depth = so & sr & sl, (sr & sl) - so
    m, n = (so & sr) - sl, (so & sl) - sr
    if (sr | sl) != (so | depth) or depth != set(s.reduction_indices) or not m:
        return None
    if len(m) == 1 and len(n) == 1 and len(depth) == 1:
        return None  # a (batched) matrix product: the register tiles handle its layouts
    if _walks_in_order(ir, il, depth) and extents[out[-1]] >= PACKED_LANES:
        return None  # the reduction loops walk both in order and the vectors have a long
        # run along the result: the register tiles' packing handles the rest
    if il[-1] == out[-1] and extents[out[-1]] >= LONG_LANES:
        return None  # the vectors run along a long stride-1 index of both: the register
        # tiles' inner loop is in order as it is (a copy made `awnmi` 2.3x slower)

    def ordered(group, *sequences):
        """The group's orders in the sequences, each once, in the sequences' order (a
        list, not a set: a tie between two plans goes the same way in every process)."""
        return list(dict.fromkeys(tuple(i for i in seq if i in group) for seq in sequences))

    volume = {name: math.prod(extents[i] for i in idx)
              for name, idx in (("out", out), ("rows", ir), ("lanes", il), ("n", n))}
    best = None
    splits = [(no[:cut], no[cut:]) for no in ordered(n, out, il) for cut in range(len(no))]
    for bo, mo, (outer, no), do in itertools.product(
            ordered(batch, out, ir, il), ordered(m, out, ir), splits, ordered(depth, ir, il)):
        # lane indices may also lead, as batch indices do (a 1x1 convolution's n, in
        # O(n, m, h, w) and I(n, c, h, w)): then they are the outer loops of the product
        groups = Groups.chosen(bo, outer, mo, no, do, extents)
        if math.prod(extents[i] for i in no) < min(MIN_LANES, volume["n"]):
            continue  # lane indices made outer loops would leave the vectors too few
        if all(groups.in_order(name, have) for name, have in
               (("rows", ir), ("lanes", il), ("out", out))):
            return None  # every tensor in layout already, if in groups of several (a 1x1
            # convolution's (h, w) lanes): kernels the register tiles run well as they are
        copied = [name for name, have in (("rows", ir), ("lanes", il), ("out", out))
                  if not groups.in_place(name, have)]
        # fewest elements copied, then fewest copies, then the fewest lane indices made
        # outer loops (a short lane group left to the vectors: 3 lanes of 31*17*3)
        cost = (sum(volume[name] for name in copied), len(copied), len(outer))
        if best is None or cost < best[0]:
            best = (cost, groups)
    if best is None:
        return None
    return best[0], rows, lanes, best[1]


def _rewrite(defn: P.Definition, k: int, plan):
    """(definition, statements added before statement k's sum, explain's note).

    Each group of several indices is one flat index of the copies (`n = (v*E + e)*M + m`,
    read back as `v = n / (E*M)`, `e = (n / M) % E`, `m = n % M`), so the sum is a
    batched matrix product of one loop per group; the result is copied where it belongs
    unless it is the product's as it is."""
    rows, lanes, groups, extents = plan
    s = defn.statements[k]
    dtype = defn.tensor(s.target).dtype
    before, after, temporaries, copied = [], [], [], []
    taken = set(defn.sizes) | {t.name for t in defn.tensors.values()} | set(s.all_indices)
    flat: dict[tuple[str, ...], str] = {}  # each dimension's index name
    for group in groups.dims("out") + groups.dims("rows") + groups.dims("lanes"):
        if len(group) == 1:
            flat[group] = group[0]
        elif group not in flat:
            name = "_".join(group)
            while name in taken:
                name += "_"
            taken.add(name)
            flat[group] = name
    size = {flat[g]: math.prod(extents[i] for i in g) for g in flat}

    def flat_indices(role: str) -> tuple[str, ...]:
        return tuple(flat[d] for d in groups.dims(role))

    def statement(target: str, indices, op: str, rhs: P.Expr, reductions=()) -> P.Statement:
        text = f"{target}({', '.join(indices)}) {op} {expression_text(rhs)}"
        domain = tuple(s.range_of(i) if i in s.all_indices else
                       P.IndexRange(i, Z.const(0), Z.const(size[i]))
                       for i in tuple(indices) + tuple(reductions))
        return P.Statement(s.position, target, tuple(indices), "+" if op == "+=!" else "=",
                           op == "+=!", rhs, tuple(reductions), domain, (), s.span,
                           text=text)

    def temporary(base: str, indices) -> str:
        name = fresh_tensor_name(replace(defn, temporaries=defn.temporaries +
                                         tuple(temporaries)), base)
        temporaries.append(P.Tensor(name, dtype, tuple(Z.const(size[i]) if i in size else
                                                       s.range_of(i).hi for i in indices),
                                    "temporary", s.span))
        return name

    def unflattened(role: str) -> dict[str, tuple[P.Expr, Affine]]:
        """Each index of the role's dimensions as an expression of its dimension's index
        (`e = (n / M) % E` of n = (v*E + e)*M + m; an index its own dimension: itself)."""
        found = {}
        for group in groups.dims(role):
            f = flat[group]
            for at, index in enumerate(group):
                inner = math.prod(extents[i] for i in group[at + 1:])
                expr, form = P.IndexValue(f, DType.INT32), Affine.index(f)
                if inner > 1:
                    expr, form = _int("div", expr, inner), form.floordiv(inner)
                if at > 0:
                    expr, form = _int("mod", expr, extents[index]), form.mod(extents[index])
                found[index] = (expr, form)
        return found

    reads = {}
    for read, role in ((rows, "rows"), (lanes, "lanes")):
        order = flat_indices(role)
        if groups.in_place(role, _plain(read)):
            reads[id(read)] = read
            continue
        name = temporary(f"{read.tensor}_{role}", order)
        at = unflattened(role)
        source = replace(read, ref=0, subscripts=tuple(at[i][0] for i in _plain(read)),
                         affine=tuple(at[i][1] for i in _plain(read)))
        before.append(statement(name, order, "=", source))
        reads[id(read)] = _read(name, order, dtype, read.ref, read.span)
        copied.append(f"{read.tensor} -> {name}({', '.join(order)})")
    product = replace(s.rhs, lhs=reads[id(s.rhs.lhs)], rhs=reads[id(s.rhs.rhs)])
    order = flat_indices("out")
    depth = tuple(flat[d] for d in groups.dims("rows") if d[0] in groups.depth)
    if groups.in_place("out", s.indices):
        body = before + [statement(s.target, s.indices, "+=!", product, depth)]
    else:  # summed in layout, then copied where it belongs
        name = temporary(f"{s.target}_sum", order)
        body = before + [statement(name, order, "+=!", product, depth)]
        subscripts, forms = [], []
        for group in groups.dims("out"):
            expr, form = P.IndexValue(group[0], DType.INT32), Affine.index(group[0])
            for index in group[1:]:
                expr = _int("add", _int("mul", expr, extents[index]),
                            P.IndexValue(index, DType.INT32))
                form = form.scale(extents[index]) + Affine.index(index)
            subscripts.append(expr)
            forms.append(form)
        back = P.Read(name, tuple(subscripts), tuple(forms), None, 0, dtype, s.span)
        after.append(statement(s.target, s.indices, "=", back))
        copied.append(f"{name}({', '.join(order)}) -> {s.target}")
    statements = defn.statements[:k] + tuple(body + after) + defn.statements[k + 1:]
    statements = tuple(replace(x, position=j) for j, x in enumerate(statements))
    defn = replace(defn, statements=statements, temporaries=defn.temporaries +
                   tuple(temporaries))
    note = (f"{s.target}: rows ({', '.join(flat_indices('rows'))}), lanes "
            f"({', '.join(flat_indices('lanes'))}); copied {', '.join(copied)}")
    return defn, len(before), len(after), note


def _int(op: str, lhs: P.Expr, rhs: P.Expr | int) -> P.Binary:
    if isinstance(rhs, int):
        rhs = P.Const(rhs, DType.INT32)
    return P.Binary(op, lhs, rhs, DType.INT32)


def _read(tensor: str, indices, dtype: DType, ref: int, span) -> P.Read:
    return P.Read(tensor, tuple(P.IndexValue(i, DType.INT32) for i in indices),
                  tuple(Affine.index(i) for i in indices), None, ref, dtype, span)
