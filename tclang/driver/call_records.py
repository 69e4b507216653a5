"""Call records: the disk cache's answer to the first call of a kernel in a fresh process,
with no compiler work at all (no parse, no cache key from tokens, no LLVM, no isl).

The full path of a first call parses the source, builds the key from its tokens and the
target (which asks LLVM about the CPU), reads the cache entry and links its object code:
well over 100 ms of imports and work. Yet a call that looks exactly like one that was
checked in full and ran before (the hot path's promise, runtime.HotCalls) needs only the
object code and the prepared call: which arrays to allocate and the size values. So after
such a call the runtime writes both into a record, and a later process finds it by what
it has at hand: the source text as written, the entry, the backend, the options, the
call's hot key (dtypes, shapes, strides), a fingerprint of this machine and of the
installed code. A *source record* says that a source text was checked without error or
warning, and gives what the hot path compares (each input's dtype and rank, each output's
dtype), so `tc.define` need not parse it.

Records are disk-cache entries like any other (tclang/driver/diskcache.py: private directory,
authenticated with the user's key, size-capped, evicted least recently used first), so a
record is as trusted as the object code the full path would load. What invalidates them:
- tclang, NumPy, llvmlite, islpy or Python changing (file sizes and times, versions);
- the CPU (vendor, family, model, flags), the cores this process may use, the data
  caches' sizes, the bounds-check switch: whatever the compile's Target is built from.
Only backends that can run from a few blobs keep records (`Backend.call_blobs`).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from dataclasses import dataclass
from functools import lru_cache
from types import SimpleNamespace

import numpy as np

from tclang.driver import diskcache
from tclang.bfloat16 import dtype_key, dtype_of_key
from tclang.driver.cachekey import code_files, installed_files, key_digest as _digest

FORMAT = 1  # bump when a record's layout changes


def enabled() -> bool:
    """Records are written and read unless TCLANG_CALL_RECORDS=0 (or the disk cache is
    off): every first call then takes the full path, as when debugging the cache."""
    from tclang.environment import switch
    return switch("TCLANG_CALL_RECORDS", True) and diskcache.enabled()


@lru_cache(maxsize=1)
def code_identity() -> str:
    """The installed code, cheaply: names, sizes and modification times of tclang's own
    files (not their contents, as the compile key reads them: that costs milliseconds),
    and the versions or installed files of what compiles and runs its code."""
    from tclang.version import __version__
    digest = hashlib.sha256()
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    for package in ("tclang", "polyhedral", "backends"):
        for path, stat in sorted(code_files(os.path.join(root, package))):
            digest.update(f"{path}:{stat.st_size}:{stat.st_mtime_ns};".encode())
    for name in ("llvmlite", "islpy"):
        digest.update(f"{name}:{installed_files(name)};".encode())
    digest.update(f"{__version__};{np.__version__};{sys.version}".encode())
    return digest.hexdigest()[:32]


def machine() -> tuple:
    """What a compile's Target is made of, read without LLVM (per call: the thread count
    and the bounds-check switch may change while the process runs)."""
    from tclang.machine import available_cores, bounds_checking, cache_sizes, processor
    return (os.uname().machine, processor(), available_cores(),
            tuple(sorted(cache_sizes().items())), bounds_checking())


def _source_key(source: str) -> tuple:
    return ("source-record", FORMAT, source, code_identity())


def _call_key(source: str, entry: str, backend: str, options_key: tuple, hot_key) -> tuple:
    return ("call-record", FORMAT, source, entry, backend, options_key, hot_key, machine(),
            code_identity())


# ---- source records -------------------------------------------------------------------

def signatures(source: str) -> list[dict] | None:
    """Each definition of a source checked before without error or warning: name, inputs
    [(dtype, rank)], outputs [dtype]; None when there is no record."""
    key = _source_key(source)
    blobs = diskcache.load(_digest(key), key)
    if blobs is None or "signatures" not in blobs:
        return None
    try:
        found = json.loads(blobs["signatures"].decode())
        return [dict(name=d["name"], inputs=[(dtype_of_key(t), int(r)) for t, r in d["inputs"]],
                     outputs=[dtype_of_key(t) for t in d["outputs"]]) for d in found]
    except (ValueError, KeyError, TypeError):
        return None


def remember_source(source: str, program) -> None:
    """Record that `source` checked cleanly (its program's definitions)."""
    key = _source_key(source)
    digest = _digest(key)
    if _exists(digest):
        return
    found = [dict(name=d.name, inputs=[[dtype_key(t.dtype.numpy), t.rank] for t in d.inputs],
                  outputs=[dtype_key(t.dtype.numpy) for t in d.outputs])
             for d in program.definitions]
    diskcache.store(digest, key, {"signatures": json.dumps(found).encode()}, warn=False)


# ---- call records ---------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Prepared:
    """What repeating a call checked in full needs (CompiledKernel.prepare, or a call
    record): the arrays to make beyond the inputs, outputs first, each as (np.zeros or
    np.empty, shape, dtype); the size values the kernel takes; how many are outputs."""

    new: tuple
    sizes: list
    outputs: int


def load_call(source: str, entry: str, backend, backend_name: str, options_key: tuple,
              hot_key):
    """(artifact, prepared) of a recorded call, or None; `prepared` as
    CompiledKernel.prepare makes it."""
    key = _call_key(source, entry, backend_name, options_key, hot_key)
    blobs = diskcache.load(_digest(key), key)
    if blobs is None or "call" not in blobs:
        return None
    try:
        call = json.loads(blobs.pop("call").decode())
        new = tuple((np.zeros if zero else np.empty, tuple(shape), dtype_of_key(dtype))
                    for zero, shape, dtype in call["new"])
        prepared = Prepared(new, [int(s) for s in call["sizes"]], int(call["outputs"]))
        # what a backend's restore reads of the kernel summary: buffer names, statements
        info = SimpleNamespace(buffers=tuple(SimpleNamespace(name=n) for n in call["buffers"]),
                               statements=tuple(tuple(s) for s in call["statements"]))
    except (ValueError, KeyError, TypeError):
        return None
    return backend.restore(blobs, info), prepared


def remember_call(source: str, entry: str, backend, backend_name: str, options_key: tuple,
                  hot_key, compiled, prepared) -> None:
    """Write the record of a call that was checked in full and ran (`compiled`: its
    CompiledKernel, `prepared`: what running it again needs)."""
    wanted = getattr(backend, "call_blobs", ())
    blobs = compiled.compiled.artifact.blobs
    if not wanted or not all(name in blobs for name in wanted):
        return
    key = _call_key(source, entry, backend_name, options_key, hot_key)
    digest = _digest(key)
    if _exists(digest):
        return
    info = compiled.compiled.info
    call = dict(new=[[make is np.zeros, list(shape), dtype_key(dtype)]
                     for make, shape, dtype in prepared.new],
                sizes=list(prepared.sizes), outputs=prepared.outputs,
                buffers=[b.name for b in info.buffers],
                statements=[list(s) for s in info.statements])
    stored = {"call": json.dumps(call).encode()}
    stored.update((name, blobs[name]) for name in wanted if name in blobs)
    diskcache.store(digest, key, stored, warn=False)


def _exists(digest: str) -> bool:
    try:
        return os.path.exists(os.path.join(diskcache.cache_dir(), f"{digest}.tck"))
    except (OSError, diskcache.UntrustedCache):
        return True  # no usable cache: nothing to write
