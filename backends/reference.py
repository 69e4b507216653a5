"""The reference backend: the NumPy interpreter behind the common backend interface.

`backend="reference"` runs a kernel slowly but exactly as the loop IR says; tests and
`tclang run` use it as the oracle.
"""

from __future__ import annotations

from backends.interpreter import compile_kernel
from polyhedral import loop_ir as L


class ReferenceBackend:
    name = "reference"

    def target(self, options):
        from tclang.target import reference_target
        return reference_target()

    def build(self, kernel: L.Kernel, options, key):
        from tclang.compiler import Artifact
        run = compile_kernel(kernel)
        buffer_names = [b.name for b in kernel.buffers]
        size_names = list(kernel.sizes)

        def execute(arrays, sizes):
            run(dict(zip(buffer_names, arrays)), dict(zip(size_names, sizes)))

        return Artifact(source=run.source, run=execute, stages={"python": run.source})


def backend() -> ReferenceBackend:
    return ReferenceBackend()
