"""The import rules of docs/architecture.md, checked two ways: every import statement of a
backend module (top level or inside a function) read from its source, and each backend
module imported in a fresh interpreter under a meta-path hook that fails on a forbidden
module, whoever pulls it in (a package `__init__`, a helper of a helper)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

#: what the backends must never import: the driver's side of the contract, the user's
#: options, the polyhedral layer past its loop IR, isl, and the language's symbolic forms
#: (quasi-affine subscripts, size expressions: the loop IR carries them lowered)
FORBIDDEN_FOR_BACKENDS = ("tclang.driver.compiler", "tclang.runtime.arguments", "tclang.options",
                          "tclang.runtime.kernels", "tclang.cli", "tclang.tools.commands", "polyhedral",
                          "islpy", "lark", "tclang.lang.affine", "tclang.lang.sizes")
ALLOWED_FOR_BACKENDS = ("polyhedral.loop_ir",)


def forbidden(name: str) -> bool:
    if name in ALLOWED_FOR_BACKENDS or name == "polyhedral":  # the empty package __init__
        return False
    return any(name == f or name.startswith(f + ".") for f in FORBIDDEN_FOR_BACKENDS)


def backend_modules() -> list[str]:
    return sorted(".".join(p.relative_to(ROOT).with_suffix("").parts)
                  for p in (ROOT / "backends").rglob("*.py") if p.name != "__init__.py")


def imported_names(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every import statement in a file, wherever it stands."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
            found += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
    return found


def test_no_backend_source_imports_a_forbidden_module():
    bad = [f"{module}:{line} imports {name}"
           for module in backend_modules()
           for line, name in imported_names(ROOT / Path(*module.split(".")).with_suffix(".py"))
           if forbidden(name)]
    assert not bad, "\n".join(bad)


# Run in a fresh interpreter: installs the hook, then forks one child per module so that
# each import starts from the same nearly empty sys.modules.
PROBE = r"""
import importlib.abc, os, sys, traceback

FORBIDDEN = %r
ALLOWED = %r

def forbidden(name):
    if name in ALLOWED or name == "polyhedral":
        return False
    return any(name == f or name.startswith(f + ".") for f in FORBIDDEN)

class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if forbidden(name):
            raise ImportError(f"forbidden import of {name}")
        return None

sys.meta_path.insert(0, Refuse())
failed = 0
for module in sys.argv[1:]:
    pid = os.fork()
    if pid == 0:
        try:
            importlib.import_module(module)
        except BaseException:
            print(f"--- {module}:", traceback.format_exc(limit=-6), flush=True)
            os._exit(1)
        os._exit(0)
    failed |= os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) != 0
sys.exit(1 if failed else 0)
"""


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="needs fork")
def test_no_backend_module_pulls_in_a_forbidden_module():
    modules = backend_modules()
    probe = PROBE % (FORBIDDEN_FOR_BACKENDS, ALLOWED_FOR_BACKENDS)
    result = subprocess.run([sys.executable, "-c", probe, *modules], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_probe_catches_a_forbidden_import():
    """The hook itself works: a module that imports the driver is refused."""
    probe = PROBE % (FORBIDDEN_FOR_BACKENDS, ALLOWED_FOR_BACKENDS)
    result = subprocess.run([sys.executable, "-c", probe, "tclang.runtime.kernels"], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 1 and "forbidden import of" in result.stdout


def test_the_package_imports_neither_isl_nor_the_driver():
    """`import tclang` loads the language's errors only: islpy, Lark, LLVM and the
    backends load when a definition is checked or compiled."""
    code = ("import sys, tclang; heavy = sorted(m for m in sys.modules if m.split('.')[0] in "
            "('islpy', 'lark', 'llvmlite', 'backends', 'polyhedral') or m in "
            "('tclang.driver.compiler', 'tclang.runtime.kernels', 'tclang.options')); print(heavy)")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                            text=True, timeout=120)
    assert result.stdout.strip() == "[]", result.stdout + result.stderr


def test_the_language_imports_only_itself_and_the_shared_values():
    """tclang/lang/ (source -> syntax -> checked program, and the rewrites of a checked
    definition) is the bottom of the package: it imports nothing of the driver, the
    runtime, the CLI, polyhedral/ or backends/, only itself, tclang.errors and
    tclang.dtypes (docs/architecture.md)."""
    allowed = ("tclang.lang", "tclang.errors", "tclang.dtypes")
    bad = []
    for path in sorted((ROOT / "tclang" / "lang").rglob("*.py")):
        for line, name in imported_names(path):
            if name.split(".")[0] in ("tclang", "polyhedral", "backends") and not any(
                    name == a or name.startswith(a + ".") for a in allowed):
                bad.append(f"{path.relative_to(ROOT)}:{line} imports {name}")
    assert bad == []
