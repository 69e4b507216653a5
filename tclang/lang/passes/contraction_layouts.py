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
np.einsum 15-19 ms, one core, under load). Only where the result is already in the order
`(batch..., rows..., lanes...)`: a result in another order would need a copy of its own,
and where one was needed (a 1x1 convolution's `O(n, m, h, w)`, whose n the register
tiles take as an outer loop as it is) the rewrite changed kernels that were fast already.

The orders of each group are chosen among the ones the tensors already have so that the
fewest elements are copied (an operand already in layout is read as it is), and only where
the copies are small next to the work (each copied element feeds at least
`MIN_WORK_PER_COPY` multiply-adds), and only where the depth indices are not one run of
adjacent dimensions in the same order in both operands (`_walks_in_order`): otherwise the
register tiles' packing copies what needs it block by block already. So matrix products,
batched or not (attention's Q K^T), keep their layouts, as does a contraction whose only
disorder is in its rows or lanes.
Exact: the copies move values, the sum adds the same products (its reduction order is
the scheduler's anyway; `Options(reorder_reductions=False)`, which fixes it to the order
written, turns this pass off, as do `Options(passes=False)`, a manual tile or loop order,
and the GPU, whose contractions are tiled as implicit GEMMs whatever their layouts
(polyhedral/tile_contraction.py).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import replace
from typing import Mapping

from tclang.dtypes import DType
from tclang.lang import program as P
from tclang.lang.affine import Affine
from tclang.lang.passes.rewrite import fresh_tensor_name
from tclang.lang.program_text import expression_text
from tclang.lang.sizes import known_value

CONTRACTION_LAYOUTS = "tensor contractions copied into a matrix product's layout"
MIN_WORK_PER_COPY = 16
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
        defn, added, note = _rewrite(defn, k, plan)
        notes.append(note)
        k += added + 1
    return defn, notes


def _plain(read: P.Read) -> tuple[str, ...] | None:
    """The index names a read's subscripts are, each once; None for anything else."""
    if read.guard is not None:
        return None
    names = tuple(x.name if type(x) is P.IndexValue else None for x in read.subscripts)
    if None in names or len(set(names)) != len(names):
        return None
    return names


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
    """(rows read, lanes read, their orders, the result's order, the depth order), or
    None where statement s is no contraction to copy into layout."""
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
        (rows, ir), (lanes, il) = (a, ia), (b, ib)
    elif out[-1] in ia and out[-1] not in ib:
        (rows, ir), (lanes, il) = (b, ib), (a, ia)
    else:
        return None
    so, sr, sl = set(out), set(ir), set(il)
    batch, depth = so & sr & sl, (sr & sl) - so
    m, n = (so & sr) - sl, (so & sl) - sr
    if (sr | sl) != (so | depth) or depth != set(s.reduction_indices) or not m:
        return None
    if len(m) == 1 and len(n) == 1 and len(depth) == 1:
        return None  # a (batched) matrix product: the register tiles handle its layouts
    if _walks_in_order(ir, il, depth):
        return None  # the reduction loops walk both in order: packing handles the rest

    def ordered(group, *sequences):
        return {tuple(i for i in seq if i in group) for seq in sequences}

    volume = {name: math.prod(extents[i] for i in idx)
              for name, idx in (("out", out), ("rows", ir), ("lanes", il))}
    best = None
    splits = {(no[:cut], no[cut:]) for no in ordered(n, out, il) for cut in range(len(no))}
    for bo, mo, (outer, no), do in itertools.product(
            ordered(batch, out, ir, il), ordered(m, out, ir), splits, ordered(depth, ir, il)):
        # lane indices may also lead, as batch indices do (a 1x1 convolution's n, in
        # O(n, m, h, w) and I(n, c, h, w)): then they are the outer loops of the product
        layout = {"out": bo + outer + mo + no, "rows": bo + mo + do,
                  "lanes": bo + outer + do + no}
        if layout["out"] != out:
            continue  # the result is written where it is (see the module docstring)
        copied = [name for name, have in (("rows", ir), ("lanes", il))
                  if have != layout[name]]
        cost = (sum(volume[name] for name in copied), len(copied))
        if best is None or cost < best[0]:
            best = (cost, layout, do)
    if best is None:
        return None
    (elements, copies), layout, do = best
    if copies == 0:
        return None
    if elements * MIN_WORK_PER_COPY > math.prod(extents.values()):
        return None  # the copies would cost about what the layout saves
    return rows, lanes, layout, do


def _rewrite(defn: P.Definition, k: int, plan):
    """(definition, statements added before statement k's sum, explain's note)."""
    rows, lanes, layout, depth = plan
    s = defn.statements[k]
    dtype = defn.tensor(s.target).dtype
    before, temporaries, copied = [], [], []

    def statement(target: str, indices, op: str, rhs: P.Expr, reductions=()) -> P.Statement:
        text = f"{target}({', '.join(indices)}) {op} {expression_text(rhs)}"
        return P.Statement(s.position, target, tuple(indices), "+" if op == "+=!" else "=",
                           op == "+=!", rhs, tuple(reductions),
                           tuple(s.range_of(i) for i in tuple(indices) + tuple(reductions)),
                           (), s.span, text=text)

    def temporary(base: str, indices) -> str:
        name = fresh_tensor_name(replace(defn, temporaries=defn.temporaries +
                                         tuple(temporaries)), base)
        temporaries.append(P.Tensor(name, dtype, tuple(s.range_of(i).hi for i in indices),
                                    "temporary", s.span))
        return name

    reads = {}
    for read, role in ((rows, "rows"), (lanes, "lanes")):
        order = layout[role]
        if _plain(read) == order:
            reads[id(read)] = read
            continue
        name = temporary(f"{read.tensor}_{role}", order)
        before.append(statement(name, order, "=", replace(read, ref=0)))
        reads[id(read)] = _read(name, order, dtype, read.ref, read.span)
        copied.append(f"{read.tensor} -> {name}({', '.join(order)})")
    product = replace(s.rhs, lhs=reads[id(s.rhs.lhs)], rhs=reads[id(s.rhs.rhs)])
    body = before + [statement(s.target, s.indices, "+=!", product, depth)]
    statements = defn.statements[:k] + tuple(body) + defn.statements[k + 1:]
    statements = tuple(replace(x, position=j) for j, x in enumerate(statements))
    defn = replace(defn, statements=statements, temporaries=defn.temporaries +
                   tuple(temporaries))
    note = (f"{s.target}: rows ({', '.join(layout['rows'])}), lanes "
            f"({', '.join(layout['lanes'])}); copied {', '.join(copied)}")
    return defn, len(before), note


def _read(tensor: str, indices, dtype: DType, ref: int, span) -> P.Read:
    return P.Read(tensor, tuple(P.IndexValue(i, DType.INT32) for i in indices),
                  tuple(Affine.index(i) for i in indices), None, ref, dtype, span)
