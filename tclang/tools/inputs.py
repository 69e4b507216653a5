"""What the command line reads (a source file, `--sizes`) and random arguments for a
definition: what `tclang run`, the demo and the fuzzers feed it.

Floats are standard normal; an integer tensor used as a gather index gets values inside
the dimensions it indexes, so the run is valid; other integers are small, of both signs.
"""

from __future__ import annotations

import argparse
import math
import os
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
    """--sizes gives every size of `defn`, each from 0 to 2**63 - 1 (NumPy's errors for a
    negative or huge dimension came out as tracebacks)."""
    missing = [s for s in defn.sizes if s not in sizes]
    if missing:
        raise TCArgumentError(f"{defn.name} needs values for the sizes {', '.join(missing)}",
                              hint="e.g. --sizes " + ",".join(f"{s}=16" for s in defn.sizes))
    unknown = [s for s in sizes if s not in defn.sizes]
    if unknown:
        raise TCArgumentError(f"{defn.name} has no sizes named {', '.join(unknown)}; its sizes "
                              f"are {', '.join(defn.sizes) or 'none'}")
    for name, value in sizes.items():
        if not 0 <= value < 2**63:
            raise TCArgumentError(f"--sizes {name}={value}: a size is a whole number from 0 "
                                  "to 2**63 - 1")


def check_input_memory(defn: P.Definition, sizes: dict[str, int]) -> None:
    """Random inputs for `sizes` fit in this machine's memory (past it, NumPy raised, or
    the system killed the process while it filled them)."""
    needed, memory = input_bytes(defn, sizes), physical_memory()
    if memory is not None and needed > memory:
        raise TCArgumentError(f"--sizes {_listed(sizes)} make {defn.name}'s random inputs "
                              f"{_bytes(needed)}, more than this machine's "
                              f"{_bytes(memory)} of memory", hint="choose smaller sizes")


def input_bytes(defn: P.Definition, sizes: dict[str, int]) -> int:
    """What `random_inputs` holds at its peak: every input, and the float64 or int64
    values the largest one is drawn as."""
    elements = [math.prod(P.evaluate_shape(t.shape, sizes)) for t in defn.inputs]
    kept = sum(n * t.dtype.numpy.itemsize for n, t in zip(elements, defn.inputs))
    return kept + 8 * max(elements, default=0)


def physical_memory() -> int | None:
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):  # not on this system
        return None


def _listed(sizes: dict[str, int]) -> str:
    return ",".join(f"{k}={v}" for k, v in sizes.items())


def _bytes(n: int) -> str:
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}" if n < 1024 * scale else f"{n // scale:,} {unit}"
    return f"{n} bytes"


# ---- argparse types: a bad number gets the usage message and exit 2, not a traceback ----

def count_argument(least: int):
    """A whole number of at least `least`."""
    def count(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < least:
            raise argparse.ArgumentTypeError(f"expected a whole number of at least {least}, "
                                             f"not {text!r}")
        return value
    return count


def positive_argument(text: str) -> float:
    """A finite number above 0 (seconds, megabytes)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"expected a finite number above 0, not {text!r}")
    return value


def integers_argument(text: str) -> tuple[int, ...]:
    """Whole numbers separated by commas, e.g. 32,32 (their range is the option's to
    check: tc.Options says what it takes)."""
    try:
        return tuple(int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected whole numbers separated by commas "
                                         f"(e.g. 32,32), not {text!r}") from None


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
        if t.dtype.value == "bfloat16":  # NumPy cannot cast to tclang's bfloat16 storage
            from tclang.bfloat16 import from_float32
            arrays.append(from_float32(np.asarray(values, dtype=np.float32)))
            continue
        arrays.append(np.asarray(values).astype(dtype))
    return tuple(arrays)
