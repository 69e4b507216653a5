"""Source text -> `syntax.Module`, with Lark's LALR(1) parser.

Lark's exceptions never leave this module: they become `TCSyntaxError` with the line,
column, the source line with a caret, and what the parser expected, in the user's words.

Building the LALR tables takes Lark about 200 ms, on every process start: they are built
once, by `python -m tclang.lang.parser` (run it after changing grammar.lark; a test says when),
and kept in `grammar_tables.py`, plain Python data that loads in a few milliseconds. They
are used only for the grammar and the Lark version they were made from; otherwise Lark
builds them as before.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import os
import itertools
import math
import sys
import threading
from contextlib import contextmanager
from pathlib import Path

import lark
from lark import Token, Transformer, v_args
from lark.lark import PostLex

from tclang.lang import syntax as S
from tclang.errors import Span, TCSyntaxError, one_line_end, source_lines


def token_span(tok: Token) -> Span:
    return Span(tok.line, tok.column, tok.end_line, tok.end_column)  # type: ignore[call-arg]


def _span(*children) -> Span:
    """The merge of the children's spans (Lark's tree-less LALR mode keeps no rule spans)."""
    spans = [_node_span(x) for x in children if x is not None]
    spans = [s for s in spans if s is not None]
    result = spans[0]
    for s in spans[1:]:
        result = result.merge(s)
    return result


def _node_span(x) -> Span | None:
    if isinstance(x, Token):
        return token_span(x)
    return getattr(x, "span", None)


_INT_LIMIT = 2**63


@dataclasses.dataclass(frozen=True)
class _Equivalent:
    call: S.Apply


def _integer(tok: Token, what: str) -> int:
    """An integer token's value, refused with its location past 64 bits (counting its
    digits first: Python refuses to convert more than 4,300 of them)."""
    digits = tok.lstrip("0")
    if len(digits) > len(str(_INT_LIMIT)) or int(digits or "0") >= _INT_LIMIT:
        raise TCSyntaxError(f"{what} {_shown(tok)} does not fit in 64 bits", token_span(tok),
                            hint="use a float literal (e.g. 1e20)" if what.endswith("literal")
                            else "a dimension is at most 2**63 - 1")
    return int(digits or "0")


def _shown(tok: Token) -> str:
    """A literal as an error message quotes it: a long one by its ends."""
    return str(tok) if len(tok) <= 30 else f"{tok[:12]}...{tok[-12:]} ({len(tok)} characters)"


@v_args(inline=True)
class _ToSyntax(Transformer):
    """Builds the frozen syntax tree straight from the LALR parser's reductions."""

    def start(self, *defs):
        return tuple(defs)

    def definition(self, def_tok, name, *rest):
        params = tuple(p for p in rest if isinstance(p, S.Param))
        outputs = tuple(o for o in rest if isinstance(o, S.OutputDecl))
        stmts = tuple(s for s in rest if isinstance(s, S.Statement))
        return S.Definition(S.Ident(str(name), token_span(name)), params, outputs, stmts,
                            _span(def_tok, name), _RECORDER.definition_text(def_tok))

    def param(self, type_tok, *rest):
        dims = rest[0] if len(rest) == 2 else None
        name = rest[-1]
        return S.Param(str(type_tok), dims, S.Ident(str(name), token_span(name)),
                       _span(type_tok, name))

    def shape(self, *dims):
        return tuple(d for d in dims if d is not None)

    def dim(self, tok):
        value = _integer(tok, "dimension") if tok.type == "INT" else str(tok)
        return S.Dim(value, token_span(tok))

    def inferred_output(self, name):
        return S.OutputDecl(S.Ident(str(name), token_span(name)), None, None, token_span(name))

    def declared_output(self, type_tok, *rest):
        dims = rest[0] if len(rest) == 2 else ()
        name = rest[-1]
        return S.OutputDecl(S.Ident(str(name), token_span(name)), str(type_tok), dims,
                            _span(type_tok, name))

    def statement(self, target, *rest):
        rest = list(rest)
        indices = rest.pop(0) if isinstance(rest[0], tuple) else None
        op_tok, rhs = rest[0], rest[1]
        equivalent = next((r for r in rest[2:] if isinstance(r, _Equivalent)), None)
        where = next((r for r in rest[2:] if isinstance(r, tuple)), ())
        return S.Statement(S.Ident(str(target), token_span(target)), indices, str(op_tok),
                           token_span(op_tok), rhs, where, _span(target, rhs),
                           equivalent.call if equivalent is not None else None)

    def lhs_indices(self, *items):
        return tuple(i for i in items if i is not None)

    def lhs_index(self, tok):
        if isinstance(tok, S.Apply):  # a gathered subscript: a scatter (scatters.py)
            return tok
        if tok.type == "INT":  # a constant subscript: the checker gives it a one-point range
            return S.IntLit(_integer(tok, "integer literal"), token_span(tok))
        return S.Ident(str(tok), token_span(tok))

    def equivalent(self, _tok, call):
        return _Equivalent(call)

    def assign_op(self, tok):
        return tok

    def where_clause(self, *clauses):
        return tuple(clauses)

    def range_clause(self, name, lo, _colon, hi):
        return S.RangeClause(S.Ident(str(name), token_span(name)), lo, hi, _span(name, hi))

    def let_clause(self, name, _eq, value):
        return S.LetClause(S.Ident(str(name), token_span(name)), value, _span(name, value))

    def exists_clause(self, access):
        return S.ExistsClause(access, access.span)

    def ternary(self, cond, _q, then, _c, other):
        return S.TernaryExpr(cond, then, other, _span(cond, other))

    def binexpr(self, *items):
        """`a op b op c ...` grouped by precedence, each level left-associative."""
        operands, operators = list(items[0::2]), list(items[1::2])
        return _climb(operands, operators)

    def unary(self, op, operand):
        return S.UnaryExpr(str(op), operand, _span(op, operand))

    def int_lit(self, tok):
        return S.IntLit(_integer(tok, "integer literal"), token_span(tok))

    def float_lit(self, tok):
        value = float(tok)
        if math.isinf(value):  # float() rounds past float64's range to inf, silently
            raise TCSyntaxError(f"float literal {_shown(tok)} is too large: it would be "
                                "infinite", token_span(tok),
                                hint="float64 holds magnitudes up to about 1.8e308, "
                                     "float32 up to about 3.4e38")
        return S.FloatLit(value, str(tok), token_span(tok))

    def true_lit(self, tok):
        return S.BoolLit(True, token_span(tok))

    def false_lit(self, tok):
        return S.BoolLit(False, token_span(tok))

    def name(self, tok):
        return S.Name(str(tok), token_span(tok))

    def call(self, name, *rest):
        args = tuple(a for a in rest if a is not None and not isinstance(a, Token))
        return S.Apply(str(name), token_span(name), args, _span(name, rest[-1]))

    def cast(self, type_tok, _lpar, operand, rpar):
        return S.CastExpr(str(type_tok), operand, _span(type_tok, rpar))

    def paren(self, lpar, inner, rpar):
        return dataclasses.replace(inner, span=_span(lpar, rpar))


