"""Compile generated CUDA C for the host with g++ and tclang_cuda_emulation.h, and load it.

    lib = compile_emulated(source)          # a ctypes.CDLL, cached on disk by content
    rc = lib.my_entry(...)                  # an extern "C" entry calling tclang_emu::launch
    check_launch(lib, rc)                   # EmulationLaunchError with the runtime's message

The command is `g++ -std=c++17 -O1 -fPIC -shared -pthread -Wno-unknown-pragmas
-DTCLANG_EMULATION=1 -include tclang_cuda_emulation.h -x c++ <source> <extra_flags>`
(`-O2` and the like in extra_flags win: the last -O counts). `#include <cuda_runtime.h>`,
`<cuda_fp16.h>` and `<math_constants.h>` in the source resolve to empty stand-ins, the
header already provides what they declare.

With no extra_flags the header is used as a precompiled header (built once per header,
compiler and cache_dir: about 20 MB, halves the compile time; TCLANG_EMULATION_PCH=0 turns it
off). g++ falls back to the header's text whenever the .gch does not fit.

The shared object is cached under cache_dir by a hash of the source, the flags, the
header's contents and the compiler's version; it is written to a temporary file and moved
into place with os.replace, so concurrent builds of the same source are safe. The source is
kept next to it as <hash>.cu, which compiler messages refer to.

Environment: TCLANG_EMULATION_CXX names another compiler (default g++). The header reads
TCLANG_EMULATION_THREADS, TCLANG_EMULATION_STACK_SIZE and TCLANG_EMULATION_CHECK_BARRIERS
at each launch.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

from tclang.atomic_files import atomic_path, write_atomic
from tclang.environment import switch

HEADER = Path(__file__).with_name("tclang_cuda_emulation.h")
BASE_FLAGS = ("-std=c++17", "-O1", "-fPIC", "-shared", "-pthread", "-Wno-unknown-pragmas",
              "-DTCLANG_EMULATION=1")
ERROR_LINES = 40
# Headers a CUDA source may include; under emulation they are empty.
STUB_HEADERS = ("cuda.h", "cuda_runtime.h", "cuda_runtime_api.h", "cuda_fp16.h",
                "cuda_fp16.hpp", "math_constants.h", "device_launch_parameters.h",
                "device_functions.h", "sm_20_atomic_functions.h", "vector_types.h")
_STUB_TEXT = "#pragma once\n/* provided by tclang_cuda_emulation.h */\n"
_LAYOUT_VERSION = "1"  # bump when the cache layout or the stubs change

# Error codes of tclang_emu::launch (TCLANG_EMU_ERR_* in the header).
ERR_INVALID_CONFIG = 1
ERR_OUT_OF_MEMORY = 2
ERR_TRAP = 3
ERR_DEADLOCK = 4
ERR_DIVERGENT_BARRIER = 5
ERR_NESTED_LAUNCH = 6
ERR_ENVIRONMENT = 7


class EmulationBuildError(Exception):
    """The compiler rejected the source (the message holds its first error lines), or no
    compiler was found."""


class EmulationLaunchError(RuntimeError):
    """An emulated launch failed: invalid configuration, __trap(), deadlock, ..."""

    def __init__(self, code: int, message: str):
        super().__init__(f"emulated CUDA launch failed (code {code}): {message}")
        self.code = code
        self.message = message


def compiler() -> str:
    return os.environ.get("TCLANG_EMULATION_CXX", "g++")


def available() -> bool:
    """Whether the host compiler (g++ unless TCLANG_EMULATION_CXX says otherwise) is on PATH."""
    return shutil.which(compiler()) is not None


@functools.lru_cache(maxsize=None)
def _compiler_identity(cxx: str) -> str:
    path = shutil.which(cxx)
    if path is None:
        raise EmulationBuildError(f"{cxx} not found on PATH: cannot build emulated CUDA")
    out = subprocess.run([path, "--version"], capture_output=True, text=True, check=False)
    return f"{os.path.realpath(path)}\n{out.stdout.strip()}"


def default_cache_dir() -> Path:
    """cuda-emulation/ in tclang's cache directory (tclang.diskcache.cache_dir: TCLANG_CACHE_DIR
    or the user cache), or a per-user temporary directory when that is not usable. The
    libraries built here are loaded into the process, so a directory someone else could
    write is never used: the temporary one is checked like the cache, and if another user
    planted it, a fresh private directory is made for this process instead."""
    from tclang.diskcache import cache_dir, require_private
    try:
        path = Path(cache_dir()) / "cuda-emulation"
        path.mkdir(exist_ok=True, mode=0o700)
        require_private(path, "emulation build directory", "")
        if os.access(path, os.W_OK):
            return path
    except OSError:  # including an untrusted cache directory
        pass
    path = Path(tempfile.gettempdir()) / f"tclang-cuda-emulation-{os.getuid()}"
    try:
        path.mkdir(exist_ok=True, mode=0o700)
        require_private(path, "emulation build directory", "")
        return path
    except OSError:
        return Path(tempfile.mkdtemp(prefix="tclang-cuda-emulation-"))


def _stub_dir(cache: Path) -> Path:
    stubs = cache / f"include-{_LAYOUT_VERSION}"
    for name in STUB_HEADERS:
        target = stubs / name
        if not target.exists():
            stubs.mkdir(parents=True, exist_ok=True)
            write_atomic(target, _STUB_TEXT.encode())
    return stubs


_loaded: dict[str, ctypes.CDLL] = {}
_lock = threading.Lock()


def compile_emulated(source: str, *, cache_dir: str | os.PathLike | None = None,
                     extra_flags=()) -> ctypes.CDLL:
    """Compile CUDA C `source` for the host (see the module docstring) and load it.

    Raises EmulationBuildError with the compiler's first error lines if it does not build.
    """
    cxx = compiler()
    identity = _compiler_identity(cxx)
    flags = list(BASE_FLAGS)
    extra = [str(f) for f in extra_flags]
    header = HEADER.read_bytes()
    digest = hashlib.sha256()
    for part in (_LAYOUT_VERSION, identity, "\0".join(flags), "\0".join(extra)):
        digest.update(part.encode() + b"\0\1")
    digest.update(header + b"\0\1")
    digest.update(source.encode())
    key = digest.hexdigest()[:32]

    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    so_path = cache / f"{key}.so"
    with _lock:
        lib = _loaded.get(str(so_path))
        if lib is not None:
            return lib
    if not so_path.exists():
        header_path = HEADER
        if not extra and switch("TCLANG_EMULATION_PCH", True):
            header_path = _precompiled_header(cxx, cache, identity, flags, header) or HEADER
        _build(cxx, cache, key, source, flags, extra, header_path)
    lib = ctypes.CDLL(str(so_path))
    with _lock:
        return _loaded.setdefault(str(so_path), lib)


def _precompiled_header(cxx: str, cache: Path, identity: str, flags: list[str],
                        header: bytes) -> Path | None:
    """A copy of the header with its .gch beside it (what `-include` picks up), or None."""
    digest = hashlib.sha256()
    for part in (_LAYOUT_VERSION, identity, "\0".join(flags)):
        digest.update(part.encode() + b"\0\1")
    digest.update(header)
    folder = cache / f"pch-{digest.hexdigest()[:24]}"
    copy = folder / HEADER.name
    gch = folder / (HEADER.name + ".gch")
    if gch.exists() and copy.exists():
        return copy
    try:
        folder.mkdir(parents=True, exist_ok=True)
        if not copy.exists():
            write_atomic(copy, header)
        with atomic_path(gch) as tmp:
            pch_flags = [f for f in flags if f != "-shared"]
            proc = subprocess.run([cxx, *pch_flags, "-x", "c++-header", str(copy), "-o",
                                   str(tmp)], capture_output=True, text=True, check=False)
            if proc.returncode != 0:
                return None
    except OSError:
        return None
    return copy


def _build(cxx: str, cache: Path, key: str, source: str, flags: list[str],
           extra: list[str], header_path: Path) -> None:
    src_path = cache / f"{key}.cu"
    write_atomic(src_path, source.encode())
    with atomic_path(cache / f"{key}.so") as tmp_so:
        cmd = [cxx, *flags, "-isystem", str(_stub_dir(cache)), "-include", str(header_path),
               "-x", "c++", str(src_path), "-x", "none", *extra, "-o", str(tmp_so)]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            lines = (proc.stderr or proc.stdout).splitlines()
            shown = "\n".join(lines[:ERROR_LINES])
            more = f"\n... ({len(lines) - ERROR_LINES} more lines)" if len(lines) > ERROR_LINES else ""
            raise EmulationBuildError(
                f"{cxx} failed to compile the emulated CUDA source {src_path} "
                f"(exit {proc.returncode}):\n{shown}{more}")


def last_error(lib: ctypes.CDLL) -> str:
    """The message of the last launch made through `lib` by the calling OS thread."""
    fn = lib.tclang_emu_last_error
    fn.restype = ctypes.c_char_p
    fn.argtypes = []
    return (fn() or b"").decode(errors="replace")


def check_launch(lib: ctypes.CDLL, code: int) -> None:
    """Raise EmulationLaunchError if `code`, a launch's return value, is not 0."""
    if code:
        raise EmulationLaunchError(code, last_error(lib))
