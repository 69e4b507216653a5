"""Windows: convolutions (any layout, stride, padding, dilation, groups) and pooling (max
or average), read off the subscripts `stride x out + dilation x kernel - padding` of one
input; NumPy's peer is sliding windows (it has no convolution), PyTorch's the library op.

Padding is written in the language as reads under a guard (`(h + kh >= 1 && ...) ? I(n,
c, h + kh - 1, ...) : 0`); the guard's formula is not matched term by term: the offset
gives the padding before the data, the output's extent the padding after it, and the
peer's users confirm the result on the data (tclang.peers).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from tclang.peers.common import Operator, arrange, outvars, tuple_text, unarrange, unguard
from tclang.peers.terms import In, Lin, Red, factors


@dataclass
class _Window:
    """One windowed dimension of a read: input dim `dim` at stride x out + dilation x
    kernel variable + offset (offset <= 0: padding)."""

    dim: int
    out: str
    kernel: str | None
    stride: int
    dilation: int
    offset: int


def _window(sub: Lin, dim: int, outs: set, kernels: dict) -> _Window | None:
    if any(not isinstance(a, str) for a, _ in sub.terms) or sub.const > 0:
        return None
    o = [(a, c) for a, c in sub.terms if a in outs]
    k = [(a, c) for a, c in sub.terms if a in kernels]
    if len(o) != 1 or len(k) > 1 or len(o) + len(k) != len(sub.terms) or o[0][1] < 1 or \
            (k and k[0][1] < 1) or (not k and o[0][1] == 1 and sub.const == 0):
        return None
    return _Window(dim, o[0][0], k[0][0] if k else None, o[0][1], k[0][1] if k else 1,
                   sub.const)


@dataclass
class _Geometry:
    """The windowed dimensions of one read, as a library wants them: kernel and output
    extents, padding before and after the data, stride, dilation."""

    windows: list
    kernel: list
    outs: list
    left: list
    right: list
    stride: list
    dilation: list

    @property
    def spans(self) -> list:
        return [d * (k - 1) + 1 for d, k in zip(self.dilation, self.kernel)]

    def pairs(self) -> list:
        """(before, after) padding per windowed dimension."""
        return list(zip(self.left, self.right))

    def torch_pad(self) -> list:
        """The padding as torch.nn.functional.pad takes it: last dimension first."""
        return [p for pair in reversed(self.pairs()) for p in pair]

    def crop(self, y):
        """The library's result cut to the definition's output extents."""
        return y[(Ellipsis,) + tuple(slice(0, o) for o in self.outs)]

    def words(self) -> list[str]:
        words = []
        if any(s != 1 for s in self.stride):
            words.append(f"stride {tuple_text(self.stride)}")
        if any(self.left) or any(self.right):
            words.append("padding " + (tuple_text(self.left) if self.left == self.right or
                                       not any(self.right) else
                                       f"{tuple_text(self.left)} before, "
                                       f"{tuple_text(self.right)} after"))
        if any(d != 1 for d in self.dilation):
            words.append(f"dilation {tuple_text(self.dilation)}")
        return words


def _geometry(windows, kernels: dict, x_shape, out, padded: bool) -> _Geometry | None:
    """None where the read would start before its data without a guard (no padding)."""
    kernel = [kernels[w.kernel][1] if w.kernel else 1 for w in windows]
    outs = [out[int(w.out[1:])] for w in windows]
    left = [-w.offset for w in windows]
    if any(left) and not padded:
        return None
    right = []
    for w, k, o in zip(windows, kernel, outs):  # after the data: every window fits
        need = w.stride * (o - 1) + w.dilation * (k - 1) + 1
        right.append(max(0, need - (x_shape[w.dim] - w.offset)))
    return _Geometry(windows, kernel, outs, left, right, [w.stride for w in windows],
                     [w.dilation for w in windows])


def _windows_of(a, g: _Geometry):
    """NumPy: every output position's window of `a` (windowed along its last axes):
    shape (..., *outputs, *kernel)."""
    nd = len(g.windows)
    view = np.lib.stride_tricks.sliding_window_view(a, g.spans, axis=tuple(range(-nd, 0)))
    index = (Ellipsis,) + tuple(slice(0, s * (o - 1) + 1, s) for s, o in zip(g.stride, g.outs)) \
        + tuple(slice(None, None, d) for d in g.dilation)
    return view[index]


# ---- convolution --------------------------------------------------------------------------

@dataclass
class _Roles:
    """Which variable is which in a convolution: each a list of at most one variable,
    except the windows."""

    batch: list
    group: list
    channel: list  # the input channel: summed, read by both
    out_channel: list


def convolution(term, shape, out, order) -> Operator | None:
    """sum over channels and kernel positions of X(windows) x W(plain indices)."""
    if not isinstance(term, Red) or term.op != "+":
        return None
    body, padded = unguard(term.body, 0.0)
    coef, num, den = factors(body)
    if coef != 1 or den or len(num) != 2 or not all(isinstance(f, In) for f in num):
        return None
    kernels = {v: (lo, hi) for v, lo, hi in term.axes}
    plain = [all(s.var() is not None for s in f.subs) for f in num]
    if plain[0] == plain[1] or any(lo != 0 for lo, _ in kernels.values()):
        return None
    w, x = (num[0], num[1]) if plain[0] else (num[1], num[0])
    outs = set(outvars(out))
    windows, x_plain = [], {}
    for dim, s in enumerate(x.subs):
        win = None if s.var() is not None else _window(s, dim, outs, kernels)
        if s.var() is not None:
            x_plain[s.var()] = dim
        elif win is None:
            return None
        else:
            windows.append(win)
    w_plain = {s.var(): dim for dim, s in enumerate(w.subs)}
    roles = _conv_roles(x_plain, w_plain, windows, outs, kernels)
    if x.tensor == w.tensor or len(w_plain) != len(w.subs) or roles is None:
        return None
    g = _geometry(windows, kernels, shape[x.tensor], out, padded)
    if g is None:
        return None
    return _conv_operator(g, roles, x_plain, w_plain, order.index(x.tensor),
                          order.index(w.tensor), shape[x.tensor])


def _conv_roles(x_plain: dict, w_plain: dict, windows, outs: set,
                kernels: dict) -> _Roles | None:
    r = _Roles(batch=[v for v in x_plain if v in outs and v not in w_plain],
               group=[v for v in x_plain if v in outs and v in w_plain],
               channel=[v for v in x_plain if v in kernels and v in w_plain],
               out_channel=[v for v in w_plain if v in outs and v not in x_plain])
    kernel_vars = [win.kernel for win in windows if win.kernel is not None]
    spatial = [win.out for win in windows]
    if any(len(v) > 1 for v in (r.batch, r.group, r.channel, r.out_channel)) or \
            len(set(kernel_vars)) != len(kernel_vars) or \
            len(set(spatial)) != len(spatial) or not 1 <= len(windows) <= 3 or \
            set(w_plain) != set(r.group + r.channel + r.out_channel + kernel_vars) or \
            set(kernels) != set(r.channel + kernel_vars) or \
            set(x_plain) != set(r.batch + r.group + r.channel) or \
            outs != set(r.batch + r.group + r.out_channel + spatial):
        return None
    return r


def _conv_operator(g: _Geometry, r: _Roles, x_plain, w_plain, xi: int, wi: int,
                   x_shape) -> Operator:
    def at(where: dict, role: list):
        return where[role[0]] if role else None

    def out_dim(role: list):
        return int(role[0][1:]) if role else None

    nd = len(g.windows)
    groups = x_shape[x_plain[r.group[0]]] if r.group else 1
    x_dims = [at(x_plain, r.batch), at(x_plain, r.group), at(x_plain, r.channel)] + \
        [win.dim for win in g.windows]
    k_dims = [at(w_plain, r.group), at(w_plain, r.out_channel), at(w_plain, r.channel)] + \
        [w_plain[win.kernel] if win.kernel else None for win in g.windows]
    o_dims = [out_dim(r.batch), out_dim(r.group), out_dim(r.out_channel)] + \
        [int(win.out[1:]) for win in g.windows]

    def prepare(arrays):  # (N, G*C, *S) and (G*M, C, *K), the libraries' layouts
        a = arrange(arrays[xi], x_dims)
        b = arrange(arrays[wi], k_dims)
        return (a.reshape((a.shape[0], a.shape[1] * a.shape[2]) + tuple(a.shape[3:])),
                b.reshape((b.shape[0] * b.shape[1],) + tuple(b.shape[2:])))

    def finish(y):
        y = y.reshape((y.shape[0], groups, y.shape[1] // groups) + tuple(y.shape[2:]))
        return unarrange(g.crop(y), o_dims)

    def numpy(arrays):
        a, b = prepare(arrays)
        return finish(_numpy_conv(np.pad(a, [(0, 0), (0, 0)] + g.pairs()), b, groups, g))

    def torch_call(tensors):
        import torch.nn.functional as F
        a, b = prepare(tensors)
        conv = (F.conv1d, F.conv2d, F.conv3d)[nd - 1]
        return finish(conv(F.pad(a, g.torch_pad()), b, stride=g.stride,
                           dilation=g.dilation, groups=groups))

    words = [f"conv{nd}d"] + g.words() + ([f"{groups} groups"] if groups != 1 else [])
    return Operator(", ".join(words), numpy, "NumPy sliding windows + np.einsum (it has "
                    "no convolution)", torch_call, f"torch.nn.functional.conv{nd}d")


def _numpy_conv(a, b, groups: int, g: _Geometry):
    nd = len(g.outs)
    n, c = a.shape[0], b.shape[1]
    gm, kernel = b.shape[0], tuple(b.shape[2:])
    win = _windows_of(a, g).reshape((n, groups, c) + tuple(g.outs) + kernel)
    wg = b.reshape((groups, gm // groups, c) + kernel)
    o, k = "xyz"[:nd], "uvw"[:nd]
    y = np.einsum(f"ngc{o}{k},gmc{k}->ngm{o}", win, wg, optimize=True)
    return y.reshape((n, gm) + tuple(g.outs))


# ---- pooling ------------------------------------------------------------------------------

def pooling(term, shape, out, order) -> Operator | None:
    """max, or sum times a constant, of one input over windows: max or average pooling
    (any dimensions may be pooled; the others are carried through)."""
    coef, num, den = factors(term)
    red = num[0] if len(num) == 1 and not den else None
    if not isinstance(red, Red) or red.op not in ("max", "+") or \
            (red.op == "max" and coef != 1):
        return None
    body, padded = unguard(red.body, -math.inf if red.op == "max" else 0.0)
    inner, body_num, body_den = factors(body)
    if len(body_num) != 1 or body_den or (red.op == "max" and inner != 1) or \
            not isinstance(body_num[0], In):
        return None
    x, coef = body_num[0], coef * inner
    kernels = {v: (lo, hi) for v, lo, hi in red.axes}
    outs = set(outvars(out))
    windows, plain = [], {}
    for dim, s in enumerate(x.subs):
        win = None if s.var() in outs else _window(s, dim, outs, kernels)
        if s.var() in outs:
            plain[s.var()] = dim
        elif win is None or win.kernel is None:
            return None
        else:
            windows.append(win)
    if not 1 <= len(windows) <= 3 or any(lo != 0 for lo, _ in kernels.values()) or \
            sorted(w.kernel for w in windows) != sorted(kernels) or \
            outs != set(plain) | {w.out for w in windows} or \
            len({w.out for w in windows}) != len(windows):
        return None
    g = _geometry(windows, kernels, shape[x.tensor], out, padded)
    if g is None or (red.op == "+" and any(d != 1 for d in g.dilation)):
        return None  # PyTorch's average pooling has no dilation
    return _pool_operator(g, red.op, coef, plain, order.index(x.tensor), shape[x.tensor])


def _pool_operator(g: _Geometry, op: str, coef: float, plain: dict, xi: int,
                   x_shape) -> Operator:
    nd = len(g.windows)
    lead = sorted(plain.values())  # the dimensions carried through, in the input's order
    o_dims = [int(v[1:]) for v in sorted(plain, key=plain.get)] + \
        [int(w.out[1:]) for w in g.windows]
    fill = -math.inf if op == "max" else 0.0
    scale = coef * math.prod(g.kernel) if op == "+" else 1.0

    def flat(a):  # (1, everything carried through, *pooled)
        a = arrange(a, lead + [w.dim for w in g.windows])
        return a.reshape((1, math.prod(a.shape[:len(lead)])) + tuple(a.shape[len(lead):]))

    def finish(y):
        y = g.crop(y).reshape(tuple(x_shape[d] for d in lead) + tuple(g.outs))
        return unarrange(y, o_dims)

    def numpy(arrays):
        a = np.pad(flat(arrays[xi]), [(0, 0), (0, 0)] + g.pairs(), constant_values=fill)
        axes = tuple(range(-nd, 0))
        win = _windows_of(a, g)
        return finish(win.max(axis=axes) if op == "max" else win.sum(axis=axes) * coef)

    def torch_call(tensors):
        import torch.nn.functional as F
        a = F.pad(flat(tensors[xi]), g.torch_pad(), value=fill)
        if op == "max":
            pool = (F.max_pool1d, F.max_pool2d, F.max_pool3d)[nd - 1]
            return finish(pool(a, g.kernel, g.stride, dilation=g.dilation))
        pool = (F.avg_pool1d, F.avg_pool2d, F.avg_pool3d)[nd - 1]
        y = pool(a, g.kernel, g.stride)
        return finish(y * scale if scale != 1 else y)

    kind = "max" if op == "max" else "avg"
    words = [f"{kind}_pool{nd}d, window {tuple_text(g.kernel)}"]
    if g.stride != g.kernel:  # PyTorch's default stride is the window
        words.append(f"stride {tuple_text(g.stride)}")
    words += [w for w in g.words() if not w.startswith("stride")]
    if scale != 1:
        words.append(f"times {scale:g}")
    return Operator(", ".join(words), numpy,
                    f"NumPy sliding windows + np.{'max' if kind == 'max' else 'sum'}",
                    torch_call, f"torch.nn.functional.{kind}_pool{nd}d")
