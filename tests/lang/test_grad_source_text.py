"""tc.grad prints typed expressions back as source (tclang/autodiff/source_text.py), and
some of that text recomputes a forward value (max=!'s tie count compares each candidate
with the max): printing then parsing must give back the same tree, so that the recomputed
value rounds exactly as the forward's did (`C(j, k) * (D(k) / 3.0)` was printed as
`C(j, k) * D(k) / 3.0`: grad-max-ties-reprinted)."""

from __future__ import annotations

import random

import pytest

from tclang.autodiff.source_text import source
from tclang.fuzzing.generator import generate
from tclang.lang import program as P
from tclang.lang.frontend import check_source


def _same_value(e, casts: bool = True):
    """The checker's `Cast(Const)` and the folded literal source() prints for it are one
    value: compare them as the literal. Without `casts`, the operator tree alone (casts
    and types left out): a literal printed folded (`1.0` for a float16 `1`) types
    otherwise when parsed back, so a cast can move (`float(c ? A : 1)` comes back as
    `c ? float(A) : 1.0`); the order of evaluation, which this checks, cannot."""
    if isinstance(e, P.Cast) and isinstance(e.operand, P.Const) and \
            not isinstance(e.operand.value, bool):
        return ("const", float(e.operand.value), e.dtype if casts else None)
    if isinstance(e, P.Const) and not isinstance(e.value, bool):
        return ("const", float(e.value), e.dtype if casts else None)
    if isinstance(e, P.Cast) and not casts:
        return _same_value(e.operand, casts)
    if isinstance(e, tuple):
        return tuple(_same_value(x, casts) for x in e)
    if hasattr(e, "__dataclass_fields__"):
        return (type(e).__name__,) + tuple(
            _same_value(getattr(e, f), casts) for f, spec in e.__dataclass_fields__.items()
            if spec.compare and (casts or f != "dtype"))
    return e


def _op_text(s: P.Statement) -> str:
    return "=" if s.op == "=" else f"{s.op}={'!' if s.reset else ''}"


def _reprinted(text: str, casts: bool = True) -> int:
    """Reprint the right side of every statement of `text` (a Let, or a statement with a
    where-local, is left alone) and check it parses to the same tree; how many were."""
    program = check_source(text)
    checked = 0
    for defn in program.definitions:
        for s in defn.statements:
            tail = s.text[s.text.index(" where "):] if " where " in s.text else ""
            if "=" in tail or any(isinstance(x, P.Let) for x in _walk(s.rhs)):
                continue
            lhs = f"{s.target}({', '.join(s.indices)})" if s.indices else s.target
            again = f"{lhs} {_op_text(s)} {source(s.rhs)}{tail}"
            assert s.text in text
            other = check_source(text.replace(s.text, again, 1))
            t = next(d for d in other.definitions if d.name == defn.name)
            assert _same_value(t.statements[s.position].rhs, casts) == \
                _same_value(s.rhs, casts), \
                (s.text, again)
            checked += 1
    return checked


def _walk(e):
    yield e
    if hasattr(e, "__dataclass_fields__"):
        for f in e.__dataclass_fields__:
            v = getattr(e, f)
            for x in (v if isinstance(v, tuple) else (v,)):
                if hasattr(x, "__dataclass_fields__"):
                    yield from _walk(x)


@pytest.mark.parametrize("rhs, printed", [
    ("C(j, k) * (D(k) / 3.0)", "C(j, k) * (D(k) / 3.0)"),
    ("C(j, k) * D(k) / 3.0", "C(j, k) * D(k) / 3.0"),
    ("C(j, k) + (D(k) + 1.0)", "C(j, k) + (D(k) + 1.0)"),
    ("C(j, k) - (D(k) - 1.0)", "C(j, k) - (D(k) - 1.0)"),
    ("(C(j, k) - D(k)) - 1.0", "C(j, k) - D(k) - 1.0"),
    ("C(j, k) / (D(k) * 2.0)", "C(j, k) / (D(k) * 2.0)"),
    ("-(C(j, k) * D(k))", "-(C(j, k) * D(k))"),
    ("C(j, k) > D(k) ? C(j, k) * (D(k) * D(k)) : 0.0",
     "C(j, k) > D(k) ? C(j, k) * (D(k) * D(k)) : 0.0"),
])
def test_printing_then_parsing_gives_the_same_tree(rhs, printed):
    text = f"def f(double(N, K) C, double(K) D) -> (O) {{\n    O(j) max=! {rhs}\n}}\n"
    s = check_source(text).definitions[0].statements[0]
    assert source(s.rhs) == printed
    assert _reprinted(text) == 1


def test_the_fuzzers_expressions_print_back_to_the_same_tree():
    rng = random.Random(7)
    checked = sum(_reprinted(generate(rng).source, casts=False) for _ in range(150))
    assert checked > 150
