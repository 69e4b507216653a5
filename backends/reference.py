"""The reference backend: the NumPy interpreter behind the common backend interface.

`backend="reference"` runs a kernel slowly but exactly as the loop IR says; tests and
`tclang run` use it as the oracle.
"""

from __future__ import annotations

import dataclasses

from backends.interpreter import compile_kernel
from polyhedral import loop_ir as L


class ReferenceBackend:
    name = "reference"

    def target(self, options):
        from tclang.target import bounds_checking, reference_target
        return dataclasses.replace(reference_target(), bounds_checked=bounds_checking(options))

    def build(self, kernel: L.Kernel, options, layouts):
        from tclang.target import bounds_checking
        run = compile_kernel(kernel, bounds_checking(options))
        return _artifact(run.source, [b.name for b in kernel.buffers], list(kernel.sizes),
                         run)

    def restore(self, blobs, info):
        from backends.interpreter import load_source
        source = blobs["python"].decode()
        return _artifact(source, [b.name for b in info.buffers], list(info.sizes),
                         load_source(source, info.name))


def _artifact(source: str, buffer_names, size_names, run):
    from tclang.compiler import Artifact

    def execute(arrays, sizes):
        run(dict(zip(buffer_names, arrays)), dict(zip(size_names, sizes)))

    return Artifact(source=source, run=execute, stages={"python": source},
                    blobs={"python": source.encode()})


def backend() -> ReferenceBackend:
    return ReferenceBackend()
