"""What the compile driver and every backend agree on, and nothing else.

    artifact = backend.build(kernel, target)   # loop IR in, runnable code out
    artifact = backend.restore(blobs, info)    # the same, from the disk cache's bytes

A backend reads the loop IR `Kernel` (whose `choices` and buffer strides carry every
decision the user's options made) and the `Target` the driver built once for this compile;
it never sees `Options`, the driver or the polyhedral layer's internals. This module is at
the bottom: the driver and the backends import it, it imports only the loop IR and Target.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Protocol, Sequence

if TYPE_CHECKING:  # annotations only: a disk-cache hit loads neither
    from polyhedral import loop_ir as L
    from tclang.target import Target


@dataclass
class Artifact:
    """What a backend builds from one kernel.

    run(arrays, sizes) executes it on arrays in the order of the kernel's buffers and the
    size values in the order of its sizes. `source` is the generated code; `stages` maps
    stage names (llvm, llvm-opt, cuda, ptx, python) to their text; `blobs` is what the disk
    cache keeps, from which `Backend.restore` makes the same artifact again.
    """

    source: str
    run: Callable[[Sequence, Sequence[int]], None]
    stages: dict[str, str] = field(default_factory=dict)
    blobs: dict[str, bytes] = field(default_factory=dict)
    #: optional, for the runtime's fastest path: bind(templates) -> a native call
    #: `call(*arrays)` (all the kernel's arrays) that runs the kernel if the first arrays
    #: look exactly like `templates` (type, dtype, shape, strides: the inputs of a call
    #: checked in full) and returns 0, or returns anything else: the arrays differ and
    #: nothing ran, or an access fell out of bounds (then the checked call, made again,
    #: says where); None where a kernel cannot be bound. A kernel that reads sizes or
    #: strides at run time needs `bind(templates, sizes=..., strides=...)`: the size
    #: values and every array's strides in elements (the runtime's `run` arguments), for
    #: arrays the runtime makes exactly alike on every call
    bind: Callable[..., Callable | None] | None = None


class RestoreInfo(Protocol):
    """What `restore` may read of the driver's stored kernel summary (from a call record:
    only the buffers' names and the statements)."""

    name: str
    sizes: tuple[str, ...]
    buffers: tuple[L.Buffer, ...]
    statements: tuple[tuple[str, str, int], ...]  # id, source text, line


class SealedStore(Protocol):
    """Bytes a backend keeps across processes, lent by the driver (the disk cache: each
    name is an entry authenticated with the user's key, like a compiled kernel's).

    `load(name)` returns exactly the bytes this user's `store(name, data)` was given, or
    None: nothing stored, the disk cache off, or an entry that does not authenticate
    (planted, damaged: discarded with a warning). A backend that loads what it stores as
    code must load only what `load` returned, never a file found by its name."""

    def load(self, name: str) -> bytes | None: ...

    def store(self, name: str, data: bytes) -> None: ...

    def directory(self, name: str) -> str | None:
        """A working directory `name` beside the entries, private to this user (made
        mode 0700 and owner-checked), for build files that are never loaded by name; None
        where the cache is not usable. So a backend needs no import of the driver."""


class Backend(Protocol):
    name: str
    #: the kernel runs where arrays with `__cuda_array_interface__` live: the runtime passes
    #: them as they are (no host copy) and asks `allocate(shape, dtype, zero, like)` for
    #: outputs of the same kind as the user's array `like`, and `copy(destination, source)`
    #: between two such arrays (a strided out= is computed contiguous, then copied)
    device_arrays: bool
    #: optional: the blobs a call needs, if `restore` can run from those alone with only
    #: the buffers' names and the statements of `info`; then the runtime keeps call
    #: records of this backend's kernels (tclang/driver/call_records.py)
    call_blobs: tuple[str, ...] = ()

    def target(self) -> Target:
        """The machine this backend compiles for (the driver sets `bounds_checked`)."""

    def build(self, kernel: L.Kernel, target: Target) -> Artifact: ...

    # optional: `prepare()`, called when a source is parsed (tc.define: its first call
    # will likely compile) and when a compile starts (the disk cache had nothing): start
    # what takes long and can run beside the parse and the polyhedral work (the CPU
    # backend's optimizer process loading LLVM); cheap when it already runs

    # optional: `while_scheduling()`, called in the compiling process while the middle
    # end's process schedules (the compiler would only wait): load what `build` needs
    # (the CPU backend imports its LLVM IR builder)

    # optional: `attach_store(store: SealedStore)`, called once by the driver when it
    # loads the backend: where a backend that keeps build products of its own (the
    # emulated GPU's shared libraries) stores and finds them, authenticated

    def restore(self, blobs: dict[str, bytes], info: RestoreInfo) -> Artifact: ...
