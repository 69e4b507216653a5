"""What both CUDA backends share: the launch table of a generated file, as data.

A kernel's host side is a sequence of launches (the GPU mapping puts every statement in
one): each has a function name, a grid as index expressions of the sizes, and a block.
The table round-trips through JSON so a disk-cache hit needs no code generation.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np

from backends.cuda.codegen import KernelSource
from polyhedral import loop_ir as L

from backends.access_errors import ERR_FIELDS, raise_access_error  # noqa: F401 (re-export)


STATIC_SHARED = 48 * 1024  # shared memory a launch gets without opting in


@dataclass(frozen=True)
class LaunchEntry:
    function: str
    grid: tuple[L.IExpr, ...]
    block: tuple[int, ...]
    condition: L.IExpr | None = None  # on the sizes; the launch is skipped when false
    shared: int = 0  # bytes of dynamic shared memory it asks for

    def runs(self, sizes: dict[str, int]) -> bool:
        return self.condition is None or bool(L.evaluate(self.condition, sizes))

    def dims(self, sizes: dict[str, int]) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
        grid = [max(1, L.evaluate(g, sizes)) for g in self.grid] + [1, 1, 1]
        block = list(self.block) + [1, 1, 1]
        return tuple(grid[:3]), tuple(block[:3])


def table(source: KernelSource) -> tuple[LaunchEntry, ...]:
    return tuple(LaunchEntry(name, launch.grid, launch.block, condition, shared)
                 for (name, launch, condition), shared in zip(source.launches, source.shared))


def to_json(entries) -> bytes:
    return json.dumps([[e.function, [L.iexpr_to_json(g) for g in e.grid], list(e.block),
                        L.iexpr_to_json(e.condition) if e.condition is not None else None,
                        e.shared]
                       for e in entries]).encode()


def from_json(data: bytes) -> tuple[LaunchEntry, ...]:
    return tuple(LaunchEntry(f, tuple(L.iexpr_from_json(g) for g in grid), tuple(block),
                             L.iexpr_from_json(c) if c is not None else None,
                             int(shared[0]) if shared else 0)
                 for f, grid, block, c, *shared in json.loads(data.decode()))


def element_strides(shape, strides_bytes, itemsize: int) -> list[int]:
    if strides_bytes is None:  # C-contiguous
        out, step = [], 1
        for extent in reversed(shape):
            out.append(step)
            step *= max(extent, 1)
        return list(reversed(out))
    return [s // itemsize for s in strides_bytes]


def raise_index_error(err: np.ndarray, buffers, statements, shapes) -> None:
    raise_access_error(err, [b.name for b in buffers], shapes, statements)
