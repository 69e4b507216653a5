"""Common subexpression elimination, across statements and within one.

Across statements: where a later statement computes, at a point its evaluation never skips
(not inside a `?:` branch), the very expression an earlier statement `T(i..) = e` stored,
it reads T instead. That is exact when T holds e at every point read: the earlier statement
is the only one writing T, it assigns (no reduction), e has no `?:` and does not read T,
nothing in between writes what e reads, T's type is e's (not half or bfloat16, which would
round), and the later statement's indices run over the same ranges as the earlier one's.

Within a statement: an expression that occurs more than once where evaluation never skips
it is computed once, as a `Let` the backends evaluate first, with `Local`s in its place
(largest first). This pass runs last, on what the polyhedral stage receives (see
tclang/lang/passes/__init__.py), so the program rewrites before it never meet a `Let`.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import Counter, defaultdict
from dataclasses import replace

from tclang.lang import program as P
from tclang.lang.affine import Affine
from tclang.lang.passes.rewrite import postorder, renumber_reads
from tclang.lang.program_text import expression_text

_OPERATIONS = (P.Unary, P.Binary, P.Compare, P.Call, P.Cast)


# ---- across statements ---------------------------------------------------------------------

def share_across_statements(defn: P.Definition):
    """`defn` with later statements reading a tensor where it holds what they compute.

    Each later statement tries the earlier ones in program order, as a pair loop would,
    but only those whose value's skeleton (`_Skeletons`) is among its own unconditional
    nodes' (no other can match anywhere in it), and whether a statement in between writes
    what the earlier one reads is a search in each tensor's writers: a program of n
    statements costs about n times a statement, not n^3 (1,000 temporaries, each read by
    the next, took 115 s here)."""
    writers = Counter(s.target for s in defn.statements)
    statements = list(defn.statements)
    notes: list[str] = []
    provides = [_provides(defn, s, writers) for s in statements]
    written_at: dict[str, list[int]] = defaultdict(list)  # tensor -> its writers' positions
    for k, s in enumerate(statements):
        written_at[s.target].append(k)
    skeletons = _Skeletons()
    providers: dict[int, list[int]] = defaultdict(list)  # skeleton -> positions providing it
    for j in range(len(statements)):
        tried = -1
        while True:
            keys = skeletons.unconditional(statements[j].rhs)
            candidates = sorted(i for key in keys for i in providers.get(key, ()) if i > tried)
            for i in candidates:
                tried = i
                earlier, later = statements[i], statements[j]
                if any(_written_between(written_at[r.tensor], i, j) for r in earlier.reads()):
                    continue
                found: list[str] = []
                rhs = _replace_matches(later.rhs, earlier, later, found)
                if found:
                    statements[j] = replace(later, rhs=renumber_reads(rhs))
                    provides[j] = _provides(defn, statements[j], writers)
                    notes += [f"{later.target}: {text}  ->  reads {earlier.target}, which "
                              "holds it" for text in found]
                    break  # its value changed: its skeletons too
            else:
                break
        if provides[j]:
            providers[skeletons.root(statements[j].rhs)].append(j)
    if not notes:
        return defn, []
    return replace(defn, statements=tuple(statements)), notes


def computed_in(value: P.Expr, later: list[P.Expr]) -> bool:
    """Whether `value` may occur, where it would be shared, in one of `later`'s values: a
    cheap necessary condition for share_across_statements to read a statement that
    stores `value` in place of it."""
    skeletons = _Skeletons()
    wanted = skeletons.root(value)
    return any(wanted in skeletons.unconditional(e) for e in later)


def _written_between(positions: list[int], first: int, last: int) -> bool:
    """Whether one of the (ascending) `positions` lies in (first, last]."""
    k = bisect_right(positions, first)
    return k < len(positions) and positions[k] <= last


class _Skeletons:
    """What `_unify` compares of a node, as a number (hash-consed, so linear however deep
    the expression): its type, dtype, operator, name, constant or tensor and its
    children's numbers, but not the names of indices (a match renames them). Two nodes
    that unify have the same number; a later statement's guarded read matches nothing."""

    def __init__(self):
        self.table: dict[tuple, int] = {}

    def _numbers(self, root: P.Expr) -> dict[int, int]:
        number: dict[int, int] = {}
        for e in postorder([root]):
            t = type(e)
            kids = tuple(number[id(c)] for c in P.children(e))
            if t is P.IndexValue:
                key: tuple = ("index", e.dtype)
            elif t is P.SizeValue:
                key = ("size", e.dtype, e.name)
            elif t is P.Const:
                key = ("const", e.dtype, repr(e.value))
            elif t is P.Read:
                key = ("read", e.dtype, e.tensor, e.guard is None, kids)
            elif t in (P.Unary, P.Binary, P.Compare):
                key = (t.__name__, e.dtype, e.op, kids)
            elif t is P.Call:
                key = ("call", e.dtype, e.name, kids)
            elif t is P.Cast:
                key = ("cast", e.dtype, kids)
            else:  # never in a value that provides (see _provides): matches nothing
                key = ("other", id(e))
            number[id(e)] = self.table.setdefault(key, len(self.table))
        return number

    def root(self, e: P.Expr) -> int:
        return self._numbers(e)[id(e)]

    def unconditional(self, e: P.Expr) -> set[int]:
        """The numbers of the nodes `_replace_matches` tries a match at."""
        number = self._numbers(e)
        return {number[id(x)] for x in _unconditional(e)}


