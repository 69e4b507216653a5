"""Object code -> addresses in this process: a kernel's code (from the optimizer or the
disk cache) and the native thread pool's.

The ELF loader (elf_loader.py) links our x86-64 objects without LLVM, which a disk-cache
hit in a fresh process cannot afford to import (~27 ms); an object it refuses (another
architecture, a relocation or symbol it does not know, pages that cannot be made
executable) goes to an MCJIT engine of its own (codegen.py), as every object did before.
Either way the code stays mapped exactly as long as the returned `LoadedCode`: whatever
calls its addresses keeps it.
"""

from __future__ import annotations

import threading
import weakref

from backends.llvm import elf_loader
from tclang.errors import TCCompileError
from tclang.locks import fork_safe

_lock = fork_safe(threading.Lock())
_live = 0


class LoadedCode:
    """One object linked into the process; `address(name)` of each symbol asked for."""

    def __init__(self, object_code: bytes, symbols: tuple[str, ...],
                 process_symbols: tuple[str, ...] = (), mcjit: bool | None = None):
        """`process_symbols`: names the object calls in the process's C library (LLVM is
        told their addresses, rather than searching the process itself); `mcjit`: True
        or False to choose the loader (None: TCLANG_LOADER, else the ELF loader first)."""
        global _live
        linked = None
        self.loader = "elf"
        if not (_mcjit_forced() if mcjit is None else mcjit):
            try:
                linked = elf_loader.load_object(object_code)
            except elf_loader.Unsupported:
                linked = None
        if linked is None:  # llvmlite is imported only now
            from backends.llvm import codegen
            linked = codegen.MCJITCode(object_code, process_symbols)
            self.loader = "mcjit"
        self._linked = linked
        self.addresses = {name: linked.address(name) for name in symbols}
        missing = [name for name, address in self.addresses.items() if not address]
        if missing:
            raise TCCompileError(f"the object code has no {', '.join(missing)}")
        with _lock:
            _live += 1
        weakref.finalize(self, _released).atexit = False

    def address(self, name: str) -> int:
        return self.addresses[name]


def _released() -> None:
    global _live
    with _lock:
        _live -= 1


def _mcjit_forced() -> bool:
    """TCLANG_LOADER=mcjit loads every object through LLVM (to compare the two loaders)."""
    from tclang.environment import choice
    return choice("TCLANG_LOADER", ("elf", "mcjit")) == "mcjit"


def live_objects() -> int:
    """How many loaded objects hold code now (for tests and memory diagnostics)."""
    return _live
