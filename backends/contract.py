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


class RestoreInfo(Protocol):
    """What `restore` may read of the driver's stored kernel summary."""

    name: str
    sizes: tuple[str, ...]
    buffers: tuple[L.Buffer, ...]
    statements: tuple[tuple[str, str, int], ...]  # id, source text, line


class Backend(Protocol):
    name: str
    #: the kernel runs where arrays with `__cuda_array_interface__` live: the runtime passes
    #: them as they are (no host copy) and asks `allocate(shape, dtype, zero, like)` for
    #: outputs of the same kind as the user's array `like`, and `copy(destination, source)`
    #: between two such arrays (a strided out= is computed contiguous, then copied)
    device_arrays: bool

    def target(self) -> Target:
        """The machine this backend compiles for (the driver sets `bounds_checked`)."""

    def build(self, kernel: L.Kernel, target: Target) -> Artifact: ...

    def restore(self, blobs: dict[str, bytes], info: RestoreInfo) -> Artifact: ...
