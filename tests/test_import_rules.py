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

#: the ground values every layer shares: flat files at the top of tclang/ (the wings are
#: folders); they import only one another and the package face
GROUND = ("tclang.errors", "tclang.boundary", "tclang.dtypes", "tclang.bfloat16", "tclang.environment",
          "tclang.options", "tclang.target", "tclang.machine", "tclang.layouts",
          "tclang.budget", "tclang.stages", "tclang.locks", "tclang.atomic_files",
          "tclang.forked_server", "tclang.recent", "tclang.ctrl_c", "tclang.version")
TOOLS = ("tclang.tools", "tclang.tuning", "tclang.fuzzing", "tclang.autodiff", "tclang.peers",
         "tclang.torch", "tclang.torch_ops", "tclang.cli")
#: the only modules checked for (imported names outside these are the standard library's
#: and NumPy's): tclang's packages and the heavy dependencies a layer may or may not load
WATCHED = ("tclang", "polyhedral", "backends", "islpy", "lark", "llvmlite", "pycuda", "torch")

#: layer -> (its modules, what they may import among WATCHED): every arrow between layers
#: is listed here, so a new one is a decision (docs/architecture.md, Import direction)
RULES = {
    "ground": (GROUND, GROUND),
    "language": (("tclang.lang",), ("tclang.lang", "tclang.errors", "tclang.dtypes", "lark")),
    "polyhedral": (("polyhedral",), ("polyhedral", "tclang.lang", *GROUND, "islpy")),
    # the loop IR, the contract and a few ground values; never the driver (a cache
    # directory and a helper process come through backends/contract.py and
    # tclang.forked_server), the options, the polyhedral layer past its loop IR, isl, Lark,
    # or the language's symbolic forms (tclang.lang.program names their types only)
    "backends": (("backends",), ("backends", "polyhedral.loop_ir", "tclang.lang.program",
                                 "tclang.errors", "tclang.dtypes", "tclang.bfloat16",
                                 "tclang.environment", "tclang.target", "tclang.machine",
                                 "tclang.locks", "tclang.atomic_files", "tclang.budget",
                                 "tclang.forked_server", "llvmlite", "pycuda", "torch")),
    # the door and its caches (the tuning database it reads tuned options from among
    # them): everything below it, never the runtime, the tools or the package face
    "driver": (("tclang.driver",), ("tclang.driver", "tclang.lang", *GROUND, "polyhedral",
                                    "backends", "llvmlite")),
    # calls compile through the door; Kernel.export is its one arrow up
    "runtime": (("tclang.runtime",), ("tclang.runtime", "tclang.lang", *GROUND,
                                      "tclang.driver.compiler", "tclang.driver.registry",
                                      "tclang.driver.call_records", "tclang.driver.summary",
                                      "polyhedral.loop_ir", "polyhedral.bounds_runtime",
                                      "tclang.driver.roofline", "tclang.export.library",
                                      "torch")),
    "export": (("tclang.export",), ("tclang.export", "tclang.lang", *GROUND,
                                    "tclang.driver.compiler", "tclang.runtime.arguments",
                                    "polyhedral.loop_ir", "polyhedral.subscripts",
                                    "backends.access_errors", "backends.cuda.codegen",
                                    "backends.cuda.launches", "backends.llvm.export")),
    # the tools (and the package face) see every wing, never the polyhedral layer past the
    # loop IR's readers: a compile goes through the door
    "tools": (TOOLS + ("tclang",), TOOLS + ("tclang", "tclang.lang", "tclang.driver",
                                            "tclang.runtime", "tclang.export", *GROUND,
                                            "backends", "polyhedral.loop_ir",
                                            "polyhedral.loop_format",
                                            "polyhedral.loop_serial", "islpy", "lark",
                                            "llvmlite", "pycuda", "torch")),
}


