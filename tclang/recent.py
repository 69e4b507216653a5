"""Bounded maps of compiled kernels: what keeps a long-running process's memory flat.

Every compiled variant holds its machine code (an MCJIT engine, ~150 KB of resident
memory), so a kernel called at ever new sizes, or a process compiling ever new kernels,
would grow without end if every variant were kept. A `Recent` map keeps the
`max_variants()` most recently used entries and drops the least recently used one; a
dropped variant is compiled again (or reloaded from the disk cache, about a millisecond)
if it is called again.

The bound is TCLANG_MAX_VARIANTS, default 64 per kernel: torch.compile gives up
specializing a frame after 8 recompilations and JAX keeps its jit caches in LRU maps too;
64 covers the shapes of any realistic training or serving loop (batch-size buckets,
sequence lengths) while costing at most ~10 MB per kernel.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict

from tclang.locks import fork_safe

DEFAULT_MAX_VARIANTS = 64


def max_variants() -> int:
    """TCLANG_MAX_VARIANTS, or 64: how many compiled variants a kernel keeps."""
    from tclang.environment import whole_number
    return whole_number("TCLANG_MAX_VARIANTS", DEFAULT_MAX_VARIANTS)


class Recent:
    """A map that keeps its `limit` most recently used entries.

    Reads take no lock (they run on the hot call path): `get` is an OrderedDict lookup and
    a move to the end, each atomic under the GIL, and a key that another thread evicted in
    between is simply missed. Writes and evictions take the map's lock.
    """

    __slots__ = ("entries", "limit", "_lock")

    def __init__(self, limit: int):
        self.entries: OrderedDict = OrderedDict()
        self.limit = limit
        self._lock = fork_safe(threading.Lock())

    def get(self, key):
        """The value for `key` (now the most recently used), or None."""
        value = self.entries.get(key)
        if value is not None:
            try:
                self.entries.move_to_end(key)
            except KeyError:  # evicted by another thread since the lookup
                pass
        return value

    def put(self, key, value) -> None:
        """Store `value`, dropping the least recently used entries beyond the limit."""
        with self._lock:
            self.entries[key] = value
            self.entries.move_to_end(key)
            while len(self.entries) > self.limit:
                self.entries.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self.entries.clear()

    def __len__(self) -> int:
        return len(self.entries)

    def __contains__(self, key) -> bool:
        return key in self.entries


class HeldWhileUsed:
    """A map whose values stay while anything uses them and, whatever uses them, the
    `limit` most recently stored: weak references for the first rule, a `Recent` of strong
    ones for the second, behind one map's interface (the compile driver's map from key to
    compilation: two modules of one source share it, a compilation nobody uses is freed
    once `limit` newer ones came, and defining a module again and again finds it)."""

    def __init__(self, limit: int):
        self._used: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
        self._recent = Recent(limit)
        self._lock = fork_safe(threading.Lock())

    def get(self, key):
        with self._lock:
            return self._used.get(key)

    def put(self, key, value) -> None:
        with self._lock:
            self._used[key] = value
        self._recent.put(key, value)

    def clear(self) -> None:
        with self._lock:
            self._used.clear()
        self._recent.clear()

    def __iter__(self):
        with self._lock:
            return iter(list(self._used.keys()))

    def __len__(self) -> int:
        return len(self._used)
