"""A TCError raised out of the public API shows the user's frame and the message, not
tclang's (and Lark's) frames: tclang/boundary.py api_boundary. TCLANG_TRACEBACK=full keeps
them for bug reports; errors that are bugs (not TCError) keep every frame; the CLI prints
`error: <message>` and exits 1."""

from __future__ import annotations

import os
import subprocess
import sys
import traceback
from pathlib import Path

import numpy as np
import pytest

import tclang as tc

ROOT = Path(__file__).resolve().parents[2]
INTERNAL = tuple(str(ROOT / d) + os.sep for d in ("tclang", "polyhedral", "backends"))
TOO_BIG = "def f(float(N) A) -> (B) { B(i) = A(i) * 99999999999999999999999999999 }"
ADD = "def add(float(N) A, float(N) B) -> (C) { C(i) = A(i) + B(i) }"


def frames(err: BaseException) -> list[str]:
    """The files of the traceback as Python would print it."""
    return [f.filename for f in traceback.extract_tb(err.__traceback__)]


def internal(files: list[str]) -> list[str]:
    return [f for f in files if f.startswith(INTERNAL) or "site-packages" in f]


def raised(call) -> BaseException:
    with pytest.raises(BaseException) as info:
        call()
    return info.value


def mismatched_call():
    tc.define(ADD).add(np.ones(3, np.float32), np.ones(4, np.float32))


def bad_gradient_call():
    g = tc.grad(tc.define("def mm(float(M,K) A, float(K,N) B) -> (C) "
                          "{ C(m,n) +=! A(m,k) * B(k,n) }").mm)
    g(np.ones((2, 3), np.float32), np.ones((3, 4), np.float32), np.ones((5, 5), np.float32))


@pytest.mark.parametrize("call, error", [
    (lambda: tc.define(TOO_BIG), tc.TCSyntaxError),  # 9 of Lark's frames before
    (mismatched_call, tc.TCArgumentError),
    (bad_gradient_call, tc.TCArgumentError),
    (lambda: tc.grad(tc.define(ADD).add, wrt="Z"), tc.TCGradError),
    (lambda: tc.define(ADD)["sub"], tc.TCError),
    (lambda: tc.Options(tile="big"), tc.TCScheduleError),
    (lambda: tc.define(ADD, options=tc.Options.parse("tiles=3")), tc.TCScheduleError),
], ids=["define", "kernel-call", "grad-call", "grad", "getitem", "options",
        "options-parse"])
def test_an_error_shows_the_callers_frame_not_tclangs(monkeypatch, call, error):
    monkeypatch.delenv("TCLANG_TRACEBACK", raising=False)
    err = raised(call)
    assert isinstance(err, error)
    files = frames(err)
    assert internal(files) == [], files
    assert files[-1] == __file__  # the user's line is the last one shown
    text = "".join(traceback.format_exception(err))
    assert "lark" not in text and "During handling" not in text and "direct cause" not in text
    assert err.internal_traceback is not None  # kept for tools (the fuzzer says where)


def test_tclang_traceback_full_keeps_every_frame(monkeypatch):
    monkeypatch.setenv("TCLANG_TRACEBACK", "full")
    err = raised(lambda: tc.define(TOO_BIG))
    files = frames(err)
    assert any(f.endswith(os.path.join("lang", "parser.py")) for f in files)
    assert any("lark" in f for f in files)


def test_an_internal_error_keeps_its_frames():
    """A bug is not the user's error: nothing is hidden (tc.grad of a non-kernel is a
    TypeError raised inside tclang)."""
    err = raised(lambda: tc.grad(42))
    assert isinstance(err, TypeError)
    assert internal(frames(err)), frames(err)


def run_cli(*args: str, **env: str) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if k != "TCLANG_TRACEBACK"}
    environ.update(env, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-c", "import sys; from tclang.cli import main; "
                           "sys.exit(main())", *args], capture_output=True, text=True,
                          env=environ, timeout=120)


def test_the_cli_prints_error_and_the_message_and_exits_1(tmp_path):
    source = tmp_path / "k.tc"
    source.write_text(ADD)
    done = run_cli("explain", str(source), "--entry", "sub")
    assert done.returncode == 1
    assert done.stderr == f"{source}: error: no definition named 'sub': this source " \
                          "defines add\n"
    source.write_text(TOO_BIG)
    done = run_cli("check", str(source))
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.startswith(f"{source}: syntax error at line 1, column 42")
    done = run_cli("check", str(source), TCLANG_TRACEBACK="full")
    assert done.returncode == 1 and "Traceback" in done.stderr and "parser.py" in done.stderr
    assert done.stderr.rstrip().endswith("hint: use a float literal (e.g. 1e20)")
