"""Semantic checks: `syntax.Module` -> `program.Program` (typed, before range inference).

Each rule of LANGUAGE.md sections 1-4 is a small named check raising `TCSemanticError` at
the offending span. Shapes of outputs and temporaries are left for `ranges.infer_shapes`;
here each statement gets its types, its reduction indices and its `where` ranges.
"""

from __future__ import annotations

import dataclasses
import warnings

from tclang.lang import program as P
from tclang.lang import recurrences as R
from tclang.lang import sizes as Z
from tclang.lang import syntax as S
from tclang.lang.affine import Affine
from tclang.dtypes import DType, is_widening, parse_type_name
from tclang.errors import Span, TCSemanticError, TCWarning, source_lines
from tclang.lang.expressions import (ExpressionTyper, StatementScope, TensorInfo, cast,
                                     check_wide_literals, error)
from tclang.lang.functions import BUILTINS
from tclang.lang.scatters import check_scatter, is_scatter

_OPS = {"=": ("=", False), "+=": ("+", False), "+=!": ("+", True), "*=": ("*", False),
        "*=!": ("*", True), "min=": ("min", False), "min=!": ("min", True),
        "max=": ("max", False), "max=!": ("max", True)}


def check_module(module: S.Module) -> P.Program:
    """Check every definition; names of definitions must be distinct."""
    seen: dict[str, Span] = {}
    definitions = []
    for d in module.definitions:
        if d.name.name in seen:
            raise error(f"a definition named {d.name.name} already exists (line "
                        f"{seen[d.name.name].line})", d.name.span, hint="rename one of them")
        seen[d.name.name] = d.name.span
        definitions.append(_DefinitionChecker(d, module.source).run())
    return P.Program(tuple(definitions), module.source)


