"""Every ```python snippet of README.md and docs/*.md runs: a doc that does not run is a
failing test.

Each file's snippets run in order, in one namespace, in a fresh interpreter with a
temporary working directory and tuning database; every tuning is capped at two trials
(TCLANG_MAX_TRIALS, a documented switch) and timed as briefly as it can be (one round of
tc.compare, 10 ms a timing, the machine's limits measured on small arrays), so the tuning
examples run in seconds. A snippet that imports torch is skipped where PyTorch is not
installed. A snippet marked `<!-- raises: TCScheduleError -->` on the line before it must
raise that error (the docs show refusals too); one marked `<!-- not-run: reason -->` is
not run, and such snippets are kept few.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
MARK = re.compile(r"<!--\s*(not-run|raises):\s*(.*?)\s*-->")
HAVE_TORCH = importlib.util.find_spec("torch") is not None


@dataclass(frozen=True)
class Snippet:
    path: Path
    line: int  # of the first line of code (1-based)
    code: str
    mark: str  # "", "not-run" or "raises"
    reason: str  # the marker's text: why not run, or the error it raises

    @property
    def needs_torch(self) -> bool:
        return re.search(r"^\s*(import torch|from torch|import tclang\.torch)", self.code,
                         re.M) is not None


def snippets(path: Path) -> list[Snippet]:
    """The ```python blocks of a markdown file, each with the marker on the line before."""
    lines = path.read_text().split("\n")
    found, k = [], 0
    while k < len(lines):
        if lines[k].strip() == "```python":
            end = next(j for j in range(k + 1, len(lines)) if lines[j].strip() == "```")
            before = lines[k - 1] if k else ""
            mark = MARK.search(before)
            found.append(Snippet(path, k + 2, "\n".join(lines[k + 1:end]),
                                 mark.group(1) if mark else "",
                                 mark.group(2) if mark else ""))
            k = end
        k += 1
    return found


# Runs in the child: each snippet compiled under its file name and line (a traceback
# points into the doc), executed in one namespace; reports a JSON line per snippet.
RUNNER = r"""
import json, sys, traceback
from tclang.driver import roofline
from tclang.tuning import compare, search
# timings as short as they can be: whether the examples run is tested, not their speed
compare.compare.__kwdefaults__.update(rounds=1, min_time=0.01)
search.autotune.__kwdefaults__.update(min_time=0.01)
measure = roofline.machine_limits
roofline.machine_limits = lambda gap=0.0: measure(gap=0.0, n=256, triad_elements=10**6)
namespace = {"__name__": "__doc_snippets__"}
for item in json.loads(sys.stdin.read()):
    code = compile("\n" * (item["line"] - 1) + item["code"], item["file"], "exec")
    try:
        exec(code, namespace)
    except BaseException as err:
        if item["raises"] and type(err).__name__ == item["raises"]:
            print(json.dumps({"line": item["line"], "ok": True}), flush=True)
            continue
        print(json.dumps({"line": item["line"], "ok": False,
                          "error": "".join(traceback.format_exception(err))}), flush=True)
        break
    else:
        ok = not item["raises"]
        print(json.dumps({"line": item["line"], "ok": ok,
                          "error": "" if ok else f"did not raise {item['raises']}"}),
              flush=True)
        if not ok:
            break
"""


def documented() -> list[Path]:
    return [p for p in DOCS if snippets(p)]


@pytest.mark.parametrize("path", documented(), ids=lambda p: str(p.relative_to(ROOT)))
def test_the_python_snippets_of_a_doc_run(path, tmp_path):
    run = [s for s in snippets(path) if s.mark != "not-run"
           and (HAVE_TORCH or not s.needs_torch)]
    if not run:
        pytest.skip("every snippet needs PyTorch")
    items = [{"file": str(path), "line": s.line, "code": s.code,
              "raises": s.reason if s.mark == "raises" else ""} for s in run]
    env = dict(os.environ, PYTHONPATH=str(ROOT), TCLANG_MAX_TRIALS="2", MPLBACKEND="Agg",
               TCLANG_TUNING_DB=str(tmp_path / "tuning.sqlite"))  # (the session's cache)
    env.pop("TCLANG_TRACEBACK", None)
    done = subprocess.run([sys.executable, "-c", RUNNER], input=json.dumps(items),
                          capture_output=True, text=True, cwd=tmp_path, env=env,
                          timeout=300)
    reports = [json.loads(line) for line in done.stdout.splitlines()
               if line.startswith('{"line"')]
    failed = [r for r in reports if not r["ok"]]
    assert not failed, f"{path.name}, snippet at line {failed[0]['line']}:\n" \
                       f"{failed[0]['error']}"
    assert done.returncode == 0 and len(reports) == len(items), done.stderr[-3000:]


def test_snippets_not_run_are_few_and_say_why():
    skipped = [s for p in DOCS for s in snippets(p) if s.mark == "not-run"]
    assert all(s.reason for s in skipped)
    assert len(skipped) <= 3, [f"{s.path.name}:{s.line}" for s in skipped]
    assert sum(len(snippets(p)) for p in DOCS) >= 10  # the docs do have snippets


def test_the_snippet_reader_sees_markers_and_lines(tmp_path):
    doc = tmp_path / "d.md"
    doc.write_text("text\n```python\nx = 1\n```\n<!-- not-run: needs a cluster -->\n"
                   "```python\nconnect()\n```\n<!-- raises: TCError -->\n```python\n"
                   "tc.define('')\n```\n```\nnot python\n```\n")
    found = snippets(doc)
    assert [(s.line, s.mark, s.reason) for s in found] == [
        (3, "", ""), (7, "not-run", "needs a cluster"), (11, "raises", "TCError")]


def test_max_trials_caps_a_tuning(monkeypatch):
    """TCLANG_MAX_TRIALS, which the snippets run under: read at each tuning, checked."""
    import tclang as tc
    from tclang.tuning.search import max_trials
    monkeypatch.delenv("TCLANG_MAX_TRIALS", raising=False)
    assert max_trials() is None
    monkeypatch.setenv("TCLANG_MAX_TRIALS", "3")
    assert max_trials() == 3
    monkeypatch.setenv("TCLANG_MAX_TRIALS", "many")
    with pytest.raises(tc.TCError, match="TCLANG_MAX_TRIALS must be a whole number of at least 1"):
        max_trials()
