"""What both export targets share: the record of an exported library, and the argument
views a compile for given sizes reads (so neither target imports the other)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tclang.lang.program import Definition


@dataclass(frozen=True)
class ExportedLibrary:
    """What `export` wrote: the library, its header, the wrapper's source (.c or .cu) and
    the other files: the object files it was linked from (CPU), or the PTX and cubin."""

    library: Path
    header: Path
    wrapper: Path
    parts: tuple[Path, ...]
    entry: str
    sizes: dict | None  # None: shape-generic

    @property
    def function(self) -> str:
        return f"tclang_{self.entry}"


def contiguous_views(defn: Definition, sizes: dict[str, int]) -> list[np.ndarray]:
    """Views of one element with the shapes and C-contiguous strides a call with `sizes`
    would have: compiling reads only shapes, dtypes and strides, never the data."""
    arrays = []
    for t in defn.inputs:
        shape = tuple(d.evaluate(sizes) for d in t.shape)
        one = np.zeros(1, dtype=t.dtype.numpy)
        strides, step = [], one.itemsize
        for extent in reversed(shape):
            strides.append(step)
            step *= max(extent, 1)
        arrays.append(np.lib.stride_tricks.as_strided(one, shape, tuple(reversed(strides)),
                                                      writeable=False))
    return arrays
