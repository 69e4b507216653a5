"""The emulated GPU's build cache trusts no file by its name: a library or precompiled
header planted in its directory is never loaded (a planted library's constructor ran, and
a planted .gch became code in every library built with it), and a damaged entry is
rebuilt. Libraries are kept as disk-cache entries authenticated with the user's key (the
driver lends them to the backend: backends/contract.py SealedStore)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import tclang as tc
from backends.cuda.emulation import build
from tclang.driver.compiler import forget_compiled

pytestmark = pytest.mark.skipif(not build.available(), reason="needs g++")

ROOT = Path(__file__).resolve().parents[2]
SOURCE = "def add(float(N) A) -> (B) { B(i) = A(i) + 1 }"
CONSTRUCTOR = r"""
#include <stdio.h>
__attribute__((constructor)) static void planted_constructor(void) {
    FILE *f = fopen(MARKER, "w");
    if (f) { fputs("planted code ran", f); fclose(f); }
}
"""


def run_in(directory, monkeypatch):
    """Call the kernel with `directory` as the cache and nothing of it in memory."""
    monkeypatch.setenv("TCLANG_CACHE_DIR", str(directory))
    monkeypatch.setattr(build, "_loaded", {})
    monkeypatch.setattr(build, "_trusted_pch", set(), raising=False)
    forget_compiled()
    A = np.arange(16, dtype=np.float32)
    np.testing.assert_array_equal(tc.define(SOURCE, "cuda-emulated").add(A), A + 1)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """A cache directory where the kernel was built: the names its build files take."""
    directory = tmp_path_factory.mktemp("built") / "cache"
    with pytest.MonkeyPatch.context() as monkeypatch:
        run_in(directory, monkeypatch)
    return directory / "cuda-emulation"


def plant_directory(tmp_path):
    cache = tmp_path / "cache"
    (cache / "cuda-emulation").mkdir(parents=True, mode=0o700)
    cache.chmod(0o700)
    return cache


def test_a_planted_library_is_never_loaded(built, tmp_path, monkeypatch):
    marker = tmp_path / "marker"
    cache = plant_directory(tmp_path)
    keys = [p.stem for p in built.glob("*.cu")]
    assert keys
    (tmp_path / "planted.c").write_text(CONSTRUCTOR)
    for key in keys:  # where a library of this kernel's source would be kept by name
        subprocess.run(["g++", "-shared", "-fPIC", "-x", "c", str(tmp_path / "planted.c"),
                        f'-DMARKER="{marker}"', "-o", str(cache / "cuda-emulation" /
                                                          f"{key}.so")], check=True)
    run_in(cache, monkeypatch)
    assert not marker.exists(), "the planted library's constructor ran"


def test_a_planted_precompiled_header_is_never_used(built, tmp_path, monkeypatch):
    marker = tmp_path / "marker"
    cache = plant_directory(tmp_path)
    folders = list(built.glob("pch-*"))
    assert folders
    for folder in folders:  # a .gch made from the header plus a constructor, same flags
        planted = cache / "cuda-emulation" / folder.name
        planted.mkdir()
        shutil.copy(build.HEADER, planted / build.HEADER.name)
        evil = tmp_path / "evil" / build.HEADER.name
        evil.parent.mkdir(exist_ok=True)
        evil.write_text(build.HEADER.read_text() + CONSTRUCTOR.replace(
            "MARKER", f'"{marker}"'))
        flags = [f for f in build.BASE_FLAGS if f != "-shared"]
        subprocess.run(["g++", *flags, "-x", "c++-header", str(evil), "-o",
                        str(planted / (build.HEADER.name + ".gch"))], check=True)
    run_in(cache, monkeypatch)
    assert not marker.exists(), "a library was built with the planted precompiled header"


@pytest.mark.parametrize("damage", ["truncated", "garbage"])
def test_a_damaged_entry_is_rebuilt(damage, built, tmp_path):
    """In a fresh process (a truncated library that is mapped raises SIGBUS: that must fail
    this test, not kill pytest)."""
    cache = tmp_path / "cache"
    shutil.copytree(built.parent, cache)
    files = list(cache.glob("*.tck")) + list(cache.glob("cuda-emulation/*.so"))
    assert files
    for path in files:
        data = path.read_bytes()
        path.unlink()
        path.write_bytes(data[:len(data) // 2] if damage == "truncated"
                         else os.urandom(len(data)))
    script = (f"import numpy as np, tclang as tc; A = np.arange(16, dtype=np.float32); "
              f"print(np.array_equal(tc.define({SOURCE!r}, 'cuda-emulated').add(A), A + 1))")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120, env=dict(os.environ, TCLANG_CACHE_DIR=str(cache),
                                                PYTHONPATH=str(ROOT)))
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "True"
    assert "discarding compile cache entry" in done.stderr