PRECEDENCE = {"||": 1, "&&": 2, "==": 3, "!=": 3, "<": 3, ">": 3, "<=": 3, ">=": 3,
              "+": 4, "-": 4, "*": 5, "/": 5, "%": 5}


def _climb(operands: list, operators: list):
    """Shunting-yard over a flat operand/operator list; all binary operators are left-assoc."""
    out = [operands[0]]
    ops: list[Token] = []

    def reduce_top():
        op = ops.pop()
        rhs, lhs = out.pop(), out.pop()
        out.append(S.BinaryExpr(str(op), lhs, rhs, token_span(op), lhs.span.merge(rhs.span)))

    for op, operand in zip(operators, operands[1:]):
        while ops and PRECEDENCE[str(ops[-1])] >= PRECEDENCE[str(op)]:
            reduce_top()
        ops.append(op)
        out.append(operand)
    while ops:
        reduce_top()
    return out[0]


class _TokenRecorder(PostLex):
    """Hands the parser its tokens unchanged and, while `parse` runs, a copy of them (an
    `itertools.tee`: C code, no Python per token), so that each definition's canonical
    text (the compile cache's key, tclang/driver/cachekey.py) is the very tokens its parse read:
    from its own `def` to its own `}`, whatever shares its lines, however lines end. Per
    thread: the Lark object is shared."""

    always_accept = ()

    def __init__(self):
        self._local = threading.local()

    def process(self, stream):
        if not getattr(self._local, "recording", False):
            return stream
        stream, self._local.copy = itertools.tee(stream)
        return stream

    @contextmanager
    def recording(self):
        self._local.recording, self._local.copy = True, None
        try:
            yield
        finally:
            self._local.recording, self._local.copy = False, None

    def definition_text(self, def_tok: Token) -> str:
        """The tokens from `def_tok` to the definition's closing brace, space-separated
        (braces appear nowhere else in the grammar, so the first one closes it). The
        parser has read them all, and at most one more (the next `def`): the copy hands
        them from its buffer and never makes the lexer read ahead."""
        copy = self._local.copy
        for tok in copy:  # nothing comes before a def but the previous definition's `}`
            if tok is def_tok:
                break
        kept = [def_tok]
        for tok in copy:
            kept.append(tok)
            if tok.type == "RBRACE":
                break
        return " ".join(kept)