class _DefinitionChecker:
    def __init__(self, d: S.Definition, source: str):
        self.d = d
        self.source = source
        self.sizes: dict[str, Span] = {}
        self.tensors: dict[str, TensorInfo] = {}
        self.spans: dict[str, Span] = {}
        self.declared: dict[str, tuple[Z.SizeExpr, ...] | None] = {}
        self.temporaries: list[str] = []

    def run(self) -> P.Definition:
        for p in self.d.params:
            self._add_param(p)
        for o in self.d.outputs:
            self._add_output(o)
        # the tensors each statement and those after it write: for "read before written"
        self.later_targets = []
        later: frozenset[str] = frozenset()
        for st in reversed(self.d.statements):
            later = later | {st.target.name}
            self.later_targets.append(later)
        self.later_targets.reverse()
        checked = [self._statements(i, s) for i, s in enumerate(self.d.statements)]
        # a `!` scatter is two statements (tclang/lang/scatters.py): number them all again
        statements = tuple(dataclasses.replace(st, position=k) for k, st in
                           enumerate(st for group in checked for st in group))
        self._check_outputs_written()
        return P.Definition(
            name=self.d.name.name, sizes=tuple(self.sizes),
            inputs=tuple(self._tensor(p.name.name) for p in self.d.params),
            outputs=tuple(self._tensor(o.name.name) for o in self.d.outputs),
            temporaries=tuple(self._tensor(t) for t in self.temporaries),
            statements=statements, span=self.d.name.span, source=self.source,
            tokens=self.d.tokens)

    # ---- signature ----
    def _add_param(self, p: S.Param) -> None:
        name = p.name.name
        self._check_new_tensor_name(name, p.name.span)
        dims = p.dims or ()
        for dim in dims:
            if isinstance(dim.value, str):
                if dim.value in self.tensors:
                    raise error(f"{dim.value} is already a tensor name; it cannot also be a "
                                "size", dim.span, hint="rename the size or the tensor")
                self._check_not_builtin(dim.value, dim.span, "a size")
                self.sizes.setdefault(dim.value, dim.span)
        self.tensors[name] = TensorInfo(name, parse_type_name(p.type_name), len(dims),
                                        "input", True)
        self.spans[name] = p.name.span
        self.declared[name] = tuple(_dim_size(d) for d in dims)

    def _add_output(self, o: S.OutputDecl) -> None:
        name = o.name.name
        if name in self.tensors and self.tensors[name].role == "input":
            raise error(f"{name} is an input; an output needs a new name", o.name.span,
                        hint="inputs are read-only: write the result into a new tensor")
        self._check_new_tensor_name(name, o.name.span)
        dtype, declared = None, None
        if o.type_name is not None:
            dtype = parse_type_name(o.type_name)
            declared = tuple(self._output_dim(d) for d in (o.dims or ()))
        rank = len(declared) if declared is not None else -1  # -1: from the first write
        self.tensors[name] = TensorInfo(name, dtype, rank, "output", False)
        self.spans[name] = o.name.span
        self.declared[name] = declared

    def _output_dim(self, dim: S.Dim) -> Z.SizeExpr:
        if isinstance(dim.value, str) and dim.value not in self.sizes:
            raise error(f"size {dim.value} is not defined by any input", dim.span,
                        hint="output sizes must be sizes of the inputs (or integer literals)")
        return _dim_size(dim)

    def _check_new_tensor_name(self, name: str, span: Span) -> None:
        if name in self.tensors:
            raise error(f"{name} is declared twice", span, hint="give each tensor its own name")
        if name in self.sizes:
            raise error(f"{name} is already a size name; it cannot also be a tensor", span,
                        hint="rename the tensor or the size")
        self._check_not_builtin(name, span, "a tensor")

    @staticmethod
    def _check_not_builtin(name: str, span: Span, what: str) -> None:
        if name in BUILTINS:
            raise error(f"{name} is a builtin function and cannot name {what}", span,
                        hint=f"rename it, e.g. {name}_")

    # ---- statements ----
    def _statements(self, position: int, s: S.Statement) -> tuple[P.Statement, ...]:
        """The checked statements of source statement number `position`."""
        if not is_scatter(s):
            return (self._statement(position, s),)
        op, reset = _OPS[s.op]
        later = self.later_targets[position] - set(self.tensors)
        return check_scatter(self, s, op, reset, later, _text_of(self.source, s.span))

    def _statement(self, position: int, s: S.Statement) -> P.Statement:
        s = self._constant_subscripts(s)
        target = s.target.name
        op, reset = _OPS[s.op]
        info = self._target_info(s)
        indices = self._lhs_indices(s)
        lets = self._lets(s, indices)
        later = self.later_targets[position] - set(self.tensors)
        tensors = self._with_recurrence_target(s, info, len(indices), lets, later)
        scope = StatementScope(tensors, set(self.sizes), lets, target, later)
        typer = ExpressionTyper(scope)
        for i in s.indices or ():
            scope.index_spans.setdefault(i.name, i.span)
        where_ranges, affine_ranges = self._where_ranges(s, scope)
        rhs = typer.expr(s.rhs)
        exists = tuple(self._exists(c, typer) for c in s.where if isinstance(c, S.ExistsClause))
        self._check_unused_lets(s, scope)
        used = [n for n in scope.index_spans if n not in indices]
        self._check_assignment_reduction(s, op, used, scope)
        self._check_affine_ranges(op, indices, used, affine_ranges)
        self._check_equivalent(s, scope)
        dtype = self._target_dtype(s, info, rhs, op)
        self._check_self_reads(s, rhs, indices, bool(used), info)
        if op != "=" and not reset and not info.written:
            self._warn(f"`{s.op}` accumulates into {target}, which no earlier statement "
                       "writes: it starts from zeros (or the caller's `out=` values)",
                       s.op_span, f"write `{s.op}!` to start from the identity instead")
        self._record_write(s, info, dtype, len(indices))
        rhs = cast(rhs, dtype)  # widening only (narrowing needs a cast): never infinite
        check_wide_literals(scope, rhs)
        return P.Statement(
            position=position, target=target, indices=indices, op=op, reset=reset,
            rhs=rhs, reduction_indices=tuple(used), domain=where_ranges,
            exists=exists, span=s.span, text=_text_of(self.source, s.span),
            index_spans=tuple(scope.index_spans.items()),
            affine_ranges=tuple((n, lo, hi) for n, lo, hi, _ in affine_ranges))

    def _constant_subscripts(self, s: S.Statement) -> S.Statement:
        """`C(0) +=! ...`: each integer subscript on the left becomes a fresh index ranged
        over that one point (`C(c0) +=! ... where c0 in 0:1`)."""
        if not any(isinstance(i, S.IntLit) for i in s.indices or ()):
            return s
        taken = {n.name for n in _names_in([s.rhs, *s.where])} | set(self.sizes) | \
            set(self.tensors) | {i.name for i in s.indices if isinstance(i, S.Ident)}
        indices, where = [], list(s.where)
        for k, i in enumerate(s.indices):
            if isinstance(i, S.Ident):
                indices.append(i)
                continue
            name = f"c{k}"
            while name in taken or name in BUILTINS:
                name += "_"
            taken.add(name)
            ident = S.Ident(name, i.span)
            indices.append(ident)
            where.append(S.RangeClause(ident, i, S.IntLit(i.value + 1, i.span), i.span))
        return dataclasses.replace(s, indices=tuple(indices), where=tuple(where))

    def _check_equivalent(self, s: S.Statement, scope: StatementScope) -> None:
        """TC's `<=> name(args)` names an equivalent operator: its arguments may name only
        the statement's tensors, sizes, indices and where-locals; it has no effect."""
        if s.equivalent is None:
            return
        for node in _names_in(list(s.equivalent.args)):
            known = node.name in scope.tensors or node.name in scope.sizes or \
                node.name in scope.lets or node.name in scope.index_spans
            if not known:
                raise error(f"{node.name} in the `<=>` annotation is not a tensor, size or "
                            "index of this statement", node.span,
                            hint="`<=> name(args)` only documents an equivalent operator; "
                                 "remove it, or name the statement's tensors in it")
        for node in _applies_in(list(s.equivalent.args)):
            if node.name not in scope.tensors and node.name not in BUILTINS:
                raise error(f"{node.name} in the `<=>` annotation is not a tensor",
                            node.name_span, hint="`<=> name(args)` only documents an "
                                                 "equivalent operator; remove it")

    def _target_info(self, s: S.Statement) -> TensorInfo:
        name = s.target.name
        if name in self.sizes:
            raise error(f"{name} is a size and cannot be written", s.target.span)
        self._check_not_builtin(name, s.target.span, "a tensor")
        info = self.tensors.get(name)
        if info is None:
            info = TensorInfo(name, None, -1, "temporary", False)
            self.tensors[name] = info
            self.spans[name] = s.target.span
            self.declared[name] = None
            self.temporaries.append(name)
        if info.role == "input":
            raise error(f"{name} is an input, and inputs are read-only", s.target.span,
                        hint=f"write the result into a new tensor, e.g. {name}2")
        rank = len(s.indices or ())
        if info.rank not in (-1, rank):
            raise error(f"{name} has rank {info.rank} but this statement writes it with "
                        f"{rank} ind{'ex' if rank == 1 else 'ices'}", s.target.span)
        return info

    def _lhs_indices(self, s: S.Statement) -> tuple[str, ...]:
        seen: dict[str, Span] = {}
        for ident in s.indices or ():
            name = ident.name
            if name in seen:
                raise error(f"index {name} appears twice on the left side", ident.span,
                            hint="the left side's indices must be distinct names")
            for table, what in ((self.sizes, "a size"), (self.tensors, "a tensor")):
                if name in table:
                    raise error(f"{name} is {what}, not an index; the left side takes index "
                                "names only", ident.span, hint="use a new lower-case name")
            self._check_not_builtin(name, ident.span, "an index")
            seen[name] = ident.span
        return tuple(seen)

    def _lets(self, s: S.Statement, indices: tuple[str, ...]) -> dict[str, S.Expr]:
        lets: dict[str, S.Expr] = {}
        for c in s.where:
            if not isinstance(c, S.LetClause):
                continue
            name = c.name.name
            clash = name in lets or name in indices or name in self.sizes or \
                name in self.tensors or name in BUILTINS
            if clash:
                raise error(f"the where-local {name} clashes with another name", c.name.span,
                            hint="where-locals need names not used for indices, sizes, "
                                 "tensors or other locals")
            lets[name] = c.value
        return lets

    @staticmethod
    def _check_unused_lets(s: S.Statement, scope: StatementScope) -> None:
        """Type where-locals the statement never uses, in a scratch scope, for their errors."""
        roots = [s.rhs] + [c for c in s.where if not isinstance(c, S.LetClause)]
        used = {n.name for n in _names_in(roots)}
        frontier = list(used & set(scope.lets))
        while frontier:  # lets used by used lets are used
            new = {n.name for n in _names_in([scope.lets[frontier.pop()]])} - used
            used |= new
            frontier.extend(new & set(scope.lets))
        for name, value in scope.lets.items():
            if name not in used:
                scratch = StatementScope(scope.tensors, scope.sizes, scope.lets, scope.target)
                scratch.inlining.append(name)
                ExpressionTyper(scratch).expr(value)

    def _where_ranges(self, s: S.Statement, scope: StatementScope):
        """The `where` ranges: those over sizes and literals, and those whose bounds use
        other indices (`j in 0:i + 1`, with the clause's span)."""
        ranges: list[P.IndexRange] = []
        affine: list[tuple[str, Affine, Affine, S.RangeClause]] = []
        for c in s.where:
            if not isinstance(c, S.RangeClause):
                continue
            name = c.index.name
            if not scope.is_index(name):
                raise error(f"{name} is not an index; `in` ranges an index of the statement",
                            c.index.span)
            if any(r.name == name for r in ranges) or any(a[0] == name for a in affine):
                raise error(f"index {name} has two ranges", c.index.span,
                            hint="give each index one `in` clause")
            scope.index_spans.setdefault(name, c.index.span)
            lo, hi = range_bound(c.lo, scope), range_bound(c.hi, scope)
            if lo.terms or hi.terms:
                for bound, e in ((lo, c.lo), (hi, c.hi)):
                    if name in bound.indices():
                        raise error(f"the range of {name} uses {name} itself", e.span,
                                    hint="a bound may use sizes, literals and other indices")
                affine.append((name, lo, hi, c))
            else:
                ranges.append(P.IndexRange(name, lo.offset, hi.offset))
        return tuple(ranges), affine

    @staticmethod
    def _check_affine_ranges(op: str, indices: tuple[str, ...], used: list[str],
                             affine: list) -> None:
        """Bounds that use indices: of this statement; a left-side index's only in `=`."""
        for name, lo, hi, clause in affine:
            span = clause.span
            for other in sorted(lo.indices() | hi.indices()):
                if other not in indices and other not in used:
                    raise error(f"the range of {name} uses {other}, which is not an index of "
                                "this statement",
                                (clause.lo if other in lo.indices() else clause.hi).span,
                                hint="a bound may use sizes, literals and the statement's "
                                     "other indices")
            if name in indices and op != "=":
                raise error(f"{name} is a left-side index of a reduction: only `=` "
                            "statements and reduction indices may have a range that uses "
                            "other indices", span,
                            hint=f"range {name} over sizes, and mask the terms with "
                                 "`cond ? ... : 0`, or compute the triangle with `=` from "
                                 "a reduction over the full range")

    @staticmethod
    def _exists(c: S.ExistsClause, typer: ExpressionTyper) -> P.Read:
        if c.access.name not in typer.scope.tensors:
            raise error(f"exists needs a tensor access, and {c.access.name} is not a tensor",
                        c.access.name_span)
        return typer.read(c.access, None)

    def _check_assignment_reduction(self, s: S.Statement, op: str, used: list[str],
                                    scope: StatementScope) -> None:
        if op == "=" and used:
            name = used[0]
            raise error(f"index {name} appears only on the right side, which makes it a "
                        f"reduction index, but `=` does not reduce", scope.index_spans[name],
                        hint=f"use a reduction such as `+=!`, or put {name} on the left side")

    def _target_dtype(self, s: S.Statement, info: TensorInfo, rhs: P.Expr, op: str) -> DType:
        if op in ("+", "*") and rhs.dtype is DType.BOOL:
            raise error(f"`{s.op}` cannot reduce bool values", s.op_span,
                        hint="convert them, e.g. int32(x), or use max=! / min=! for any/all")
        if info.dtype is None:
            return rhs.dtype
        if not is_widening(rhs.dtype, info.dtype):
            raise error(f"assigning a {rhs.dtype.value} value to {info.name}, which is "
                        f"{info.dtype.value}, would narrow it", s.rhs.span,
                        hint=f"cast explicitly: {info.dtype.value}(...)")
        return info.dtype

    def _check_self_reads(self, s: S.Statement, rhs: P.Expr, indices: tuple[str, ...],
                          reduces: bool, info: TensorInfo) -> None:
        for read in P.reads_of(rhs):
            if read.tensor != info.name:
                continue
            if reduces or R.is_recurrence_read(read, info.name, indices):
                R.check_self_read(read, reduces, info.name, indices)
            if not info.written and not R.is_recurrence_read(read, info.name, indices):
                raise error(f"{info.name} is read at the point this statement writes, "
                            "before any statement writes it", read.span,
                            hint="a recurrence reads an earlier point, such as "
                                 f"{info.name}(i - 1) under `i > 0 ? ... : ...`")

    def _with_recurrence_target(self, s: S.Statement, info: TensorInfo, rank: int,
                                lets: dict, later: frozenset) -> dict[str, TensorInfo]:
        """The tensors a statement sees; a recurrence's first statement sees its own target
        as written, of the type its right side computes (`R.recurrence_dtype`)."""
        tensors = dict(self.tensors)
        if info.written or not R.reads_target(s):
            return tensors
        dtype = info.dtype
        if dtype is None:
            def typed(guess: DType) -> DType:
                trial = dict(tensors)
                trial[info.name] = TensorInfo(info.name, guess, rank, info.role, True)
                scope = StatementScope(trial, set(self.sizes), lets, info.name, later)
                self._where_ranges(s, scope)
                return ExpressionTyper(scope).expr(s.rhs).dtype
            dtype = R.recurrence_dtype(s, tensors, typed)
        tensors[info.name] = TensorInfo(info.name, dtype, rank, info.role, True)
        return tensors

    def _record_write(self, s: S.Statement, info: TensorInfo, dtype: DType, rank: int) -> None:
        self.tensors[info.name] = TensorInfo(info.name, dtype, rank, info.role, True)

    def _check_outputs_written(self) -> None:
        for o in self.d.outputs:
            if not self.tensors[o.name.name].written:
                raise error(f"output {o.name.name} is never written", o.name.span,
                            hint=f"add a statement such as {o.name.name}(i) = ...")

    def _tensor(self, name: str) -> P.Tensor:
        info = self.tensors[name]
        declared = self.declared[name]
        shape = declared if declared is not None else (None,) * info.rank
        return P.Tensor(name, info.dtype, shape, info.role, self.spans[name],
                        declared=declared is not None)

    @staticmethod
    def _warn(message: str, span: Span, hint: str) -> None:
        global _warnings_given
        _warnings_given += 1
        warnings.warn(TCWarning(f"line {span.line}, column {span.column}: {message} "
                                f"(hint: {hint})"), stacklevel=5)


