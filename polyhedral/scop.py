"""Checked program -> scop: iteration domains and access relations as isl sets and maps.

Every statement becomes an isl statement `S<p>` over all its indices (left side first, then
reduction indices); a `!` reduction adds an init statement `I<p>` over the left-side
indices that sets the identity. Reads are restricted by their affine guard; a gather's
data-dependent subscript becomes a may-access over the tensor's whole extent. The original
schedule is program order. Sizes are either fixed to the concrete values (specialized) or
kept as isl parameters (shape-generic), with any non-affine product of sizes standing for
a parameter of its own; a compile generic in some sizes only (Options(specialize="auto")
after a size changed) fixes the sizes `sizes` gives and keeps the others as parameters.

Strings in isl's notation are generated from the checked program: simpler and less
error-prone than building isl objects by hand (see the polyhedral notes).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Mapping

import islpy as isl

from polyhedral.isl_context import compilation_context

from tclang.lang import program as P
from tclang.lang import sizes as Z
from tclang.lang.affine import Affine, Compare, Condition, Div, Logic, Truth
from tclang.lang.recurrences import recurrence_reads


@dataclass(frozen=True)
class ScopStatement:
    id: str  # "S3" or "I3" (the init of statement 3)
    source: P.Statement
    kind: str  # "init", "assign", "reduce"
    indices: tuple[str, ...]


@dataclass
class Scop:
    ctx: isl.Context
    definition: P.Definition
    sizes: dict[str, int] | None  # concrete sizes (all when specialized, some when partly)
    params: tuple[str, ...]  # isl parameters (the generic sizes, and derived ones)
    derived: dict[str, Z.SizeExpr]  # parameters standing for non-affine size products
    context: isl.Set
    domain: isl.UnionSet
    reads: isl.UnionMap
    writes: isl.UnionMap
    order: isl.UnionMap
    statements: tuple[ScopStatement, ...]
    extents: dict[str, tuple[Z.SizeExpr, ...]]
    ref_reads: dict[tuple[str, int], isl.Map] = field(default_factory=dict)

    def statement(self, sid: str) -> ScopStatement:
        return self._by_id[sid]

    @cached_property
    def _by_id(self) -> dict[str, ScopStatement]:
        """The passes ask for statements by id per band member and access: a search of
        the list each time cost time quadratic in the statements."""
        return {s.id: s for s in self.statements}

    @cached_property
    def summed_recurrences(self) -> frozenset[str]:
        """The reduction statements that read earlier points of their own target
        (tclang/lang/recurrences.py): asked once per band by polyhedral/tiling.py."""
        return frozenset(st.id for st in self.statements
                         if st.kind == "reduce" and recurrence_reads(st.source))

    @property
    def specialized(self) -> bool:
        """Whether every size is a constant (no size is a parameter)."""
        return self.sizes is not None and set(self.definition.sizes) <= self.sizes.keys()


class _Renderer:
    """Writes size expressions and quasi-affine forms in isl's syntax."""

    def __init__(self, sizes: Mapping[str, int] | None):
        self.sizes = sizes
        self.derived: dict[str, Z.SizeExpr] = {}

    def size(self, e: Z.SizeExpr) -> str:
        if self.sizes is not None:
            if e.names() <= self.sizes.keys():
                return str(e.evaluate(self.sizes))
            e = Z.substitute(e, self.sizes)  # generic in the sizes it does not give
        match e:
            case Z.Poly():
                return self._poly(e)
            case Z.FloorDiv(numerator=n, divisor=d):
                return f"floor(({self.size(n)})/{d})"
            case Z.MinMax(kind=k, args=args):
                text = self.size(args[0])
                for a in args[1:]:
                    text = f"{k}({text}, {self.size(a)})"
                return text
            case Z.Sum(poly=poly, parts=parts):
                pieces = [self._poly(poly)] + [f"{c}*({self.size(p)})" for p, c in parts]
                return " + ".join(pieces)
        raise TypeError(e)

    def _poly(self, p: Z.Poly) -> str:
        if not p.terms:
            return "0"
        pieces = []
        for monomial, coef in p.terms:
            if not monomial:
                pieces.append(str(coef))
                continue
            if len(monomial) == 1:
                name = monomial[0]
            else:  # a product of sizes is not affine: it gets a parameter of its own
                name = "p__" + "__".join(monomial)
                self.derived[name] = Z.Poly(((monomial, 1),))
            pieces.append(f"{coef}*{name}")
        return " + ".join(pieces)

    def affine(self, a: Affine) -> str:
        pieces = []
        for atom, coef in a.terms:
            text = atom if isinstance(atom, str) else self._div(atom)
            pieces.append(f"{coef}*{text}")
        pieces.append(f"({self.size(a.offset)})")
        return " + ".join(pieces)

    def _div(self, d: Div) -> str:
        if d.kind == "div":
            return f"floor(({self.affine(d.inner)})/{d.divisor})"
        return f"(({self.affine(d.inner)}) mod {d.divisor})"

    def condition(self, c: Condition) -> str:
        match c:
            case Truth(value=v):
                return "true" if v else "false"
            case Logic(op="not", args=(x,)):
                return f"not ({self.condition(x)})"
            case Logic(op=op, args=args):
                return "(" + f" {op} ".join(f"({self.condition(x)})" for x in args) + ")"
            case Compare(op=op, lhs=lhs):
                e = self.affine(lhs)
                if op == "!=":
                    return f"({e} < 0 or {e} > 0)"
                return f"{e} {'=' if op == '==' else op} 0"
        raise TypeError(c)


