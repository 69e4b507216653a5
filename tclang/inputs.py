"""What the command line reads (a source file, `--sizes`) and random arguments for a
definition: what `tclang run`, the demo and the fuzzers feed it.

Floats are standard normal; an integer tensor used as a gather index gets values inside
the dimensions it indexes, so the run is valid; other integers are small, of both signs.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tclang.lang import program as P
from tclang.errors import TCArgumentError, TCError


def read_source(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError as err:
        raise TCError(f"cannot read {path}: {err.strerror}") from None


def parse_sizes(text: str) -> dict[str, int]:
    """`M=64,N=32` -> {"M": 64, "N": 32}."""
    sizes = {}
    for item in filter(None, (x.strip() for x in (text or "").split(","))):
        name, _, value = item.partition("=")
        try:
            sizes[name.strip()] = int(value)
        except ValueError:
            raise TCArgumentError(f"--sizes takes NAME=INT pairs separated by commas, not "
                                  f"{item!r}") from None
    return sizes


def check_sizes(defn: P.Definition, sizes: dict[str, int]) -> None:
    missing = [s for s in defn.sizes if s not in sizes]
    if missing:
        raise TCArgumentError(f"{defn.name} needs values for the sizes {', '.join(missing)}",
                              hint="e.g. --sizes " + ",".join(f"{s}=16" for s in defn.sizes))
    unknown = [s for s in sizes if s not in defn.sizes]
    if unknown:
        raise TCArgumentError(f"{defn.name} has no sizes named {', '.join(unknown)}; its sizes "
                              f"are {', '.join(defn.sizes) or 'none'}")


def index_bounds(defn: P.Definition, sizes: dict[str, int]) -> dict[str, int]:
    """For each tensor used inside a gather subscript: the smallest extent it indexes."""
    bounds: dict[str, int] = {}
    for s in defn.statements:
        for read in s.reads():
            for sub, affine, extent in zip(read.subscripts, read.affine,
                                           defn.tensor(read.tensor).shape):
                if affine is not None:
                    continue
                for inner in P.reads_of(sub):
                    limit = extent.evaluate(sizes)
                    bounds[inner.tensor] = min(bounds.get(inner.tensor, limit), limit)
    return bounds


def random_inputs(defn: P.Definition, sizes: dict[str, int],
                  rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    gathers = index_bounds(defn, sizes)
    arrays = []
    for t in defn.inputs:
        shape = P.evaluate_shape(t.shape, sizes)
        dtype = t.dtype.numpy
        if t.name in gathers:
            values = rng.integers(0, max(gathers[t.name], 1), size=shape)
        elif t.dtype.is_float:
            values = rng.standard_normal(shape)
        elif t.dtype.value == "bool":
            values = rng.random(shape) < 0.5
        elif t.dtype.is_signed:
            values = rng.integers(-5, 6, size=shape)
        else:
            values = rng.integers(0, 11, size=shape)
        arrays.append(np.asarray(values).astype(dtype))
    return tuple(arrays)
