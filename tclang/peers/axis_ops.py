"""Operators along one axis: cumsum (a guarded prefix sum), softmax, layer norm and
attention (a softmax of a contraction times a third input, with or without a causal
mask)."""

from __future__ import annotations

import numpy as np

from tclang.peers.common import Operator, identity_read, outvars, plain_reads
from tclang.peers.terms import (In, K, Op, Prod, Red, factors, free, inequality, key, lin_of,
                                rename, same, walk_terms)


def cumsum(term, shape, out, order) -> Operator | None:
    if not isinstance(term, Red) or term.op != "+" or len(term.axes) != 1:
        return None
    (j, lo, hi), body = term.axes[0], term.body
    cond = None
    if isinstance(body, Op) and body.name == "select" and isinstance(body.args[2], K) and \
            body.args[2].value == 0:
        cond, body = body.args[0], body.args[1]
    elif isinstance(body, Prod) and body.coef == 1 and not body.den and len(body.num) == 2:
        compare = [f for f in body.num if inequality(f) is not None]
        if len(compare) == 1:
            cond = compare[0]
            body = next(f for f in body.num if f is not cond)
    if cond is None or not isinstance(body, In) or lo != 0:
        return None
    subs = [s.var() for s in body.subs]
    outs = outvars(out)
    if len(subs) != len(outs) or subs.count(j) != 1:
        return None
    axis = subs.index(j)
    if [v for k, v in enumerate(subs) if k != axis] != [v for k, v in enumerate(outs)
                                                       if k != axis] or \
            hi != out[axis] or list(shape[body.tensor]) != list(out):
        return None
    if inequality(cond) != lin_of({outs[axis]: 1, j: -1}):
        return None  # only the inclusive prefix sum: j <= i
    xi = order.index(body.tensor)

    def torch_call(ts):
        import torch
        return torch.cumsum(ts[xi], dim=axis)

    return Operator(f"cumsum over axis {axis}", lambda xs: np.cumsum(xs[xi], axis=axis),
                    f"np.cumsum(axis={axis})", torch_call, f"torch.cumsum(dim={axis})")


def _exp_of(t):
    """The argument u of exp(u), or None."""
    if isinstance(t, Op) and t.name in ("exp", "expf") and len(t.args) == 1:
        return t.args[0]
    return None


def _unshift(u, axis_var: str):
    """softmax is shift-invariant: exp(u - c) with c constant along the axis is exp(u)."""
    if isinstance(u, Op) and u.name == "sub" and axis_var not in free(u.args[1]):
        return u.args[0]
    return u


def _normalized_exp(term, out_vars):
    """(E, axis variable, sum's variable) when term = E / sum over the axis of E."""
    coef, num, den = factors(term)
    if coef != 1 or len(den) != 1 or not isinstance(den[0], Red) or den[0].op != "+" or \
            len(den[0].axes) != 1:
        return None
    (r, lo, hi), total = den[0].axes[0], den[0].body
    rest = num
    for k, e in enumerate(rest):
        for v in out_vars:
            if v in free(e) and same(rename(e, {v: r}), total):
                return e, v, (lo, hi), rest[:k] + rest[k + 1:]
    return None


def softmax(term, shape, out, order) -> Operator | None:
    found = _normalized_exp(term, outvars(out))
    if found is None:
        return None
    e, v, (lo, hi), rest = found
    axis = int(v[1:])
    u = _exp_of(e)
    if rest or u is None or lo != 0 or hi != out[axis]:
        return None
    u = _unshift(u, v)
    scale, num, den = factors(u)
    x = identity_read(num[0], out) if len(num) == 1 and not den else None
    if x is None or list(shape[x.tensor]) != list(out):
        return None
    xi = order.index(x.tensor)

    def numpy(xs):
        z = xs[xi] * scale if scale != 1 else xs[xi]
        z = np.exp(z - z.max(axis=axis, keepdims=True))
        return z / z.sum(axis=axis, keepdims=True)

    def torch_call(ts):
        import torch
        return torch.softmax(ts[xi] * scale if scale != 1 else ts[xi], dim=axis)

    what = f"softmax over axis {axis}" + (f" of {scale:g} x the input" if scale != 1 else "")
    return Operator(what, numpy, f"NumPy exp / sum over axis {axis}", torch_call,
                    f"torch.softmax(dim={axis})")


