"""One case of the generality benchmark (benchmarks/generality.py): a tclang definition,
the shapes of its inputs, a NumPy reference, and the peers that compute the same thing.

Every generator (random contractions, guarded and windowed reductions, operators from
public model code) returns these records, so the runner times and checks them all alike.
A case knows nothing of timing: it says what is computed, and by which library calls.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

FAMILIES = ("contraction", "window", "model")


@dataclass(frozen=True)
class Case:
    """What the runner needs of one operator.

    `reference(*arrays)` computes the output in float64 (the truth tclang and every peer
    are checked against). `einsum` is the operator as an einsum string where it is one
    (then `np.einsum(optimize=True)` and `torch.einsum` are peers). `numpy(*arrays, out)`
    is NumPy's best other spelling (sliding windows, ufuncs), writing into `out` where its
    API allows; `torch(*tensors)` PyTorch's own operator where one exists."""

    family: str  # one of FAMILIES
    name: str
    source: str  # the tclang definition, written for this benchmark
    entry: str
    shapes: tuple[tuple[int, ...], ...]  # the inputs', in the definition's order
    reference: Callable
    einsum: str | None = None
    numpy: Callable | None = None
    torch: Callable | None = None
    torch_text: str = ""
    origin: str = ""  # where the operator comes from (model and layer)
    positive: tuple[int, ...] = ()  # inputs drawn positive (variances, masks)

    def arrays(self, seed: int = 0) -> tuple[np.ndarray, ...]:
        """Random float32 inputs, the same for a seed: standard normal values scaled so
        that a sum over a reduction stays near 1 (exp() of them stays finite)."""
        rng = np.random.default_rng(seed)
        out = []
        for k, shape in enumerate(self.shapes):
            a = rng.standard_normal(shape).astype(np.float32)
            out.append(np.abs(a) + np.float32(0.1) if k in self.positive else a)
        return tuple(out)


def model_case(name, origin, source, entry, shapes, reference, **peers) -> Case:
    """A case of the "model" family: `origin` names the model and layer."""
    return Case("model", name, source, entry, tuple(shapes), reference, origin=origin, **peers)


def error_of(got, want) -> float:
    """The largest difference over the largest magnitude of the reference (1e-3 is the
    rounding of float32 sums reordered over thousands of terms)."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    if got.shape != want.shape:
        return float("inf")
    scale = max(float(np.max(np.abs(want), initial=0.0)), 1e-30)
    return float(np.max(np.abs(got - want), initial=0.0)) / scale


def einsum_reference(spec: str) -> Callable:
    """A float64 reference of an einsum, for contractions."""
    return lambda *arrays: np.einsum(spec, *(a.astype(np.float64) for a in arrays),
                                     optimize=True)


def sizes_text(names: str, extents) -> str:
    return ",".join(f"{n}={e}" for n, e in zip(names, extents))
