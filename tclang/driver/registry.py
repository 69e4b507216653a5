"""The backends by name, each loaded on first use (a machine without CUDA imports tclang
fine; only `backend="cuda"` needs PyCUDA). Light on purpose: the runtime asks it for a
backend on a disk-cache hit, before anything of the compiler is loaded."""

from __future__ import annotations

import importlib

from tclang.errors import TCCompileError

#: backend name -> module whose `backend()` returns the Backend
BACKENDS = {
    "cpu": "backends.llvm.backend",
    "cuda": "backends.cuda.backend",
    "cuda-emulated": "backends.cuda.emulated",
    "reference": "backends.reference",
}

_loaded: dict = {}


def get_backend(name: str):
    """The Backend (backends/contract.py) called `name`."""
    if name not in BACKENDS:
        raise TCCompileError(f"unknown backend {name!r}; the backends are "
                             f"{', '.join(repr(b) for b in BACKENDS)}")
    if name not in _loaded:
        module = importlib.import_module(BACKENDS[name])
        backend = module.backend()
        attach = getattr(backend, "attach_store", None)
        if attach is not None:  # its own build products, authenticated like the kernels
            from tclang.driver.diskcache import SealedEntries
            attach(SealedEntries())
        _loaded[name] = backend
    return _loaded[name]