def layernorm(term, shape, out, order) -> Operator | None:
    """Y = (X - mean) / sqrt(var + eps) [* gamma] [+ beta] over one axis. The formula
    inside is not checked term by term (mean and variance have many spellings): the
    skeleton is (one input centred by a sum over one axis, one square root, scale and
    shift vectors along that axis), and users of the peer confirm it on the data."""
    found = _normalized_axis(term, shape, out)
    if found is None:
        return None
    x, axis = found
    eps = _epsilon(term, out, axis)
    vectors = _scale_and_shift(term, shape, out, axis, x)
    if eps is None or vectors is None:
        return None
    gamma, beta = vectors
    return _layernorm_operator(axis, eps, order.index(x),
                               order.index(gamma) if gamma else None,
                               order.index(beta) if beta else None)


def _normalized_axis(term, shape, out):
    """(X, axis): the one input read at the output's point, every sum over one variable
    that takes the place of the same axis of X."""
    reads = [t for t in walk_terms(term) if isinstance(t, In)]
    xs = {r.tensor for r in reads if identity_read(r, out) is not None}
    reds = [t for t in walk_terms(term) if isinstance(t, Red)]
    if len(xs) != 1 or not reds or any(r.op != "+" or len(r.axes) != 1 for r in reds):
        return None
    x = xs.pop()
    bound = {r.axes[0][0] for r in reds}
    axes = set()
    for read in (r for r in reads if r.tensor == x):  # the vectors: _scale_and_shift
        subs = [s.var() for s in read.subs]
        moved = [k for k, v in enumerate(subs) if v != f"@{k}"]
        if len(moved) > 1 or (moved and subs[moved[0]] not in bound):
            return None
        axes.update(moved)
    if len(axes) != 1 or list(shape[x]) != list(out):
        return None
    axis = axes.pop()
    if any(r.axes[0][1] != 0 or r.axes[0][2] != out[axis] for r in reds):
        return None
    return x, axis


def _epsilon(term, out, axis: int) -> float | None:
    """The constant added under the one square root, when X minus a sum over the axis
    appears in the term; None without them."""
    av = f"@{axis}"
    roots = list({key(t): t for t in walk_terms(term)
                  if isinstance(t, Op) and t.name == "sqrt"}.values())
    centred = [t for t in walk_terms(term) if isinstance(t, Op) and t.name == "sub" and
               identity_read(t.args[0], out) is not None and av not in free(t.args[1]) and
               any(isinstance(s, Red) for s in walk_terms(t.args[1]))]
    if len(roots) != 1 or not centred:
        return None
    inside = roots[0].args[0]
    if isinstance(inside, Op) and inside.name == "add":
        constants = [a.value for a in inside.args if isinstance(a, K)]
        return constants[0] if constants else 0.0
    return 0.0


def _scale_and_shift(term, shape, out, axis: int, x: str):
    """(gamma, beta): the vectors along the axis multiplied in and added last (each may
    be None); None if another input is read."""
    av = f"@{axis}"
    vectors = {t.tensor for t in walk_terms(term) if isinstance(t, In) and t.tensor != x}
    if any(len(shape[v]) != 1 or shape[v][0] != out[axis] for v in vectors):
        return None

    def along(t) -> bool:
        return isinstance(t, In) and t.tensor in vectors and [s.var() for s in t.subs] == [av]

    beta = gamma = None
    main = term
    if isinstance(term, Op) and term.name == "add":
        for a, b in (term.args, term.args[::-1]):
            if along(b):
                beta, main = b.tensor, a
                break
    for f in factors(main)[1]:
        if along(f):
            gamma = f.tensor
    if vectors != {v for v in (gamma, beta) if v is not None}:
        return None
    return gamma, beta