_RECORDER = _TokenRecorder()

GRAMMAR = Path(__file__).parent / "grammar.lark"
TABLES = Path(__file__).parent / "grammar_tables.py"
_LARK_OPTIONS = dict(parser="lalr", lexer="contextual", maybe_placeholders=True)
_RUN_OPTIONS = dict(transformer=_ToSyntax(), postlex=_RECORDER)  # not part of the tables


@functools.cache
def _lark_parser() -> lark.Lark:
    grammar = GRAMMAR.read_text()
    kept = _kept_tables(grammar)
    if kept is not None:
        try:
            return lark.Lark._load_from_dict(kept["data"], kept["memo"], **_RUN_OPTIONS)
        except Exception:  # tables Lark cannot read back: build them, as without any
            pass
    return lark.Lark(grammar, **_RUN_OPTIONS, **_LARK_OPTIONS)


def _kept_tables(grammar: str) -> dict | None:
    """grammar_tables.TABLES when they were made from this grammar by this Lark."""
    try:
        from tclang.lang import grammar_tables
    except ImportError:
        return None
    if grammar_tables.GRAMMAR_SHA256 != _digest(grammar) or \
            grammar_tables.LARK_VERSION != lark.__version__:
        return None
    return grammar_tables.TABLES


def _digest(grammar: str) -> str:
    return hashlib.sha256(grammar.encode()).hexdigest()


def tables_source() -> str:
    """The text of grammar_tables.py for the current grammar and Lark."""
    from lark.grammar import Rule
    from lark.lexer import TerminalDef
    grammar = GRAMMAR.read_text()
    data, memo = lark.Lark(grammar, **_LARK_OPTIONS).memo_serialize([TerminalDef, Rule])
    return ('"""Lark\'s LALR tables for grammar.lark, made by `python -m tclang.lang.parser`: do not '
            'edit.\n\nUsed only while the grammar\'s digest and the Lark version match '
            '(tclang/lang/parser.py)."""\n\n'
            f"GRAMMAR_SHA256 = {_digest(grammar)!r}\n"
            f"LARK_VERSION = {lark.__version__!r}\n"
            f"TABLES = {dict(data=data, memo=memo)!r}\n")


def parse(source: str) -> S.Module:
    """Parse every definition of `source`; raises `TCSyntaxError` on malformed text."""
    if not isinstance(source, str):
        raise TCSyntaxError(f"the source must be a str, not {type(source).__name__}")
    text = one_line_end(source)  # Lark counts lines by "\n" alone
    try:
        with _RECORDER.recording():
            definitions = _lark_parser().parse(text)
    except TCSyntaxError as err:
        raise err.with_source(source) from None
    except lark.exceptions.UnexpectedInput as err:
        error = _syntax_error(err, text)  # positions in the text Lark read
        error.source = source  # lines as the user wrote them (the same lines)
        raise error from None
    except lark.exceptions.VisitError as err:  # a transformer callback failed
        if isinstance(err.orig_exc, TCSyntaxError):
            raise err.orig_exc.with_source(source) from None
        raise
    if not definitions:  # the grammar takes none; a source is for its definitions
        line, column = _end_of(text)
        raise TCSyntaxError("the source has no definition (it is empty, or only comments "
                            "and blank lines)", Span(line, column, line, column + 1), source,
                            hint="a source holds definitions: "
                                 "def name(float(N) A) -> (B) { B(i) = A(i) }")
    module = S.Module(tuple(definitions), source)
    _check_depth(module)
    return module


MAX_DEPTH = 400
"""Most levels of real nesting (parentheses, calls, casts, operators of different kinds)."""
MAX_HEIGHT = 2500
"""Most levels of the tree, a flat chain such as `a + b + c` counting one per operator: the
later stages recurse over it, and Python's own compiler (the reference backend) gives up
near 3,000 (CPython 3.11)."""
FRAMES_PER_LEVEL = 16
"""Python frames a stage may spend per tree level (the checker's, measured, is under 8)."""


