"""Contractions: one product of plain reads, summed or not, is an einsum; plus a bias,
then optionally a ReLU, it is a layer (an MLP's, or a convolution's)."""

from __future__ import annotations

import numpy as np

from tclang.peers.common import Operator, arrange, outvars, plain_reads
from tclang.peers.terms import In, K, Op, Red, factors


def einsum(term, shape, out, order) -> Operator | None:
    axes, body = ((), term)
    if isinstance(term, Red) and term.op == "+":
        axes, body = term.axes, term.body
    coef, num, den = factors(body)
    if coef != 1 or den or not num or not plain_reads(num):
        return None
    num = sorted(num, key=lambda f: order.index(f.tensor))  # operands as the inputs come
    extent = dict(zip(outvars(out), out))
    for v, lo, hi in axes:
        if lo != 0:
            return None
        extent[v] = hi
    used = set()
    for f in num:
        for s, n in zip(f.subs, shape[f.tensor]):
            if extent.get(s.var()) != n:
                return None
            used.add(s.var())
    if not set(outvars(out)) <= used or len(extent) > 52:
        return None
    letters = {v: "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"[k]
               for k, v in enumerate(extent)}
    spec = ",".join("".join(letters[s.var()] for s in f.subs) for f in num) + "->" + \
        "".join(letters[v] for v in outvars(out))
    spec = _pretty_spec(spec)
    picks = [order.index(f.tensor) for f in num]

    def numpy(xs):
        return np.einsum(spec, *[xs[k] for k in picks], optimize=True)

    def torch_call(ts):
        import torch
        return torch.einsum(spec, *[ts[k] for k in picks])

    return Operator(f"einsum {spec!r}", numpy, f"np.einsum({spec!r}, optimize=True)",
                    torch_call, f"torch.einsum({spec!r})")


def _pretty_spec(spec: str) -> str:
    """Letters renamed i, j, k, ... in order of first appearance (what a person writes)."""
    names = {}
    pool = iter("ijklmnopqrstuvwxyzabcdefghABCDEFGHIJKLMNOPQRSTUVWXYZ")
    out = []
    for ch in spec:
        if ch.isalpha():
            if ch not in names:
                names[ch] = next(pool)
            out.append(names[ch])
        else:
            out.append(ch)
    return "".join(out)


def with_bias(term, shape, out, order) -> Operator | None:
    """A contraction or a convolution, plus a bias broadcast along the output, then
    optionally a ReLU (`fmax(x, 0)`): an MLP layer, a convolution layer."""
    relu = False
    if isinstance(term, Op) and term.name in ("fmax", "max") and len(term.args) == 2:
        zero = [a for a in term.args if isinstance(a, K) and a.value == 0]
        if len(zero) == 1:
            term = next(a for a in term.args if a is not zero[0])
            relu = True
    bias, core = None, term
    if isinstance(term, Op) and term.name == "add":
        for a, b in (term.args, term.args[::-1]):
            subs = [x.var() for x in b.subs] if isinstance(b, In) else None
            if subs is not None and None not in subs and len(set(subs)) == len(subs) and \
                    set(subs) <= set(outvars(out)) and isinstance(a, Red):
                bias, core = b, a
                break
    if bias is None and not relu:
        return None
    found = None
    from tclang.peers.windows import convolution
    for match in (einsum, convolution):
        found = match(core, shape, out, order)
        if found is not None:
            break
    if found is None:
        return None
    subs = [x.var() for x in bias.subs] if bias is not None else []
    dims = [subs.index(v) if v in subs else None for v in outvars(out)]
    bi = order.index(bias.tensor) if bias is not None else None
    inner_numpy, inner_torch = found.numpy, found.torch

    def numpy(xs):
        y = inner_numpy(xs)
        if bi is not None:
            y = y + arrange(xs[bi], dims)
        return np.maximum(y, 0) if relu else y

    def torch_call(ts):
        import torch
        y = inner_torch(ts)
        if bi is not None:
            y = y + arrange(ts[bi], dims)
        return torch.relu(y) if relu else y

    extra = (" + bias" if bias is not None else "") + (", then ReLU" if relu else "")
    return Operator(found.name + extra, numpy, found.numpy_text + extra, torch_call,
                    found.torch_text + extra)