def under(name: str, prefixes) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def owner(module: str) -> str | None:
    """The layer a module belongs to: the longest of the layers' prefixes it is under (the
    package face "tclang" is the tools' by itself, not what is under it)."""
    best, length = None, -1
    for layer, (mine, _) in RULES.items():
        for prefix in mine:
            hit = module == prefix or (prefix != "tclang" and module.startswith(prefix + "."))
            if hit and len(prefix) > length:
                best, length = layer, len(prefix)
    return best


def layer_modules(layer: str) -> list[tuple[str, Path]]:
    """(module, path) of every module of a layer."""
    found = []
    for package in ("tclang", "polyhedral", "backends"):
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            if owner(module) == layer:
                found.append((module, path))
    return found


def allowed(name: str, layer: str) -> bool:
    """A watched name the layer may import: under its allow-list, or a package whose face
    only leads to one (`from tclang.driver import compiler` names tclang.driver too)."""
    if name.split(".")[0] not in WATCHED:
        return True
    rules = RULES[layer][1]
    return under(name, rules) or any(r.startswith(name + ".") for r in rules) or \
        name in ("tclang", "polyhedral", "backends")


@pytest.mark.parametrize("layer", list(RULES))
def test_every_import_of_a_layer_is_on_its_allow_list(layer):
    """Every import statement (top level or inside a function) of every module."""
    modules = layer_modules(layer)
    assert modules, layer
    bad = [f"{path.relative_to(ROOT)}:{line} imports {name}"
           for module, path in modules for line, name in imported_names(path)
           if not allowed(name, layer)]
    assert not bad, "\n".join(bad)


def test_only_the_compile_door_imports_the_pipeline():
    """The runtime, export and the tools compile through tclang/driver/compiler.py's
    door; only it (and the middle end's helper process it runs) imports polyhedral.pipeline
    or builds a cache key."""
    door = {"tclang.driver.compiler", "tclang.driver.middle_end"}
    bad = [f"{module}:{line} imports {name}"
           for layer in ("driver", "runtime", "export", "tools")
           for module, path in layer_modules(layer) if module not in door
           for line, name in imported_names(path)
           if under(name, ("polyhedral.pipeline", "polyhedral.scheduler",
                           "tclang.driver.cachekey.cache_key",
                           "tclang.driver.compiler.compile_definition",
                           "tclang.driver.compiler.KernelInfo"))]
    assert not bad, "\n".join(bad)