def _provides(defn: P.Definition, s: P.Statement, writers: Counter) -> bool:
    """Whether `s` leaves T(i..) == its value for good: the only writer of T, an
    assignment of a non-trivial, unguarded expression of T's exact type, not reading T."""
    if s.op != "=" or writers[s.target] != 1 or len(set(s.indices)) != len(s.indices):
        return False
    if not isinstance(s.rhs, _OPERATIONS) or s.rhs.dtype.is_narrow_float:
        return False
    if defn.tensor(s.target).dtype is not s.rhs.dtype:
        return False
    if any(type(n) in (P.Select, P.Let, P.Local) for n in postorder([s.rhs])):
        return False
    return all(r.tensor != s.target and r.guard is None for r in s.reads())


def _replace_matches(e: P.Expr, earlier: P.Statement, later: P.Statement,
                     found: list[str]) -> P.Expr:
    """`e` with each unconditional occurrence of earlier's value replaced by a read."""
    mapping: dict[str, str] = {}
    if _unify(earlier.rhs, e, mapping) and _covers(earlier, later, mapping):
        found.append(expression_text(e))
        subscripts = tuple(P.IndexValue(mapping[i]) for i in earlier.indices)
        return P.Read(earlier.target, subscripts,
                      tuple(Affine.index(mapping[i]) for i in earlier.indices), None, 0,
                      e.dtype, later.span)
    t = type(e)
    if t is P.Read:
        return e
    if t is P.Select:  # only the condition is always evaluated
        return P.with_children(e, (_replace_matches(e.cond, earlier, later, found),
                                   e.then, e.other))
    return P.with_children(e, tuple(_replace_matches(c, earlier, later, found)
                                    for c in P.children(e)))


def _unify(pattern: P.Expr, e: P.Expr, mapping: dict[str, str]) -> bool:
    """Whether `e` is `pattern` with the earlier statement's indices renamed (the renaming
    recorded in `mapping`, kept consistent)."""
    t = type(pattern)
    if t is not type(e) or pattern.dtype is not e.dtype:
        return False
    if t is P.IndexValue:
        return mapping.setdefault(pattern.name, e.name) == e.name
    if t is P.SizeValue:
        return pattern.name == e.name
    if t is P.Const:
        return repr(pattern.value) == repr(e.value)
    if t is P.Read:
        if pattern.tensor != e.tensor or e.guard is not None or \
                len(pattern.subscripts) != len(e.subscripts):
            return False
    elif t in (P.Unary, P.Binary, P.Compare):
        if pattern.op != e.op:
            return False
    elif t is P.Call:
        if pattern.name != e.name or len(pattern.args) != len(e.args):
            return False
    elif t is not P.Cast:
        return False
    saved = dict(mapping)
    if all(_unify(a, b, mapping) for a, b in zip(P.children(pattern), P.children(e))):
        return True
    mapping.clear()
    mapping.update(saved)
    return False


def _covers(earlier: P.Statement, later: P.Statement, mapping: dict[str, str]) -> bool:
    """Every index of `earlier` is renamed, and runs where its image in `later` runs."""
    if set(mapping) != set(earlier.indices) or earlier.condition is not None:
        return False  # (an `=` with a triangular range writes only part of its box)
    for name, image in mapping.items():
        mine, theirs = earlier.range_of(name), later.range_of(image)
        if str(mine.lo) != str(theirs.lo) or str(mine.hi) != str(theirs.hi):
            return False
    return True


