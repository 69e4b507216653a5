"""What every matcher of tclang.peers shares: the `Operator` it returns, the output's
variables, reads of plain indices, and arrays (NumPy or PyTorch alike) rearranged between
a definition's layout and a library's."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from tclang.peers.terms import In, K, Op, Prod


@dataclass
class Operator:
    """A recognised operator: NumPy and PyTorch calls computing the definition's output
    from its inputs (in the definition's order), and what they are called."""

    name: str  # e.g. "conv2d, stride 2, padding 1"
    numpy: Callable  # numpy(arrays) -> the output
    numpy_text: str  # e.g. "np.einsum('ik,kj->ij', optimize=True)"
    torch: Callable | None = None  # torch(tensors) -> the output
    torch_text: str | None = None


def outvars(out) -> list[str]:
    return [f"@{k}" for k in range(len(out))]


def plain_reads(fs) -> bool:
    return all(isinstance(f, In) and all(s.var() is not None for s in f.subs) for f in fs)


def identity_read(t, out) -> In | None:
    """`t` if it reads an input at exactly the output's point (X(@0, @1, ...))."""
    if isinstance(t, In) and [s.var() for s in t.subs] == outvars(out):
        return t
    return None


def unguard(t, empty: float):
    """`t` without `?:` guards whose other branch is the constant `empty` (padding), in
    the term or in its factors; (term, whether a guard was removed)."""
    guarded = False
    while isinstance(t, Op) and t.name == "select" and isinstance(t.args[2], K) and \
            _is(t.args[2].value, empty):
        t, guarded = t.args[1], True
    if isinstance(t, Prod) and empty == 0:
        num = []
        for f in t.num:
            g, was = unguard(f, 0.0)
            num.append(g)
            guarded |= was
        t = Prod(t.coef, tuple(num), t.den)
    return t, guarded


def _is(value: float, empty: float) -> bool:
    if empty == -math.inf:
        return value <= -1e9
    return value == empty


def arrange(a, dims):
    """`a` transposed so its axes follow `dims` (axis numbers of `a`), with size-1 axes
    where `dims` has None (NumPy arrays and PyTorch tensors alike)."""
    present = [d for d in dims if d is not None]
    a = a.permute(*present) if hasattr(a, "permute") else a.transpose(present)
    shape, it = [], iter(a.shape)
    for d in dims:
        shape.append(next(it) if d is not None else 1)
    return a.reshape(tuple(shape))


def unarrange(y, dims):
    """The inverse of `_arrange` for an output: `y`'s axes are roles, `dims[r]` the
    output axis of role r (None: a size-1 axis to drop)."""
    keep = [r for r, d in enumerate(dims) if d is not None]
    y = y.reshape(tuple(y.shape[r] for r in keep))
    where = [dims[r] for r in keep]
    perm = [where.index(p) for p in range(len(where))]
    return y.permute(*perm) if hasattr(y, "permute") else y.transpose(perm)


def tuple_text(values) -> str:
    return str(values[0]) if len(set(values)) == 1 else "x".join(map(str, values))