#: what the backends must never load, even through another module (the fresh-interpreter
#: probe below): the driver's side of the contract, the user's options, the polyhedral
#: layer past its loop IR, isl, and the language's symbolic forms
FORBIDDEN_FOR_BACKENDS = ("tclang.driver", "tclang.runtime", "tclang.options",
                          "tclang.export", "tclang.tools", "tclang.cli", "polyhedral",
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


def module_graph(package: str = "tclang") -> dict[str, set[str]]:
    """module -> the package's modules it imports (anywhere in the file; `from a import b`
    names a.b where that is a module, else a)."""
    paths = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        paths[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph = {}
    for module, path in paths.items():
        targets = set()
        names = imported_names(path)
        for line, name in names:
            # `from a import b` with a.b a module: the arrow is to a.b, not to a's face
            if any(n.startswith(name + ".") and n in paths for k, n in names if k == line):
                continue
            while name and name not in paths:
                name = name.rpartition(".")[0]
            if name and name != module:
                targets.add(name)
        graph[module] = targets
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = []
            while True:
                w = stack.pop()
                on.discard(w)
                part.append(w)
                if w == v:
                    break
            if len(part) > 1:
                found.append(sorted(part))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_two_modules_of_tclang_import_each_other():
    """No circle of imports between tclang's files, counting imports inside functions (a
    lazy import hides a circle from Python, not from a reader): issue 32. The package face
    is left out: every tool may import it, and it hands on to the wings lazily."""
    graph = {m: t - {"tclang"} for m, t in module_graph().items() if m != "tclang"}
    assert circles(graph) == []


def test_the_circle_finder_finds_one():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


# Run in a fresh interpreter: installs a hook that refuses what `refused(name)` names (it
# returns why, or None), then forks one child per module so that each import starts from
# the same nearly empty sys.modules. The deny-list probe and the allow-list probe differ
# only in that predicate.
PROBE = r"""
import importlib.abc, os, sys, traceback

%s

class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        why = refused(name)
        if why:
            raise ImportError(why)
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

DENY = r"""
FORBIDDEN = %r
ALLOWED = %r

def refused(name):
    if name in ALLOWED or name == "polyhedral":
        return None
    if any(name == f or name.startswith(f + ".") for f in FORBIDDEN):
        return f"forbidden import of {name}"
    return None
"""


def deny_probe() -> str:
    return PROBE % (DENY % (FORBIDDEN_FOR_BACKENDS, ALLOWED_FOR_BACKENDS))


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="needs fork")
def test_no_backend_module_pulls_in_a_forbidden_module():
    modules = backend_modules()
    probe = deny_probe()
    result = subprocess.run([sys.executable, "-c", probe, *modules], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_probe_catches_a_forbidden_import():
    """The hook itself works: a module that imports the driver is refused."""
    probe = deny_probe()
    result = subprocess.run([sys.executable, "-c", probe, "tclang.runtime.kernels"], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 1 and "forbidden import of" in result.stdout


def test_the_package_imports_neither_isl_nor_the_driver():
    """`import tclang` loads the language's errors only: islpy, Lark, LLVM and the
    backends load when a definition is checked or compiled."""
    code = ("import sys, tclang; heavy = sorted(m for m in sys.modules if m.split('.')[0] in "
            "('islpy', 'lark', 'llvmlite', 'backends', 'polyhedral') or m in "
            "('tclang.driver.compiler', 'tclang.runtime.kernels', 'tclang.options') or "
            "m.split('.')[:2] in (['tclang', 'driver'], ['tclang', 'runtime'], "
            "['tclang', 'export'], ['tclang', 'tools'])); print(heavy)")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                            text=True, timeout=120)
    assert result.stdout.strip() == "[]", result.stdout + result.stderr


# The allow-lists again, in a fresh interpreter: each module of a lower layer imported
# (one forked child each) under a hook that refuses every watched module outside what the
# layer may reach: its allow-list and, through it, the allow-lists of the layers it names.
ALLOW = r"""
ALLOWED = %r
WATCHED = %r

def refused(name):
    if name.split(".")[0] not in WATCHED or name in ("tclang", "polyhedral", "backends"):
        return None  # not watched, or a package's face
    if any(name == a or name.startswith(a + ".") or a.startswith(name + ".")
           for a in ALLOWED):
        return None
    return f"import of {name} outside the allow-list"
"""


def allow_probe(layer: str) -> str:
    return PROBE % (ALLOW % (reachable(layer), WATCHED))


def reachable(layer: str) -> tuple[str, ...]:
    """What a layer may load, directly or through the layers its allow-list names."""
    names, layers, todo = set(RULES[layer][1]) | set(RULES[layer][0]), {layer}, [layer]
    while todo:
        for name in RULES[todo.pop()][1]:
            other = owner(name)
            if other is not None and other not in layers:
                layers.add(other)
                todo.append(other)
                names |= set(RULES[other][1])
    return tuple(sorted(names))


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="needs fork")
@pytest.mark.parametrize("layer", ["ground", "language", "polyhedral"])
def test_a_lower_layer_loads_nothing_off_its_allow_lists(layer):
    modules = [m for m, _ in layer_modules(layer)]
    probe = allow_probe(layer)
    result = subprocess.run([sys.executable, "-c", probe, *modules], cwd=ROOT,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_allow_probe_catches_a_module_off_the_list():
    """The hook itself works: polyhedral/ may not load the driver."""
    probe = allow_probe("polyhedral")
    result = subprocess.run([sys.executable, "-c", probe, "tclang.driver.compiler"],
                            cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 1 and "outside the allow-list" in result.stdout
