"""The CPU backend's part of `tclang export`: object code that runs without Python, linked
into a shared library with the system C compiler.

A kernel's object code (`tclang_main`, the same bytes the JIT loads) needs three things
the Python runtime gives it in-process: libm for the math functions it calls by name, the
native thread pool's `tclang_parallel_for`, and a caller that binds sizes, allocates
temporaries and reads the error record. The first two are linked here (the pool is the
same LLVM module the JIT loads, compiled to an object); the caller is the C wrapper the
driver writes (tclang/export/library.py). Only the wrapper's `tclang_<entry>*` functions are
exported: two exported kernels link into one program without clashing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from tclang.errors import TCError


def c_compiler() -> str:
    """The system C compiler: $CC, else cc, gcc or clang on the PATH."""
    for name in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if name and shutil.which(name.split()[0]):
            return name
    raise TCError("tclang export needs a C compiler to link the shared library (set CC, or "
                  "install gcc or clang); the object files and the wrapper source are "
                  "written, so you can link them yourself")


def link_library(directory: Path, library: str, sources: list[str], objects: list[str],
                 exported_prefix: str) -> Path:
    """`directory/library`, a shared library of the C `sources` and `objects` (names in
    `directory`) exporting only the functions named `exported_prefix*`."""
    script = directory / f"{library}.exports"
    script.write_text("{\n  global: " + exported_prefix + "*;\n  local: *;\n};\n")
    command = [*c_compiler().split(), "-shared", "-fPIC", "-O2", "-std=c11",
               "-o", library, *sources, *objects, f"-Wl,--version-script={script.name}",
               "-lm", "-lpthread"]
    done = subprocess.run(command, cwd=directory, capture_output=True, text=True)
    if done.returncode != 0:
        raise TCError(f"linking {library} failed ({' '.join(command)}):\n"
                      f"{done.stderr.strip()}")
    return directory / library