_room_lock = threading.Lock()
_room_users: dict[int, int] = {}  # thread -> how many recursion_rooms it is inside
_room_limit = [0]  # the recursion limit before the first thread came in


@contextmanager
def recursion_room():
    """Room on Python's stack for the deepest tree the parser accepts, while a stage
    recurses over it. The limit is process-wide, so it is restored only when the last
    thread inside leaves (restoring earlier would cut another thread's room)."""
    me = threading.get_ident()
    with _room_lock:
        if not _room_users:
            _room_limit[0] = sys.getrecursionlimit()
            sys.setrecursionlimit(max(_room_limit[0], FRAMES_PER_LEVEL * MAX_HEIGHT + 1000))
        _room_users[me] = _room_users.get(me, 0) + 1
    try:
        yield
    finally:
        with _room_lock:
            _room_users[me] -= 1
            if not _room_users[me]:
                del _room_users[me]
            if not _room_users:
                sys.setrecursionlimit(_room_limit[0])


def _forget_other_threads() -> None:
    """In a forked child: only the forking thread is there. The lock may have been held by
    another (then the child's first compile waited forever), and the other threads inside
    would have kept the raised limit for the child's life (issue 31)."""
    global _room_lock
    _room_lock = threading.Lock()
    me = threading.get_ident()
    if _room_users and me not in _room_users:
        sys.setrecursionlimit(_room_limit[0])
    for thread in [t for t in _room_users if t != me]:
        del _room_users[thread]


os.register_at_fork(after_in_child=_forget_other_threads)


def _check_depth(module: S.Module) -> None:
    """Refuse absurdly deep expressions with a located error (later stages recurse)."""
    stack = [(e, 1, 1) for d in module.definitions for s in d.statements
             for e in [s.rhs] + [c for c in s.where]]
    while stack:
        node, depth, height = stack.pop()
        if depth > MAX_DEPTH or height > MAX_HEIGHT:
            what = f"nested more than {MAX_DEPTH} levels deep" if depth > MAX_DEPTH else \
                f"more than {MAX_HEIGHT} levels deep (each operator of a chain counts)"
            raise TCSyntaxError(f"expression {what}", node.span, module.source,
                                hint="split it into where-locals or separate statements")
        for child in _children(node):
            chained = _continues_chain(node, child)
            stack.append((child, depth if chained else depth + 1, height + 1))


def _continues_chain(node, child) -> bool:
    """Whether `child` is the left operand of `node` in a flat chain such as `a + b + c`:
    such a chain is written without nesting, however long."""
    return isinstance(node, S.BinaryExpr) and isinstance(child, S.BinaryExpr) and \
        child is node.lhs


def _children(node) -> tuple:
    match node:
        case S.Apply(args=args):
            return args
        case S.CastExpr(operand=x) | S.UnaryExpr(operand=x) | S.LetClause(value=x):
            return (x,)
        case S.BinaryExpr(lhs=a, rhs=b) | S.RangeClause(lo=a, hi=b):
            return (a, b)
        case S.TernaryExpr(cond=c, then=t, other=o):
            return (c, t, o)
        case S.ExistsClause(access=a):
            return (a,)
    return ()


# ---- turning Lark's errors into the user's words ----------------------------------------

_TERMINAL_WORDS = {
    "NAME": "a name", "INT": "an integer", "FLOAT": "a number", "TYPE": "a type",
    "LPAR": "'('", "RPAR": "')'", "LBRACE": "'{'", "RBRACE": "'}'", "COMMA": "','",
    "SEMICOLON": "';'", "COLON": "':'", "QMARK": "'?'", "EQUIV": "'<=>'", "EQ": "'='",
    "MINUS": "'-'",
    "DEF": "'def'", "WHERE": "'where'", "IN": "'in'", "EXISTS": "'exists'",
    "__ANON_0": "'->'", "BINOP": "an operator", "UNARY_OP": "'-' or '!'",
    "TRUE": "'true'", "FALSE": "'false'", "$END": "the end of the source",
}
_ASSIGN_TERMINALS = {"EQ", "PLUS_EQ", "PLUS_EQ_B", "TIMES_EQ", "TIMES_EQ_B", "MIN_EQ",
                     "MIN_EQ_B", "MAX_EQ", "MAX_EQ_B"}
