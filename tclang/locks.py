"""Locks that a forked child finds released.

`os.fork` copies only the thread that calls it. A lock another thread held at that moment
stays held in the child, by a thread that does not exist there, and the child's first use
of it waits forever: a thread compiling a kernel (its per-kernel lock held for the whole
compile) while the main thread forks, and the child calling that kernel, hung (issue 31).
Every lock tclang takes around compile work, its caches and its loaded code is made with
`fork_safe`, and the child re-initializes each of them right after the fork, as CPython
does for its own (`threading`, `logging`'s handlers: `_at_fork_reinit`).

That is safe because of what these locks guard: state that is whole between two Python
bytecodes (an OrderedDict's entries, a counter: the forking thread holds the GIL), or
work whose result is published only once it is done (a compiled kernel is stored in its
map after the compile, the thread pool's runtime once linked). The child sees that state
as the other thread left it between two steps, and does the unfinished work itself. One
caveat: LLVM's lock (backends/llvm/codegen.py) held at the fork means another thread was
inside LLVM in this process (the MCJIT loader, or optimizing where no helper could be
forked), whose state the child then inherits torn; the child needs in-process LLVM only
for those same rare paths, and a crash there says more than waiting forever.

Left alone, with reasons: `ForkedServer.lock` is replaced by the server's own at-fork hook,
which forgets the parent's helper process too (tclang/forked_server.py); the recursion-room
lock of tclang/lang/parser.py has its own hook (the language layer imports nothing of
tclang's driver); the per-artifact lock of the CUDA backend guards a CUDA context, which
a forked child cannot use at all (the CUDA driver refuses).
"""

from __future__ import annotations

import os
import threading
import weakref

# weak references with no callback, not a WeakSet: a WeakSet runs Python (its `_remove`)
# each time a lock dies, and a Ctrl-C whose handler ran there was dropped by Python
# ("Exception ignored in ..._remove", tclang/ctrl_c.py); the dead ones are swept as the
# list grows
_locks: list[weakref.ref] = []
_sweep_at = 64
_guard = threading.Lock()  # the list's (released in the child like the others)


def fork_safe(lock):
    """`lock` (a threading.Lock or RLock), released in every child forked from now on."""
    global _sweep_at
    with _guard:
        _locks.append(weakref.ref(lock))
        if len(_locks) >= _sweep_at:
            _locks[:] = [ref for ref in _locks if ref() is not None]
            _sweep_at = max(64, 2 * len(_locks))
    return lock


def _release_in_child() -> None:
    _guard._at_fork_reinit()
    for ref in list(_locks):
        lock = ref()
        if lock is not None:
            lock._at_fork_reinit()


os.register_at_fork(after_in_child=_release_in_child)
