"""Each definition is keyed by its own tokens (issue 31, item 1).

The compile cache, the disk cache, the call records and the tuning database all key a
kernel by its definition's canonical text. That text was once lexed again from the
start of the definition's *line*, so the second of two definitions on one line (or on
lines ended by a bare "\\r") was keyed by the first one's tokens: a `b` compiled earlier
with another body came back from memory, from the disk in every later process, and from
the tuning database. The key is now the tokens the definition's own parse read.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import tclang as tc
from tclang.driver.cachekey import canonical_source
from tclang.driver.tuning_database import kernel_key

ROOT = Path(__file__).resolve().parents[2]


def two_on_a_line(factor: str, between: str = " ") -> str:
    """`a` and `b` on one line (or on lines `between` ends); only b's factor varies."""
    return ("def a(float(N) X) -> (Y) { Y(i) = X(i) * 2.0 }" + between +
            f"def b(float(N) X) -> (Y) {{ Y(i) = X(i) * {factor} }}")


X = np.arange(1, 5, dtype=np.float32)


@pytest.mark.parametrize("between", [" ", "\r", "\r\n", "  # a comment\n"],
                         ids=["one line", "bare CR", "CRLF", "comment"])
def test_second_definition_on_a_line_keys_by_its_own_tokens(between):
    three = tc.define(two_on_a_line("3.0", between), backend="reference")
    five = tc.define(two_on_a_line("5.0", between), backend="reference")
    np.testing.assert_array_equal(three.b(X), X * 3)
    np.testing.assert_array_equal(five.b(X), X * 5)  # not three.b's kernel from memory
    np.testing.assert_array_equal(five.a(X), X * 2)
    alone = tc.define("def b(float(N) X) -> (Y) {\n  Y(i) = X(i) * 5.0  # alone\n}")
    assert canonical_source(five.b.definition) == canonical_source(alone.b.definition)
    assert canonical_source(three.b.definition) != canonical_source(five.b.definition)


def test_tuning_database_key_of_the_second_definition():
    """options="tuned" looks the kernel up by this key: b with another body must not
    find the options stored for the first."""
    keys = {kernel_key(canonical_source(tc.define(two_on_a_line(f)).b.definition), "b",
                       ((1, "<f4", (1,)),), "cpu") for f in ("3.0", "5.0")}
    assert len(keys) == 2


SECOND_DEFINITION = r"""
import numpy as np, tclang as tc
x = np.arange(1, 5, dtype=np.float32)
print(tc.define({src!r}).b(x).tolist())
"""


def test_a_fresh_process_sharing_the_disk_cache_gets_its_own_kernel(tmp_path):
    """The first process compiles b = 3x into the disk cache; the second, whose b is 5x,
    must compile its own instead of loading the first one's object code."""
    env = dict(os.environ, TCLANG_CACHE_DIR=str(tmp_path), PYTHONPATH=str(ROOT))
    results = []
    for factor in ("3.0", "5.0", "5.0"):
        code = SECOND_DEFINITION.format(src=two_on_a_line(factor))
        run = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, text=True,
                             capture_output=True, timeout=120)
        assert run.returncode == 0, run.stderr
        results.append(run.stdout.strip())
    assert results == [str((X * 3).tolist()), str((X * 5).tolist()), str((X * 5).tolist())]


def test_generated_definitions_keep_distinct_keys():
    """tc.grad's backward and forward sources are parsed like any source: the gradients
    of the two b's are their own."""
    dy = np.ones(4, np.float32)
    for factor in (3.0, 5.0):
        module = tc.define(two_on_a_line(f"{factor}"), backend="reference")
        (dx,) = (tc.grad(module.b)(X, dy),)
        np.testing.assert_array_equal(np.asarray(dx).ravel(), np.full(4, factor, np.float32))


def test_threads_parsing_at_once_each_key_their_own_definitions():
    """The parser keeps the tokens it reads per thread (the Lark object is shared)."""
    import threading

    from tclang.lang.frontend import check_source
    wrong = []

    def parse(k: int):
        for _ in range(10):
            b = check_source(two_on_a_line(f"{k}.0"))["b"]
            if canonical_source(b) != f"def b ( float ( N ) X ) -> ( Y ) {{ Y ( i ) = " \
                                      f"X ( i ) * {k}.0 }}":
                wrong.append((k, canonical_source(b)))

    threads = [threading.Thread(target=parse, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not wrong, wrong[:3]


def test_the_code_digest_changes_with_any_code_file_and_only_those(tmp_path):
    """The compiler's code in the key is read from its files' contents: an edit of the same
    size at the same modification time (packagers set every time alike) changes it; a
    compiled .pyc or a file that is not code does not."""
    import os

    from tclang.driver.cachekey import files_digest
    package = tmp_path / "pkg"
    (package / "sub" / "__pycache__").mkdir(parents=True)
    code = package / "sub" / "stage.py"
    code.write_text("x = 1\n")
    (package / "grammar.lark").write_text("start: x\n")
    os.utime(code, ns=(1, 1))
    digest = lambda: files_digest(str(tmp_path), ("pkg",))  # noqa: E731
    before = digest()
    (package / "sub" / "__pycache__" / "stage.cpython-311.pyc").write_bytes(b"\0" * 9)
    (package / "NOTES.txt").write_text("notes\n")
    assert digest() == before
    code.write_text("x = 2\n")
    os.utime(code, ns=(1, 1))  # the same size and time
    assert digest() != before
    changed = digest()
    (package / "sub" / "new.py").write_text("")
    assert digest() not in (before, changed)
