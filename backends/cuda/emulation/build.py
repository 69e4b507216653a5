"""Compile generated CUDA C for the host with g++ and tclang_cuda_emulation.h, and load it.

    lib = compile_emulated(source, store=store)   # a ctypes.CDLL, cached by content
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

A built library becomes code in the process, so nothing is loaded from a file found by its
name. The library is kept between processes in `store` (backends/contract.py SealedStore:
the driver lends the disk cache, whose entries are authenticated with the user's key), by
a hash of the source, the flags, the header's contents and the compiler's version; what is
loaded is the bytes the store returned or g++ just wrote, copied into this process's
private directory (mkdtemp) first. A precompiled header kept in cache_dir is used only if
the store vouches for its SHA-256 (and its header copy is the header); without a store it
is built in the private directory, for this process alone, and so is every library. The
source is kept in cache_dir as <hash>.cu, which compiler messages refer to.

Environment: TCLANG_EMULATION_CXX names another compiler (default g++). The header reads
TCLANG_EMULATION_THREADS, TCLANG_EMULATION_STACK_SIZE and TCLANG_EMULATION_CHECK_BARRIERS
at each launch.
"""

from __future__ import annotations

import atexit
import ctypes
import functools
import hashlib
import itertools
import os
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

from tclang.atomic_files import atomic_path, write_atomic
from tclang.locks import fork_safe
from tclang.environment import switch

HEADER = Path(__file__).with_name("tclang_cuda_emulation.h")
BASE_FLAGS = ("-std=c++17", "-O1", "-fPIC", "-shared", "-pthread", "-Wno-unknown-pragmas",
              "-DTCLANG_EMULATION=1")
ERROR_LINES = 40
# Headers a CUDA source may include; under emulation they are empty.
STUB_HEADERS = ("cuda.h", "cuda_runtime.h", "cuda_runtime_api.h", "cuda_fp16.h",
                "cuda_fp16.hpp", "cuda_bf16.h", "cuda_bf16.hpp", "math_constants.h", "device_launch_parameters.h",
                "device_functions.h", "sm_20_atomic_functions.h", "vector_types.h")
_STUB_TEXT = "#pragma once\n/* provided by tclang_cuda_emulation.h */\n"
_LAYOUT_VERSION = "2"  # bump when the cache layout or the stubs change

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


def default_cache_dir(store=None) -> Path:
    """cuda-emulation/ beside the entries of `store` (backends/contract.py SealedStore's
    `directory`: tclang's cache directory, private to the user), or a fresh private
    temporary directory for this process when there is none. What is built here becomes
    code in the process, so a directory someone else could write is never used, nor a
    fixed name in /tmp (another user could have made it, or a symlink there pointing
    anywhere)."""
    found = store.directory("cuda-emulation") if store is not None else None
    if found is not None:
        return Path(found)
    global _fallback_dir
    if _fallback_dir is None or not _fallback_dir.is_dir():
        _fallback_dir = Path(tempfile.mkdtemp(prefix="tclang-cuda-emulation-"))
    return _fallback_dir


_fallback_dir: Path | None = None  # this process's private directory, made when needed


def _stub_dir() -> Path:
    """The empty stand-ins for CUDA's headers, written in this process's private directory
    (they are included into every build: none found in a shared place is used)."""
    stubs = _private_dir() / f"include-{_LAYOUT_VERSION}"
    for name in STUB_HEADERS:
        target = stubs / name
        if not target.exists():
            stubs.mkdir(parents=True, exist_ok=True)
            write_atomic(target, _STUB_TEXT.encode())
    return stubs


_private: Path | None = None
_serial = itertools.count()


def _private_dir() -> Path:
    """This process's own directory (mkdtemp: a random name, mode 0700) where libraries are
    copied to be loaded and, without a store, built: no one else can write into it, so
    what is loaded there is what was checked. A forked child shares it (its files carry its
    pid); it is removed when the process that made it exits."""
    global _private
    if _private is None or not _private.is_dir():
        _private = Path(tempfile.mkdtemp(prefix="tclang-emulation-"))
        atexit.register(_remove_private, os.getpid(), _private)
    return _private


def _remove_private(owner: int, path: Path) -> None:
    if os.getpid() == owner:  # not in a forked child that exits normally
        shutil.rmtree(path, ignore_errors=True)


def _load_bytes(data: bytes, key: str) -> ctypes.CDLL:
    """dlopen a library from its bytes: written to a new file in the private directory,
    loaded, unlinked (the mapping stays). A fresh name each time: the dynamic loader would
    hand back a library loaded earlier under the same path."""
    path = _private_dir() / f"{key}-{os.getpid()}-{next(_serial)}.so"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o700)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    try:
        return ctypes.CDLL(str(path))
    finally:
        path.unlink(missing_ok=True)


