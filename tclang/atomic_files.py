"""Files that appear whole or not at all, however many processes write them and wherever
one is killed: each is written under a temporary name beside its final one (mode 0600,
ending in `.tmp`, which the disk cache sweeps when stale) and then renamed into place.

Every writer of a cache file uses this: the disk cache's entries and key, the CUDA
emulation's sources and precompiled header (written by g++ itself).
"""

from __future__ import annotations

import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


@contextmanager
def atomic_path(path: Path, keep_existing: bool = False) -> Iterator[Path]:
    """A temporary path beside `path` to write (or let a tool write); when the block ends
    without an exception it becomes `path`. `keep_existing`: link instead of replace, so
    that a file another process put there first wins (a key must never change under a
    reader). The temporary file is gone afterwards in every case."""
    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        yield Path(temp)
        if keep_existing:
            try:
                os.link(temp, path)
            except FileExistsError:
                pass
        else:
            os.replace(temp, path)
    finally:
        try:
            os.unlink(temp)
        except OSError:
            pass


def write_atomic(path: Path, data: bytes, keep_existing: bool = False,
                 sync: bool = False) -> None:
    """`data` as the whole of `path` (see atomic_path); `sync`: on disk before it appears."""
    with atomic_path(path, keep_existing) as temp:
        with open(temp, "wb") as f:
            f.write(data)
            if sync:
                f.flush()
                os.fsync(f.fileno())