def _layernorm_operator(axis: int, eps: float, xi: int, gi, bi) -> Operator:
    def numpy(arrays):
        a = np.moveaxis(arrays[xi], axis, -1)
        mean = a.mean(axis=-1, keepdims=True)
        var = ((a - mean) ** 2).mean(axis=-1, keepdims=True)
        y = (a - mean) / np.sqrt(var + eps)
        if gi is not None:
            y = y * arrays[gi]
        if bi is not None:
            y = y + arrays[bi]
        return np.moveaxis(y, -1, axis)

    def torch_call(tensors):
        import torch.nn.functional as F
        a = tensors[xi].movedim(axis, -1)
        y = F.layer_norm(a, (a.shape[-1],), tensors[gi] if gi is not None else None,
                         tensors[bi] if bi is not None else None, eps)
        return y.movedim(-1, axis)

    parts = [p for p, v in (("scale", gi), ("shift", bi)) if v is not None]
    what = f"layer_norm over axis {axis}, eps {eps:g}" + \
        (f", with {' and '.join(parts)}" if parts else "")
    return Operator(what, numpy, "NumPy mean / var", torch_call,
                    f"torch.nn.functional.layer_norm(eps={eps:g})")


def attention(term, shape, out, order) -> Operator | None:
    """O = sum_j softmax_j(scale x sum_d Q(i, d) K(j, d) [causal mask]) V(j, e), with
    optional leading batch dimensions shared by Q, K, V and O."""
    found = _normalized_exp_sum(term)
    if found is None:
        return None
    e, j, v_read = found
    mask = None
    if isinstance(e, Op) and e.name == "select" and isinstance(e.args[2], K) and \
            e.args[2].value == 0:
        mask, e = e.args[0], e.args[1]
    u = _exp_of(e)
    if u is None:
        return None
    u = _unshift(u, j)
    if isinstance(u, Op) and u.name == "select" and isinstance(u.args[2], K) and \
            u.args[2].value <= -1e9:
        if mask is not None:
            return None
        mask, u = u.args[0], u.args[1]
    scale, num, den = factors(u)
    if den or len(num) != 1 or not isinstance(num[0], Red) or num[0].op != "+" or \
            len(num[0].axes) != 1:
        return None
    (d, dlo, dhi), dot = num[0].axes[0], num[0].body
    dc, pair, pden = factors(dot)
    if dc != 1 or pden or len(pair) != 2 or not plain_reads(pair + (v_read,)):
        return None
    outs = outvars(out)
    i_var, e_var = outs[-2], outs[-1]
    batch = outs[:-2]
    q = next((r for r in pair if [s.var() for s in r.subs] == batch + [i_var, d]), None)
    k = next((r for r in pair if [s.var() for s in r.subs] == batch + [j, d]), None)
    if q is None or k is None or [s.var() for s in v_read.subs] != batch + [j, e_var]:
        return None
    causal = False
    if mask is not None:
        if inequality(mask) != lin_of({i_var: 1, j: -1}):
            return None
        causal = True
    qi, ki, vi = (order.index(r.tensor) for r in (q, k, v_read))
    if dlo != 0 or dhi != shape[q.tensor][-1]:
        return None

    def numpy(xs):
        s = np.matmul(xs[qi], np.swapaxes(xs[ki], -1, -2)) * scale
        if causal:
            s = np.where(np.tril(np.ones(s.shape[-2:], bool)), s, -np.inf)
        s = np.exp(s - s.max(axis=-1, keepdims=True))
        return np.matmul(s / s.sum(axis=-1, keepdims=True), xs[vi])

    def torch_call(ts):
        import torch.nn.functional as F
        return F.scaled_dot_product_attention(ts[qi], ts[ki], ts[vi], is_causal=causal,
                                              scale=scale)

    what = f"attention, scale {scale:g}" + (", causal mask" if causal else "")
    return Operator(what, numpy, "NumPy matmul, softmax, matmul", torch_call,
                    f"torch.nn.functional.scaled_dot_product_attention(is_causal={causal})")


def _normalized_exp_sum(term):
    """(E, j, V) when term = sum_j E V / sum_j E (E's division taken out of the sum)."""
    coef, num, den = factors(term)
    if coef != 1 or len(num) != 1 or len(den) != 1:
        return None
    top, bottom = num[0], den[0]
    if not (isinstance(top, Red) and isinstance(bottom, Red) and top.op == bottom.op == "+"
            and len(top.axes) == len(bottom.axes) == 1):
        return None
    (j, lo, hi), (j2, lo2, hi2) = top.axes[0], bottom.axes[0]
    if (lo, hi) != (lo2, hi2) or lo != 0:
        return None
    tc, tn, td = factors(top.body)
    if tc != 1 or td or len(tn) != 2:
        return None
    for e, v in (tn, tn[::-1]):
        if isinstance(v, In) and same(rename(e, {j: j2}), bottom.body):
            return e, j, v
    return None
