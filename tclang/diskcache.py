"""The on-disk compile cache: one file per compiled kernel, shared between processes.

The directory is `TCLANG_CACHE_DIR` or the user cache directory (platformdirs), created
private (0700). An entry is a small binary container: a magic line, a JSON header holding
the full cache key and a SHA-256 per blob, then the blobs (object code, generated source,
stage texts, the kernel summary). Writes go to a temporary file in the same directory,
then `os.replace`: readers never see half an entry. A truncated, corrupted, unreadable or
foreign entry (one written for another key) is detected, discarded with a `TCWarning`, and
rebuilt; a full disk or read-only directory only costs a warning. Nothing is unpickled.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import tempfile
import warnings
from pathlib import Path

from tclang.errors import TCWarning

MAGIC = b"TCLANG-CACHE-1\n"


def cache_dir() -> Path:
    configured = os.environ.get("TCLANG_CACHE_DIR")
    if configured:
        path = Path(configured)
    else:
        import platformdirs
        path = Path(platformdirs.user_cache_dir("tclang", appauthor=False))
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    return path


def entry_path(digest: str) -> Path:
    return cache_dir() / f"{digest}.tck"


def enabled() -> bool:
    return os.environ.get("TCLANG_DISK_CACHE", "1") not in ("0", "off", "false")


def load(digest: str, key: tuple) -> dict[str, bytes] | None:
    """The blobs stored for `key`, or None (missing, or bad and now discarded)."""
    if not enabled():
        return None
    try:
        path = entry_path(digest)
    except OSError:
        return None  # no usable cache directory: storing will say so
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as err:
        _discard(path, f"unreadable ({err.strerror})")
        return None
    problem, blobs = _parse(data, key)
    if problem is not None:
        _discard(path, problem)
        return None
    return blobs


def _parse(data: bytes, key: tuple) -> tuple[str | None, dict[str, bytes]]:
    if not data.startswith(MAGIC):
        return "not a tclang cache entry", {}
    offset = len(MAGIC)
    if len(data) < offset + 8:
        return "truncated", {}
    (header_len,) = struct.unpack_from("<Q", data, offset)
    offset += 8
    if len(data) < offset + header_len:
        return "truncated", {}
    try:
        header = json.loads(data[offset:offset + header_len].decode())
    except (UnicodeDecodeError, json.JSONDecodeError):
        return "corrupted header", {}
    offset += header_len
    if header.get("key") != repr(key):
        return "written for another kernel (foreign entry)", {}
    blobs = {}
    for name, (start, length, digest) in header.get("blobs", {}).items():
        piece = data[offset + start:offset + start + length]
        if len(piece) != length:
            return "truncated", {}
        if hashlib.sha256(piece).hexdigest() != digest:
            return "corrupted contents", {}
        blobs[name] = piece
    return None, blobs


def store(digest: str, key: tuple, blobs: dict[str, bytes]) -> None:
    """Write an entry atomically; failures (disk full, read-only) only warn."""
    if not enabled():
        return
    header, body, position = {"key": repr(key), "blobs": {}}, [], 0
    for name, blob in blobs.items():
        header["blobs"][name] = (position, len(blob), hashlib.sha256(blob).hexdigest())
        body.append(blob)
        position += len(blob)
    head = json.dumps(header).encode()
    payload = MAGIC + struct.pack("<Q", len(head)) + head + b"".join(body)
    temp = None
    try:
        directory = cache_dir()
        fd, temp = tempfile.mkstemp(prefix=f".{digest}.", suffix=".tmp", dir=directory)
        with os.fdopen(fd, "wb") as f:
            f.write(payload)
        os.replace(temp, directory / f"{digest}.tck")
    except OSError as err:
        if temp is not None:
            try:
                os.unlink(temp)
            except OSError:
                pass
        warnings.warn(TCWarning(f"could not write the compile cache entry {digest[:12]}... "
                                f"({err.strerror or err}); the kernel works, but the next "
                                "process will compile it again"), stacklevel=4)


def _discard(path: Path, problem: str) -> None:
    warnings.warn(TCWarning(f"discarding compile cache entry {path.name}: {problem}; "
                            "rebuilding it"), stacklevel=5)
    try:
        path.unlink()
    except OSError:
        pass
