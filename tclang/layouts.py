"""The layout key: what a specialized kernel assumes about each argument's strides.

A specialized kernel is compiled for exact shapes and dtypes, but not for exact strides:

- a C-contiguous array (NumPy's relaxed sense: the stride of an extent-1 dimension does
  not matter) gets its row-major strides as constants in the code, all of them. This is
  the common case and it costs nothing: the code and the call are what they always were
  (a call of a kernel whose every stride is a constant passes just the data pointers);
- any other array keeps as constants only what shapes its code: which dimensions have
  unit stride (the contiguous one is what vectorized loads and packing copies want) and
  that an extent-1 dimension is never stepped along (stride 0). Every other stride is a
  run-time value, read from the strides array the call passes.

So a Fortran-ordered array and a transposed view share a compile (their first dimension
is the unit-stride one), as do row-padded slices with any row stride (`big[:M, :K]` for
any width of `big`); the C-contiguous layout has its own, because run-time strides there
would cost every call (benchmarks/layouts.py measures it). Two layouts with the same key
get the same code, so a kernel may run with any strides of its key's layout and never
with strides its code holds as other constants: `Kernel._for`, `CompiledKernel` and both
caches compare these keys.

A layout with run-time strides also records whether every element offset it can address
stays below `OFFSET_BOUND` (below it, a GPU kernel may index in 32 bits).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

#: element offsets below this may be computed in 32-bit integers (backends/cuda's
#: NARROW_LIMIT is the same bound); the layout key says which side of it an array is on
OFFSET_BOUND = 1 << 30


class Layout(NamedTuple):
    """Per dimension, the stride in elements when the code holds it as a constant, None
    when it is read at run time; `bound`, when some stride is read at run time: an upper
    bound on the magnitude of every element offset (None: none known)."""

    strides: tuple[int | None, ...]
    bound: int | None = None


def layout_key(shape: Sequence[int], strides: Sequence[int]) -> Layout:
    """The layout key of an array of `shape` with `strides` in elements (see the module's
    docstring). Equal keys mean the same code; the key depends only on the shape and the
    strides a kernel can observe."""
    shape = tuple(shape)
    if is_c_contiguous(shape, strides):
        return Layout(row_major(shape))
    known = tuple(0 if n <= 1 else 1 if s == 1 else None for n, s in zip(shape, strides))
    if None not in known:
        return Layout(known)
    span = sum((n - 1) * abs(s) for n, s in zip(shape, strides) if n > 1)
    return Layout(known, OFFSET_BOUND if span < OFFSET_BOUND else None)


def is_c_contiguous(shape: Sequence[int], strides: Sequence[int]) -> bool:
    """Row-major and dense, ignoring extent-1 dimensions (and anything with no element)."""
    if 0 in shape:
        return True
    step = 1
    for n, s in zip(reversed(tuple(shape)), reversed(tuple(strides))):
        if n != 1 and s != step:
            return False
        step *= n
    return True


def row_major(shape: Sequence[int]) -> tuple[int, ...]:
    """Dense row-major strides in elements (an extent-0 dimension counts as 1)."""
    strides, step = [], 1
    for extent in reversed(tuple(shape)):
        strides.append(step)
        step *= max(extent, 1)
    return tuple(reversed(strides))


def partial_layout_key(shape: Sequence[int], strides: Sequence[int],
                       fixed: Sequence[bool]) -> Layout:
    """The layout key of an argument of a kernel generic in some sizes: `fixed` says which
    dimensions' extents are constants of the code (the others are generic sizes, which
    take any value with the same key). A C-contiguous array keeps as constants the strides
    that only fixed extents decide (a row-major stride is the product of the extents after
    it: so all of them when only the first dimension is generic, the common case); any
    other layout its unit strides, and the zero stride of a fixed extent-1 dimension. The
    rest are read at run time, with no bound on the offsets (that bound depends on the
    generic sizes' values)."""
    shape, fixed = tuple(shape), tuple(fixed)
    if is_c_contiguous(shape, strides):
        dense = row_major(shape)
        return Layout(tuple(dense[k] if all(fixed[k + 1:]) else None
                            for k in range(len(shape))))
    return Layout(tuple(0 if n <= 1 and f else 1 if s == 1 and n > 1 else None
                        for n, s, f in zip(shape, strides, fixed)))