# ---- within a statement --------------------------------------------------------------------

def share_within_statements(defn: P.Definition):
    """`defn` with repeated unconditional subexpressions of a statement computed once."""
    statements, notes = [], []
    for s in defn.statements:
        rhs, shared = _let_bound(s.rhs)
        if shared:
            s = replace(s, rhs=renumber_reads(rhs))
            notes += [f"{s.target}: {text} computed once" for text in shared]
        statements.append(s)
    if not notes:
        return defn, []
    return replace(defn, statements=tuple(statements)), notes


class _Shapes:
    """Structural identity of every node under some roots, in one pass (hash-consing):
    `sid[id(node)]` is the same number for nodes that compute the same thing (a read's
    `ref` and span do not count), with each identity's size and whether it varies (not a
    constant expression: those are folding's). Linear in the nodes, however deep."""

    def __init__(self, roots):
        self.sid: dict[int, int] = {}
        self.size: list[int] = []
        self.varies: list[bool] = []
        self.node: list[P.Expr] = []
        table: dict[tuple, int] = {}
        for e in postorder(roots):
            t = type(e)
            kids = e.subscripts if t is P.Read else P.children(e)
            kid_ids = tuple(self.sid[id(c)] for c in kids)
            if t is P.Read:
                key = ("read", e.tensor, e.dtype, e.guard, kid_ids)
            elif t is P.Const:
                key = ("const", repr(e.value), e.dtype)
            else:
                key = (t.__name__, e.dtype, getattr(e, "op", None), getattr(e, "name", None),
                       kid_ids)
            sid = table.get(key)
            if sid is None:
                sid = table[key] = len(self.size)
                self.size.append(1 + sum(self.size[k] for k in kid_ids))
                self.varies.append(t in (P.Read, P.IndexValue, P.SizeValue, P.Local) or
                                   any(self.varies[k] for k in kid_ids))
                self.node.append(e)
            self.sid[id(e)] = sid


def _unconditional(e: P.Expr):
    """The subexpressions of `e` evaluated whenever `e` is (not in `?:` branches, not in
    subscripts), parents first."""
    stack = [e]
    while stack:
        x = stack.pop()
        yield x
        t = type(x)
        if t is P.Read:
            continue
        if t is P.Select:
            stack.append(x.cond)
            continue
        stack.extend(reversed(P.children(x)))


def _let_bound(rhs: P.Expr) -> tuple[P.Expr, list[str]]:
    bindings: list[tuple[str, P.Expr]] = []
    body = rhs
    shared: list[str] = []
    while True:
        roots = [v for _, v in bindings] + [body]
        shapes = _Shapes(roots)
        counts: Counter = Counter()
        for root in roots:
            for node in _unconditional(root):
                sid = shapes.sid[id(node)]
                if isinstance(node, _OPERATIONS) and shapes.varies[sid]:
                    counts[sid] += 1
        repeated = [sid for sid, n in counts.items() if n > 1]
        if not repeated:
            break
        chosen = max(repeated, key=lambda sid: shapes.size[sid])  # its parts go with it
        value, name = shapes.node[chosen], f"cse{len(bindings)}"
        local = P.Local(name, value.dtype)
        substituted = [(n, _substitute(v, shapes, chosen, local)) for n, v in bindings]
        users = [k for k, (_, v) in enumerate(substituted) if _uses(v, name)]
        at = users[0] if users else len(bindings)
        if any(_uses(value, n) for n, _ in bindings[at:]):
            break  # it needs a binding that needs it: leave it as it is
        bindings = substituted
        body = _substitute(body, shapes, chosen, local)
        bindings.insert(at, (name, value))
        shared.append(expression_text(value))
    for name, value in reversed(bindings):
        body = P.Let(name, value, body, body.dtype)
    return body, shared


def _uses(e: P.Expr, name: str) -> bool:
    return any(type(x) is P.Local and x.name == name for x in postorder([e]))


def _substitute(e: P.Expr, shapes: _Shapes, chosen: int, local: P.Local) -> P.Expr:
    """`e` with its unconditional occurrences of identity `chosen` replaced by `local`."""
    if shapes.sid[id(e)] == chosen:
        return local
    t = type(e)
    if t is P.Read:
        return e
    if t is P.Select:
        return P.with_children(e, (_substitute(e.cond, shapes, chosen, local), e.then,
                                   e.other))
    return P.with_children(e, tuple(_substitute(c, shapes, chosen, local)
                                    for c in P.children(e)))