_loaded: dict[str, ctypes.CDLL] = {}  # by key: each library loaded once per process
_trusted_pch: set[str] = set()  # precompiled headers checked in this process
_lock = fork_safe(threading.Lock())


def compile_emulated(source: str, *, cache_dir: str | os.PathLike | None = None,
                     extra_flags=(), store=None) -> ctypes.CDLL:
    """Compile CUDA C `source` for the host (see the module docstring) and load it.

    store: a SealedStore (backends/contract.py) that keeps the library between processes;
    None: built once per process. Raises EmulationBuildError with the compiler's first
    error lines if it does not build.
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
    with _lock:
        lib = _loaded.get(key)
        if lib is not None:
            return lib
    name = f"cuda-emulation/{key}.so"
    data = store.load(name) if store is not None else None
    lib = None
    if data is not None:
        try:
            lib = _load_bytes(data, key)
        except OSError:  # authentic, but it does not load here any more: built again
            lib = None
    if lib is None:
        cache = Path(cache_dir) if cache_dir is not None else default_cache_dir(store)
        cache.mkdir(parents=True, exist_ok=True)
        header_path = HEADER
        if not extra and switch("TCLANG_EMULATION_PCH", True):
            header_path = _precompiled_header(cxx, cache, identity, flags, header,
                                              store) or HEADER
        data = _build(cxx, cache, key, source, flags, extra, header_path)
        if store is not None:
            store.store(name, data)
        try:
            lib = _load_bytes(data, key)
        except OSError as err:
            raise EmulationBuildError(f"the library {cxx} built from {cache / key}.cu does "
                                      f"not load: {err}") from err
    with _lock:
        return _loaded.setdefault(key, lib)


def _precompiled_header(cxx: str, cache: Path, identity: str, flags: list[str],
                        header: bytes, store) -> Path | None:
    """A copy of the header with its .gch beside it (what `-include` picks up), or None.
    With a store, kept in cache_dir and used only if the store holds its SHA-256 (a
    planted .gch would become code in every library); else built in the private
    directory, once per process."""
    digest = hashlib.sha256()
    for part in (_LAYOUT_VERSION, identity, "\0".join(flags)):
        digest.update(part.encode() + b"\0\1")
    digest.update(header)
    folder = (cache if store is not None else _private_dir()) / f"pch-{digest.hexdigest()[:24]}"
    copy = folder / HEADER.name
    gch = folder / (HEADER.name + ".gch")
    name = f"cuda-emulation/pch-{digest.hexdigest()[:24]}.sha256"
    if str(folder) in _trusted_pch:
        return copy
    try:
        if gch.exists() and copy.exists() and copy.read_bytes() == header and (
                store is None or store.load(name) == hashlib.sha256(gch.read_bytes()).digest()):
            _trusted_pch.add(str(folder))
            return copy
        folder.mkdir(parents=True, exist_ok=True)
        write_atomic(copy, header)
        with atomic_path(gch) as tmp:
            pch_flags = [f for f in flags if f != "-shared"]
            proc = subprocess.run([cxx, *pch_flags, "-x", "c++-header", str(copy), "-o",
                                   str(tmp)], capture_output=True, text=True, check=False)
            if proc.returncode != 0:
                return None
            built = tmp.read_bytes()
        if store is not None:
            store.store(name, hashlib.sha256(built).digest())
    except OSError:
        return None
    _trusted_pch.add(str(folder))
    return copy


def _build(cxx: str, cache: Path, key: str, source: str, flags: list[str],
           extra: list[str], header_path: Path) -> bytes:
    """The library's bytes: g++ writes it in the private directory, where no one else can
    change it before it is read back."""
    src_path = cache / f"{key}.cu"
    write_atomic(src_path, source.encode())
    out = _private_dir() / f"{key}-{os.getpid()}-{next(_serial)}.build.so"
    cmd = [cxx, *flags, "-isystem", str(_stub_dir()), "-include", str(header_path),
           "-x", "c++", str(src_path), "-x", "none", *extra, "-o", str(out)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            lines = (proc.stderr or proc.stdout).splitlines()
            shown = "\n".join(lines[:ERROR_LINES])
            more = (f"\n... ({len(lines) - ERROR_LINES} more lines)"
                    if len(lines) > ERROR_LINES else "")
            raise EmulationBuildError(
                f"{cxx} failed to compile the emulated CUDA source {src_path} "
                f"(exit {proc.returncode}):\n{shown}{more}")
        return out.read_bytes()
    finally:
        out.unlink(missing_ok=True)


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