def build_scop(defn: P.Definition, sizes: Mapping[str, int] | None,
               ctx: isl.Context | None = None) -> Scop:
    """The scop of one checked definition, specialized to `sizes` unless it is None."""
    ctx = ctx or compilation_context()
    r = _Renderer(dict(sizes) if sizes is not None else None)
    statements = tuple(_statements(defn))
    extents = {t.name: t.shape for t in defn.inputs + defn.outputs + defn.temporaries}
    domains, reads, writes, orders, refs = [], [], [], [], {}
    depth = max((len(s.indices) for s in statements), default=0)
    for position, st in enumerate(statements):
        dom = _domain_text(st, r)
        domains.append(dom)
        writes.append(f"{st.id}[{', '.join(st.indices)}] -> {st.source.target}"
                      f"[{', '.join(st.source.indices)}]")
        pad = [st.indices[k] if k < len(st.indices) else "0" for k in range(depth)]
        orders.append(f"{st.id}[{', '.join(st.indices)}] -> [{', '.join([str(position)] + pad)}]")
        if st.kind == "init":
            continue
        if st.source.is_scatter:  # may touch any element of what it reads and writes
            whole = [_whole_text(st, t, extents[t], r)
                     for t in [st.source.target] + [x.tensor for x in st.source.reads()]]
            writes[-1], reads = whole[0], reads + whole
            refs.update({(st.id, x.ref): _whole_text(st, x.tensor, extents[x.tensor], r)
                         for x in st.source.reads()})
            continue
        if st.kind == "reduce":
            reads.append(f"{st.id}[{', '.join(st.indices)}] -> {st.source.target}"
                         f"[{', '.join(st.source.indices)}]")
        for read in st.source.reads():
            text = _read_text(st, read, extents[read.tensor], r)
            reads.append(text)
            refs[(st.id, read.ref)] = text
    generic = generic_sizes(defn, sizes)
    facts = _context_facts(defn, r) if generic else []
    params = sorted(set(generic) | set(r.derived)) if generic else []
    prefix = f"[{', '.join(params)}] -> " if params else ""

    def union_map(parts: list[str]) -> isl.UnionMap:
        return isl.UnionMap(prefix + "{ " + "; ".join(parts) + " }", context=ctx) if parts \
            else isl.UnionMap.empty(isl.Space.params_alloc(ctx, 0))

    # a partly generic compile (`sizes` given) may assume its generic sizes are at least 1:
    # the runtime runs a call with a zero one on a specialized kernel (tclang/runtime/kernels.py).
    # With sizes that may be 0, a reduction's init fused into its tiles made isl bound the
    # point loops by the whole tile with a guard inside (a generic 3x3 convolution ran
    # 64^3 guarded iterations per output point, not 9 * C: 400x slower)
    least = 1 if sizes is not None else 0
    context = isl.Set(prefix + "{ : " + " and ".join(
        [f"{p} >= {least if p in generic else 0}" for p in params] + facts) + " }",
                      context=ctx) if params \
        else isl.Set("{ : }", context=ctx)
    domain = isl.UnionSet(prefix + "{ " + "; ".join(domains) + " }", context=ctx) \
        .intersect_params(context)
    read_map = union_map(reads).intersect_domain(domain)
    ref_reads = {k: isl.Map(prefix + "{ " + v + " }", context=ctx).intersect_params(context)
                 for k, v in refs.items()}
    return Scop(ctx=ctx, definition=defn, sizes=dict(sizes) if sizes is not None else None,
                params=tuple(params), derived=dict(r.derived), context=context, domain=domain,
                reads=read_map, writes=union_map(writes).intersect_domain(domain),
                order=union_map(orders).intersect_domain(domain), statements=statements,
                extents=extents, ref_reads=ref_reads)


