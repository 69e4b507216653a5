"""The kept LALR tables (tclang/lang/grammar_tables.py) are current and parse exactly as the
tables Lark builds from grammar.lark."""

from __future__ import annotations

import lark
import pytest

from tclang.lang import grammar_tables, parser
from tclang.errors import TCSyntaxError
from tests.corpus import CASES

BROKEN = ["def f(float(N) A) -> (B) { B(i) = A(i) + }",
          "def f(float(N) A) -> (B) { B(i) = A(i)",
          "def (float(N) A) -> (B) { B(i) = A(i) }",
          "def f(float(N) A) -> (B) { B(i) == A(i) }",
          "def f(float(N) A) -> (B) { B(i) +=! A(i) where i in 0:N:2 }",
          "def f(float(N) A) -> (B) { B(i) = A(i) } }",
          "def f(float(N) A) -> (B) { B(i) = 3.0e }"]


def test_the_tables_were_made_from_this_grammar():
    assert grammar_tables.GRAMMAR_SHA256 == parser._digest(parser.GRAMMAR.read_text()), \
        "grammar.lark changed: run `python -m tclang.lang.parser` to write grammar_tables.py again"


def test_the_kept_tables_are_used():
    if grammar_tables.LARK_VERSION != lark.__version__:
        pytest.skip(f"tables made by Lark {grammar_tables.LARK_VERSION}, this is "
                    f"{lark.__version__}: Lark builds them (run `python -m tclang.lang.parser`)")
    assert parser._kept_tables(parser.GRAMMAR.read_text()) is grammar_tables.TABLES


def _outcome(parse, source: str):
    try:
        return parse(source)
    except TCSyntaxError as err:
        return str(err)


def test_kept_and_built_tables_parse_alike(monkeypatch):
    sources = [c.source for c in CASES] + BROKEN
    kept = [_outcome(parser.parse, s) for s in sources]
    parser._lark_parser.cache_clear()
    monkeypatch.setattr(parser, "_kept_tables", lambda grammar: None)
    try:
        built = [_outcome(parser.parse, s) for s in sources]
    finally:
        parser._lark_parser.cache_clear()
    assert kept == built
    assert sum(isinstance(k, str) for k in kept) >= len(BROKEN)


def test_unreadable_tables_fall_back_to_building(monkeypatch):
    monkeypatch.setattr(parser, "_kept_tables", lambda grammar: {"data": {}, "memo": {}})
    parser._lark_parser.cache_clear()
    try:
        assert parser.parse("def f(float(N) A) -> (B) { B(i) = A(i) }").definitions
    finally:
        parser._lark_parser.cache_clear()
