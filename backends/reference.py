"""The reference backend: the NumPy interpreter behind the common backend interface.

`backend="reference"` runs a kernel slowly but exactly as the loop IR says; tests and
`tclang run` use it as the oracle.
"""

from __future__ import annotations

from backends.contract import Artifact
from backends.interpreter import compile_kernel
from polyhedral import loop_ir as L
from tclang.target import Target, reference_target


class ReferenceBackend:
    name = "reference"
    device_arrays = False

    def target(self) -> Target:
        return reference_target()

    def build(self, kernel: L.Kernel, target: Target) -> Artifact:
        run = compile_kernel(kernel, kernel.choices.check_bounds)
        return _artifact(run.source, [b.name for b in kernel.buffers], list(kernel.sizes),
                         run)

    def restore(self, blobs, info):
        from backends.interpreter import load_source
        source = blobs["python"].decode()
        return _artifact(source, [b.name for b in info.buffers], list(info.sizes),
                         load_source(source, info.name))


def _artifact(source: str, buffer_names, size_names, run):

    def execute(arrays, sizes):
        run(dict(zip(buffer_names, arrays)), dict(zip(size_names, sizes)))

    return Artifact(source=source, run=execute, stages={"python": source},
                    blobs={"python": source.encode()})


def backend() -> ReferenceBackend:
    return ReferenceBackend()