def generic_sizes(defn: P.Definition, sizes: Mapping[str, int] | None) -> tuple[str, ...]:
    """The sizes of `defn` that are isl parameters: those `sizes` does not give."""
    if sizes is None:
        return tuple(defn.sizes)
    return tuple(n for n in defn.sizes if n not in sizes)


def _statements(defn: P.Definition):
    for s in defn.statements:
        if s.is_scatter:  # one point: its loops are the lowering's (scatter_loops.py)
            yield ScopStatement(f"S{s.position}", s, "reduce", ())
            continue
        if s.is_reduction and s.reset:
            yield ScopStatement(f"I{s.position}", s, "init", s.indices)
        kind = "reduce" if s.is_reduction else "assign"
        yield ScopStatement(f"S{s.position}", s, kind, s.all_indices)


def _domain_text(st: ScopStatement, r: _Renderer) -> str:
    bounds = _box_bounds(st, r)
    if st.kind != "init" and st.source.condition is not None:
        # a guarded sum, or ranges bounded by other indices (`=` statements: only these)
        bounds.append(f"({r.condition(st.source.condition)})")
    constraint = " and ".join(bounds) if bounds else "true"
    return f"{st.id}[{', '.join(st.indices)}] : {constraint}"


def _box_bounds(st: ScopStatement, r: _Renderer) -> list[str]:
    return [f"{r.size(rng.lo)} <= {rng.name} < {r.size(rng.hi)}"
            for rng in st.source.domain if rng.name in st.indices]


def _read_text(st: ScopStatement, read: P.Read, extent: tuple[Z.SizeExpr, ...],
               r: _Renderer) -> str:
    outs = [f"o{k}" for k in range(len(read.affine))]
    constraints = []
    for k, (a, e) in enumerate(zip(read.affine, extent)):
        if a is None:  # data-dependent: may touch any element of this dimension
            constraints.append(f"0 <= o{k} < {r.size(e)}")
        else:
            constraints.append(f"o{k} = {r.affine(a)}")
    if read.guard is not None:
        constraints.append(r.condition(read.guard))
    body = " and ".join(constraints) if constraints else "true"
    return f"{st.id}[{', '.join(st.indices)}] -> {read.tensor}[{', '.join(outs)}] : {body}"


def _whole_text(st: ScopStatement, tensor: str, extent: tuple[Z.SizeExpr, ...],
                r: _Renderer) -> str:
    """`st` touches any element of `tensor`: a scatter (tclang/lang/scatters.py)."""
    outs = [f"o{k}" for k in range(len(extent))]
    body = " and ".join(f"0 <= o{k} < {r.size(e)}" for k, e in enumerate(extent)) or "true"
    return f"{st.id}[{', '.join(st.indices)}] -> {tensor}[{', '.join(outs)}] : {body}"


def _context_facts(defn: P.Definition, r: _Renderer) -> list[str]:
    """Shape-generic code may assume the affine obligations: they are checked per call."""
    facts = []
    for ob in defn.obligations:
        facts.append(f"{r.size(ob.expr)} {'>=' if ob.relation == '>=' else '='} 0")
    return facts


def tensor_box(scop: Scop, tensor: str) -> isl.Set:
    """All elements of a tensor: { T[o...] : 0 <= o_k < extent_k }."""
    r = _Renderer(scop.sizes)
    r.derived = dict(scop.derived)
    extent = scop.extents[tensor]
    outs = [f"o{k}" for k in range(len(extent))]
    body = " and ".join(f"0 <= o{k} < {r.size(e)}" for k, e in enumerate(extent)) or "true"
    prefix = f"[{', '.join(scop.params)}] -> " if scop.params else ""
    return isl.Set(f"{prefix}{{ {tensor}[{', '.join(outs)}] : {body} }}", context=scop.ctx)


def statement_box(scop: Scop, st: ScopStatement) -> isl.Set:
    """The box of a statement's index ranges, its domain before any condition: what loops
    over the ranges alone walk (polyhedral/reductions.py builds such loops by hand, and
    guards each instance by what the domain adds to this box)."""
    r = _Renderer(scop.sizes)
    r.derived = dict(scop.derived)
    body = " and ".join(_box_bounds(st, r)) or "true"
    prefix = f"[{', '.join(scop.params)}] -> " if scop.params else ""
    return isl.Set(f"{prefix}{{ {st.id}[{', '.join(st.indices)}] : {body} }}",
                   context=scop.ctx).intersect_params(scop.context)