_warnings_given = 0


def warnings_given() -> int:
    """How many TCWarnings checking has given in this process: a source whose check gave
    none may skip checking next time (tclang/driver/call_records.py keeps no record of one that
    warned, so its warnings come again in every process)."""
    return _warnings_given


def range_bound(e: S.Expr, scope: StatementScope) -> Affine:
    """A `where` range bound: affine in sizes, integer literals and other indices."""
    typer = ExpressionTyper(scope)
    affine = typer.affine(e)
    if affine is None or _reads_tensor(e, scope):
        raise TCSemanticError("a range bound must be affine in sizes, integer literals and "
                              "other indices (no tensor reads, no products of indices)",
                              e.span, hint="e.g. `i in 0:N`, `k in 1:KH - 1` or `j in 0:i + 1`")
    return affine


def _reads_tensor(e: S.Expr, scope: StatementScope) -> bool:
    return any(n.name in scope.tensors for n in _names_in([e]))


def _dim_size(dim: S.Dim) -> Z.SizeExpr:
    return Z.const(dim.value) if isinstance(dim.value, int) else Z.size(dim.value)


def _names_in(roots: list):
    """Every bare name used in the given expressions and clauses."""
    return (n for n in S.walk(roots) if isinstance(n, S.Name))


def _applies_in(roots: list):
    """Every call or tensor access in the given expressions."""
    return (n for n in S.walk(roots) if isinstance(n, S.Apply))


def _text_of(source: str, span: Span) -> str:
    lines = source_lines(source)
    if span.line == span.end_line:
        return lines[span.line - 1][span.column - 1:span.end_column - 1]
    first = lines[span.line - 1][span.column - 1:]
    middle = lines[span.line:span.end_line - 1]
    last = lines[span.end_line - 1][:span.end_column - 1]
    return " ".join(x.strip() for x in [first, *middle, last])