_EXPR_START = {"NAME", "INT", "FLOAT", "TYPE", "LPAR", "UNARY_OP", "TRUE", "FALSE"}


_OPERATORS = {"BINOP", "QMARK"}


def _describe_expected(expected: set[str]) -> str:
    """A short phrase for what the parser would have accepted, grouped into categories."""
    names = set(expected)
    words = []
    for group, word, least in ((_EXPR_START, "an expression", 3),
                               (_ASSIGN_TERMINALS, "an assignment operator (=, +=!, +=, ...)", 3),
                               (_OPERATORS, "an operator", 2)):
        if len(names & group) >= least:
            words.append(word)
            names -= group
    for name in sorted(names, key=lambda n: (n != "RPAR", n)):
        word = _TERMINAL_WORDS.get(name) or _literal_of(name)
        if word not in words:
            words.append(word)
    words = words[:5]
    if len(words) == 1:
        return words[0]
    return ", ".join(words[:-1]) + " or " + words[-1]


def _literal_of(terminal: str) -> str:
    try:
        pattern = _lark_parser().get_terminal(terminal).pattern
    except (KeyError, AttributeError):
        return terminal.lower()
    return f"'{pattern.value}'" if pattern.type == "str" else terminal.lower()


def _found(err: lark.exceptions.UnexpectedInput, source: str) -> str:
    if isinstance(err, lark.exceptions.UnexpectedCharacters):
        return f"'{source[err.pos_in_stream]}'"
    token = getattr(err, "token", None)
    if token is None or token.type == "$END":
        return "end of the source"
    return f"'{token}'"


def _syntax_error(err: lark.exceptions.UnexpectedInput, source: str) -> TCSyntaxError:
    found = _found(err, source)
    if isinstance(err, lark.exceptions.UnexpectedCharacters):
        expected = set()  # the contextual lexer's guess is imprecise; the character is enough
    else:  # `accepts` is exact; `expected` includes tokens of merged LALR states
        expected = set(getattr(err, "accepts", None) or getattr(err, "expected", None) or ())
    token = getattr(err, "token", None)
    if token is not None and token.type != "$END":
        span = token_span(token)
    else:
        line, column = _position(err, source)
        span = Span(line, column, line, column + 1)
    what = "character" if isinstance(err, lark.exceptions.UnexpectedCharacters) else ""
    message = f"unexpected {what + ' ' if what else ''}{found}"
    if expected:
        message += f"; expected {_describe_expected(expected)}"
    return TCSyntaxError(message, span, source, hint=_hint(found, expected))


def _position(err: lark.exceptions.UnexpectedInput, source: str) -> tuple[int, int]:
    if isinstance(err, lark.exceptions.UnexpectedCharacters):
        return err.line, err.column
    return _end_of(source)


def _end_of(source: str) -> tuple[int, int]:
    """The line and column just past the source's last visible character."""
    lines = source_lines(source.rstrip())
    return len(lines), len(lines[-1]) + 1


def _hint(found: str, expected: set[str]) -> str | None:
    if found == "end of the source":
        if "RBRACE" in expected:
            return "a definition is missing its closing '}'"
        if "RPAR" in expected:
            return "a '(' is not closed"
        return "the source ends in the middle of a definition"
    if expected & _ASSIGN_TERMINALS and found in ("'=='", "'-'", "'+'"):
        return "a statement is `T(i, j) OP expr` with OP one of =, +=!, +=, *=!, min=!, max=!"
    if {"RPAR", "COMMA"} <= expected <= {"RPAR", "COMMA", "LPAR"} and \
            found in ("'+'", "'-'", "'*'", "'/'", "'%'"):  # (LPAR: a scatter's H(Ids(i)))
        return ("a left side's subscripts (and a declaration's dimensions) are names or "
                "integer constants, C(i, 0), or on the left a tensor read, H(Ids(i)) (a "
                "scatter): shift the reads on the right instead, C(i) = A(i - 1)")
    if found == "'<=>'":
        return "`<=> name(args)` comes right after the statement's expression, before `where`"
    if found in ("'['", "']'"):
        return "tensors are read with parentheses: A(i, j)"
    if found == "'.'":
        return "write a number with a digit on each side of '.', e.g. 0.5"
    if "DEF" in expected and found != "'def'":
        return "a source holds definitions: def name(float(N) A) -> (B) { ... }"
    return None


if __name__ == "__main__":  # python -m tclang.lang.parser: write grammar_tables.py
    TABLES.write_text(tables_source())
    print(f"wrote {TABLES}")
