"""The compile driver: the only place that sees the front end, the polyhedral layer and a
backend together.

    program = check_source(source)                         # front end
    scheduled = schedule_definition(defn, sizes, options)  # polyhedral middle end
    artifact = backend.build(scheduled.kernel, ...)        # code generation + JIT

Backends are looked up by name and imported on first use, so a machine without CUDA
imports tclang fine and only `backend="cuda"` needs PyCUDA.
"""

from __future__ import annotations

import importlib
import time
from dataclasses import dataclass, field
from typing import Callable, Protocol, Sequence

import numpy as np

from polyhedral import loop_ir as L
from tclang.errors import TCCompileError
from tclang.options import Options
from tclang.program import Definition
from tclang.target import Target

#: backend name -> module implementing `backend()`
BACKENDS = {
    "cpu": "backends.llvm",
    "cuda": "backends.cuda",
    "cuda-emulated": "backends.cuda.emulated",
    "reference": "backends.reference",
}


@dataclass
class Artifact:
    """What a backend builds from one loop-IR kernel.

    run(arrays, sizes) executes it: `arrays` are NumPy arrays (or device arrays for CUDA)
    in the order of `kernel.buffers`, `sizes` the size values in the order of
    `kernel.sizes`. `source` is the generated code; `stages` maps stage names (llvm, ptx,
    cuda, ...) to their text for explain output.
    """

    source: str
    run: Callable[[Sequence, Sequence[int]], None]
    stages: dict[str, str] = field(default_factory=dict)
    cache_hit: bool = False


class Backend(Protocol):
    name: str

    def target(self, options: Options) -> Target: ...

    def build(self, kernel: L.Kernel, options: Options, key: tuple) -> Artifact: ...


_loaded: dict[str, Backend] = {}


def get_backend(name: str) -> Backend:
    if name not in BACKENDS:
        raise TCCompileError(f"unknown backend {name!r}; the backends are "
                             f"{', '.join(repr(b) for b in BACKENDS)}")
    if name not in _loaded:
        module = importlib.import_module(BACKENDS[name])
        _loaded[name] = module.backend()
    return _loaded[name]


@dataclass
class Compiled:
    """Everything one compilation produced (the runtime wraps it in a CompiledKernel)."""

    definition: Definition
    kernel: L.Kernel
    schedule: str
    strategy: str
    fallback: str | None
    bounds: tuple
    artifact: Artifact
    timings: dict[str, float]


def compile_definition(defn: Definition, sizes: dict[str, int] | None, options: Options,
                       backend_name: str, key: tuple) -> Compiled:
    from polyhedral.pipeline import schedule_definition  # isl loads on first compile

    backend = get_backend(backend_name)
    target = backend.target(options)
    scheduled = schedule_definition(defn, sizes, options, target)
    start = time.perf_counter()
    artifact = backend.build(scheduled.kernel, options, key)
    timings = dict(scheduled.timings)
    timings["backend"] = time.perf_counter() - start
    return Compiled(defn, scheduled.kernel, scheduled.schedule, scheduled.strategy,
                    scheduled.fallback, scheduled.bounds, artifact, timings)


def allocate(buffer: L.Buffer, shape: tuple[int, ...], zero: bool) -> np.ndarray:
    return (np.zeros if zero else np.empty)(shape, dtype=buffer.dtype.numpy)
