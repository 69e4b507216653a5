"""The compile-cache key, built in one place from every input that changes the code.

Canonical source (the definition's tokens, so comments and spacing do not matter), entry
name, argument shapes/dtypes/layout keys (tclang/layouts.py; or ranks and dtypes when
shape-generic), every option, the backend and its target description, the versions of
tclang, islpy, LLVM and NumPy, and a digest of tclang's own source. Printed isl text is
never part of a key: it is not canonical.
"""

from __future__ import annotations

import hashlib
import os
import platform
from functools import lru_cache
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only: call_records reads installed_files on a disk hit
    from tclang.options import Options
    from tclang.lang.program import Definition
    from tclang.target import Target

CACHE_FORMAT = 3  # bump when the layout of cache entries changes


def canonical_source(defn: Definition) -> str:
    """The definition's text as a token sequence: independent of comments and layout.

    The tokens its own parse read, from its `def` to its `}` (tclang/lang/parser.py), never
    text read again from the source: a definition that shares a line with another, or
    lines ended by a bare "\\r", once took the tokens of the first definition on its line,
    and with them that one's compiled kernel."""
    if not defn.tokens:
        raise ValueError(f"definition {defn.name} was not made by the parser: it has no "
                         "tokens to key it by")
    return defn.tokens


@lru_cache(maxsize=1)
def code_digest() -> str:
    """A digest of tclang's own code (front end, polyhedral layer, backends): a change to
    the compiler invalidates what it compiled, even without a version bump. By content,
    not by the files' times: packagers set every file's time alike (a Nix store's are
    all 1), so an edit of the same size would keep the key. Walked with os.scandir
    (pathlib's rglob took ~15 of the 24 ms this cost every cold compile and disk hit)."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return files_digest(root, ("tclang", "polyhedral", "backends"))


def files_digest(root: str, packages: tuple[str, ...]) -> str:
    """The relative paths and contents of the code files (.py, .lark, .h) under
    `root`/each package, outside __pycache__."""
    digest = hashlib.sha256()
    for package in packages:
        for path, _ in sorted(code_files(os.path.join(root, package))):
            digest.update(os.path.relpath(path, root).encode() + b"\0")
            with open(path, "rb") as f:
                digest.update(f.read())
    return digest.hexdigest()[:16]


def code_files(folder: str):
    """(path, os.stat_result) of each code file under `folder`, outside __pycache__."""
    with os.scandir(folder) as entries:
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                if entry.name != "__pycache__":
                    yield from code_files(entry.path)
            elif entry.name.endswith((".py", ".lark", ".h")):
                yield entry.path, entry.stat()


def installed_files(package: str) -> str:
    """An installed package's identity without importing it: a digest of its top-level
    files' names, sizes and modification times (islpy's compiled module among them).
    Importing islpy costs ~50 ms that a disk-cache hit does not otherwise need; a
    reinstall, even of the same version, changes the key, which is only cautious. (Plain
    os calls: pathlib's import is ~3 ms of a disk hit's budget.)"""
    import importlib.util
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return "missing"
    digest = hashlib.sha256()
    for root in spec.submodule_search_locations:
        with os.scandir(root) as entries:
            for entry in sorted(entries, key=lambda e: e.name):
                if entry.is_file():
                    info = entry.stat()
                    digest.update(f"{entry.name}:{info.st_size}:{info.st_mtime_ns};".encode())
    return digest.hexdigest()[:16]


@lru_cache(maxsize=1)
def versions() -> tuple:
    import llvmlite
    import numpy

    from tclang.version import __version__
    # LLVM itself by its shared library's files (llvmlite.binding), not by importing it:
    # the compiler's process leaves LLVM to the optimizer process (backends/llvm/jit.py)
    return (("tclang", __version__), ("islpy", installed_files("islpy")),
            ("llvmlite", llvmlite.__version__), ("llvm", installed_files("llvmlite.binding")),
            ("numpy", numpy.__version__),
            ("python", platform.python_version()), ("format", CACHE_FORMAT),
            ("code", code_digest()))


def cache_key(canonical: str, entry: str, shapes: tuple, options: Options, backend: str,
              target: Target) -> tuple:
    """Every input of one compilation, as a plain tuple."""
    return (("source", canonical), ("entry", entry), ("shapes", shapes),
            ("options", options.key()), ("backend", backend), ("target", target.key()),
            ("versions", versions()))


def key_digest(key: tuple) -> str:
    """A file-name-safe digest of a cache key."""
    return hashlib.sha256(repr(key).encode()).hexdigest()[:40]
