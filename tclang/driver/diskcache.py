"""The on-disk compile cache: one file per compiled kernel, shared between processes.

An entry holds object code that is linked into the process and run, so whoever can write
the cache can run code as the user. The cache therefore trusts nothing it reads:

- The directory is `TCLANG_CACHE_DIR` or the user cache directory (XDG/platformdirs); the
  directories tclang creates are private (0700). A directory not owned by the user, or
  writable by group or others, is refused (like OpenSSH's StrictModes): a `TCWarning` says
  so once and tclang runs without the disk cache. An entry file owned by someone else is
  discarded.
- Every entry is authenticated: an HMAC-SHA256, under a per-user secret key, over the
  entry's file name and contents. The key lives outside the cache directory
  (`TCLANG_CACHE_KEY_FILE`, default `cache.key` in the user config directory), is created
  0600 on first use, and is refused like the directory when it is not private. The HMAC is
  checked before anything in the entry is parsed, so an entry planted, copied from another
  kernel's file or signed with another key is never parsed, let alone linked.
- The container: a magic line, the HMAC, a JSON header holding the full cache key and
  where each blob lies, then the blobs (object code, generated source, stage texts, the
  kernel summary). Writes go to a temporary file in the same directory, then `os.replace`:
  readers never see half an entry. A truncated, corrupted, unreadable, malformed or foreign
  entry is discarded with a `TCWarning` and rebuilt (tclang.driver.compiler also discards one its
  backend cannot load); a full disk or read-only directory only costs a warning. Nothing
  is unpickled.
- The directory is kept under `TCLANG_CACHE_MAX_BYTES` (default 512 MiB): after each store
  the least recently used entries (a hit touches an entry's mtime) are evicted, and
  temporary files left by killed writers for over an hour are swept.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import stat
import struct
import sys
import time
import warnings

from tclang.errors import TCWarning

MAGIC = b"TCLANG-CACHE-2\n"
TAG_BYTES = 32  # HMAC-SHA256
KEY_BYTES = 32
DEFAULT_MAX_BYTES = 512 * 1024 * 1024
STALE_TEMP_SECONDS = 3600

_warned: set[str] = set()  # refusals already reported in this process


class UntrustedCache(OSError):
    """The cache directory or key file could be written by someone else: not used."""


# Paths are strings here, not pathlib's: reading an entry is on the path of a disk-cache
# hit in a fresh process, and importing pathlib (with urllib.parse and ipaddress) costs
# ~5 ms of its 20 ms budget in a clean environment. Writing imports what it needs.

def cache_dir() -> str:
    """The cache directory, created private; UntrustedCache when others could write it."""
    configured = os.environ.get("TCLANG_CACHE_DIR")
    path = configured if configured else _user_dir("cache")
    _make_private_dirs(path)
    require_private(path, "compile cache directory",
                     "run `chmod 700` on it, or set TCLANG_CACHE_DIR to a private directory")
    return path


def _make_private_dirs(path) -> None:
    """Create `path` and its missing parents, each 0700 (os.makedirs would give the
    parents the umask's mode)."""
    path = os.path.abspath(os.fspath(path))
    missing = []
    while not os.path.exists(path):
        missing.append(path)
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    for directory in reversed(missing):
        try:
            os.mkdir(directory, 0o700)
        except FileExistsError:
            pass


def require_private(path, what: str, remedy: str) -> None:
    """Owned by this user and writable by no one else (mode & 0o022 == 0), or refused."""
    info = os.stat(path)
    if info.st_uid != os.getuid():
        raise UntrustedCache(f"the {what} {path} is owned by another user (uid "
                             f"{info.st_uid}); {remedy}")
    if info.st_mode & 0o022:
        raise UntrustedCache(f"the {what} {path} is writable by group or others (mode "
                             f"{stat.S_IMODE(info.st_mode):o}); {remedy}")


def key_path() -> str:
    configured = os.environ.get("TCLANG_CACHE_KEY_FILE")
    if configured:
        return configured
    return os.path.join(_user_dir("config"), "cache.key")


def _user_dir(kind: str) -> str:
    """tclang's user cache or config directory. On Linux that is the XDG rule itself
    ($XDG_CACHE_HOME or ~/.cache, $XDG_CONFIG_HOME or ~/.config, then `tclang`), which
    is what platformdirs answers there; importing platformdirs costs ~7 ms, a third of a
    disk hit's budget. Elsewhere platformdirs decides."""
    if sys.platform.startswith("linux"):
        variable, default = {"cache": ("XDG_CACHE_HOME", ".cache"),
                             "config": ("XDG_CONFIG_HOME", ".config")}[kind]
        base = os.environ.get(variable, "").strip()
        if not os.path.isabs(base):  # unset, empty or relative: the spec says ignore it
            base = os.path.join(os.path.expanduser("~"), default)
        return os.path.join(base, "tclang")
    import platformdirs
    where = platformdirs.user_cache_dir if kind == "cache" else platformdirs.user_config_dir
    return where("tclang", appauthor=False)


def secret_key(directory) -> bytes:
    """This user's cache key, created on first use; UntrustedCache when it is not private
    or lies inside the cache directory (whoever writes the cache would know it)."""
    path = key_path()
    remedy = "set TCLANG_CACHE_KEY_FILE to a private file outside the cache directory"
    inside, real_dir = os.path.realpath(path), os.path.realpath(directory)
    if inside == real_dir or inside.startswith(real_dir.rstrip(os.sep) + os.sep):
        raise UntrustedCache(f"the compile cache key file {path} is inside the cache "
                             f"directory; {remedy}")
    _make_private_dirs(os.path.dirname(os.path.abspath(path)))
    if not os.path.exists(path):
        _create_key(path)
    return _read_key(path, remedy)


def _create_key(path: str) -> None:
    """Write a fresh key to a temporary file and link it into place: the link fails if a
    racing process created the key first (then its key is used), and no reader ever sees
    a half-written key."""
    import secrets
    from pathlib import Path

    from tclang.atomic_files import write_atomic
    write_atomic(Path(path), secrets.token_bytes(KEY_BYTES), keep_existing=True, sync=True)


def _read_key(path: str, remedy: str) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(f.fileno())
        if info.st_uid != os.getuid() or info.st_mode & 0o077:
            raise UntrustedCache(f"the compile cache key file {path} is not private to "
                                 f"this user (uid {info.st_uid}, mode "
                                 f"{stat.S_IMODE(info.st_mode):o}); {remedy}")
        key = f.read(KEY_BYTES + 1)
    if len(key) != KEY_BYTES:
        raise UntrustedCache(f"the compile cache key file {path} is not a tclang key; "
                             f"delete it (a new one is made) or {remedy}")
    return key


def _trusted() -> tuple[str, bytes] | None:
    """(directory, key), or None after warning (once per problem) that the disk cache is
    off; OSError when there is no usable directory."""
    try:
        directory = cache_dir()
        return directory, secret_key(directory)
    except UntrustedCache as err:
        _warn_once(f"{err}; running without the disk compile cache")
        return None


def _warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        warnings.warn(TCWarning(message), stacklevel=5)


def enabled() -> bool:
    """TCLANG_DISK_CACHE: on unless set to 0, false, no or off (anything else unknown is
    refused: tclang/environment.py)."""
    from tclang.environment import switch
    return switch("TCLANG_DISK_CACHE", True)


def load(digest: str, key: tuple) -> dict[str, bytes] | None:
    """The blobs stored for `key`, or None (missing, or bad and now discarded)."""
    if not enabled():
        return None
    try:
        trusted = _trusted()
    except OSError:
        return None  # no usable cache directory: storing will say so
    if trusted is None:
        return None
    directory, secret = trusted
    path = os.path.join(directory, f"{digest}.tck")
    try:
        data = _read_own_file(path)
    except FileNotFoundError:
        return None
    except OSError as err:
        _discard(path, f"unreadable ({err.strerror or err})")
        return None
    problem, blobs = _parse(data, digest, key, secret)
    if problem is not None:
        _discard(path, problem)
        return None
    _touch(path)
    return blobs


def _read_own_file(path: str) -> bytes:
    """The file's contents; PermissionError when another user owns it (they could have
    written anything there)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd, "rb") as f:
        owner = os.fstat(f.fileno()).st_uid
        if owner != os.getuid():
            raise PermissionError(0, f"owned by another user, uid {owner}")
        return f.read()


def _touch(path: str) -> None:
    """Mark the entry as used now: eviction removes the least recently used first."""
    try:
        os.utime(path)
    except OSError:
        pass


def _tag(secret: bytes, digest: str, body: bytes) -> bytes:
    """The entry's HMAC: over its file name too, so an entry copied over another kernel's
    file does not authenticate."""
    return hmac.new(secret, digest.encode() + b"\n" + body, hashlib.sha256).digest()


def _parse(data: bytes, digest: str, key: tuple,
           secret: bytes) -> tuple[str | None, dict[str, bytes]]:
    if not data.startswith(MAGIC):
        return "not a tclang cache entry (or an older format)", {}
    tag, body = data[len(MAGIC):len(MAGIC) + TAG_BYTES], data[len(MAGIC) + TAG_BYTES:]
    if not hmac.compare_digest(tag, _tag(secret, digest, body)):
        return "not authenticated by this user's cache key (tampered, copied or damaged)", {}
    if len(body) < 8:
        return "truncated", {}
    (header_len,) = struct.unpack_from("<Q", body)
    try:
        header = json.loads(body[8:8 + header_len].decode())
    except (UnicodeDecodeError, json.JSONDecodeError):
        return "corrupted header", {}
    if not isinstance(header, dict) or not _is_blob_table(header.get("blobs")):
        return "malformed header", {}
    if header.get("key") != repr(key):
        return "written for another kernel (foreign entry)", {}
    table = header["blobs"]
    contents = body[8 + header_len:]
    blobs = {name: contents[start:start + length] for name, (start, length) in table.items()}
    if any(len(blobs[name]) != length for name, (_, length) in table.items()):
        return "truncated", {}
    return None, blobs


def _is_blob_table(table) -> bool:
    """{name: [start, length]} with non-negative integers."""
    return isinstance(table, dict) and all(
        isinstance(place, list) and len(place) == 2
        and all(type(n) is int and n >= 0 for n in place) for place in table.values())


def store(digest: str, key: tuple, blobs: dict[str, bytes], warn: bool = True) -> None:
    """Write an entry atomically, then evict down to the size cap; failures (disk full,
    read-only) only warn (or, with warn=False, pass in silence: an entry that only saves
    time, like a call record)."""
    if not enabled():
        return
    limit = max_bytes()  # a bad TCLANG_CACHE_MAX_BYTES is refused before anything is written
    try:
        trusted = _trusted()
        if trusted is None:
            return
        from pathlib import Path

        from tclang.atomic_files import write_atomic
        directory, secret = trusted
        body = _body(key, blobs)
        write_atomic(Path(directory) / f"{digest}.tck",
                     MAGIC + _tag(secret, digest, body) + body)
        evict(directory, limit)
    except OSError as err:
        if not warn:
            return
        warnings.warn(TCWarning(f"could not write the compile cache entry {digest[:12]}... "
                                f"({err.strerror or err}); the kernel works, but the next "
                                "process will compile it again"), stacklevel=4)


class SealedEntries:
    """The disk cache lent to a backend for its own build products (backends/contract.py,
    SealedStore): each name is one entry, HMAC-authenticated, owner-checked, evicted and
    discarded like a kernel's, so a file planted under a name is never handed back."""

    def load(self, name: str) -> bytes | None:
        blobs = load(_sealed_digest(name), ("sealed", name))
        return blobs.get("data") if blobs is not None else None

    def store(self, name: str, data: bytes) -> None:
        store(_sealed_digest(name), ("sealed", name), {"data": data})

    def directory(self, name: str) -> str | None:
        """`name` in the cache directory, made private to this user, or None where that
        is not usable (an untrusted cache directory, say)."""
        try:
            path = os.path.join(cache_dir(), name)
            os.makedirs(path, mode=0o700, exist_ok=True)
            require_private(path, "build directory", "")
            return path if os.access(path, os.W_OK) else None
        except OSError:  # including an untrusted cache directory
            return None


def _sealed_digest(name: str) -> str:
    return hashlib.sha256(b"sealed\0" + name.encode()).hexdigest()[:40]


def _body(key: tuple, blobs: dict[str, bytes]) -> bytes:
    table, position = {}, 0
    for name, blob in blobs.items():
        table[name] = [position, len(blob)]
        position += len(blob)
    head = json.dumps({"key": repr(key), "blobs": table}).encode()
    return struct.pack("<Q", len(head)) + head + b"".join(blobs.values())


def max_bytes() -> int:
    """TCLANG_CACHE_MAX_BYTES (a whole number of bytes, at least 1), or the default."""
    from tclang.environment import whole_number
    return whole_number("TCLANG_CACHE_MAX_BYTES", DEFAULT_MAX_BYTES)


def evict(directory, limit: int) -> None:
    """Remove the least recently used entries until the directory's entries total at most
    `limit` bytes, and temporary files older than STALE_TEMP_SECONDS (their writer was
    killed)."""
    now, entries = time.time(), []
    with os.scandir(directory) as found:
        for item in found:
            try:
                info = item.stat(follow_symlinks=False)
            except OSError:
                continue  # removed meanwhile by another process
            if item.name.endswith(".tmp") and now - info.st_mtime > STALE_TEMP_SECONDS:
                _unlink(item.path)
            elif item.name.endswith(".tck") and stat.S_ISREG(info.st_mode):
                entries.append((info.st_mtime, info.st_size, item.path))
    total = sum(size for _, size, _ in entries)
    for _, size, path in sorted(entries, key=lambda e: e[0]):
        if total <= limit:
            break
        _unlink(path)
        total -= size


def _unlink(path) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _discard(path: str, problem: str) -> None:
    warnings.warn(TCWarning(f"discarding compile cache entry {os.path.basename(path)}: "
                            f"{problem}; rebuilding it"), stacklevel=5)
    _unlink(path)

