"""tclang kernels registered as PyTorch custom operators (`torch.library.custom_op`), so
that `torch.compile` keeps a call as one opaque node of its graph instead of breaking the
graph at it (it cannot trace into a ctypes call).

Each Function gets two operators, named after the definition and a hash of its source
(two sources defining `mm` differently never collide):

    tclang::<name>_<hash>       inputs -> outputs and the saved values (tc.grad's training
                                forward), with a fake implementation that gives the
                                outputs' shapes from the inputs' (symbolic) shapes
    tclang::<name>_grad_<hash>  inputs, saved values, output gradients -> input gradients

and the first has the second as its autograd formula (`register_autograd`), so
AOTAutograd traces the backward as that one call too. Used by tclang.torch.Function while
torch.compile traces; eager calls take the lighter torch.autograd.Function path. Inputs the
definition declares as integers get no gradient (None).
"""

from __future__ import annotations

import hashlib

import torch

from tclang.autodiff import sizes_of
from tclang.dtypes import DType
from tclang.errors import TCGradError
from tclang.lang.program import Definition

_REGISTERED: dict[str, tuple] = {}


def operators(fn) -> tuple:
    """(forward op, number of outputs) for a tclang.torch.Function, registered once. A
    definition without a gradient (integer outputs only, ...) gets the forward alone."""
    try:
        g = fn.gradient
    except TCGradError:
        g = None
    if g is None:
        return _forward_only(fn)
    defn: Definition = fn.definition
    name, digest = _op_name(fn)
    if name in _REGISTERED:
        return _REGISTERED[name]
    names_in = [t.name for t in defn.inputs]
    n_out = len(defn.outputs)
    saved = list(g.plan.saved)
    extra = [s for s in saved if not s.is_output]
    schema = (f"({', '.join(f'Tensor {_arg(x)}' for x in names_in)}) -> "
              f"{_returns(n_out + len(extra))}")

    def forward_impl(*args):
        outputs, values = g.forward(*(a.detach() for a in args))
        return _one_or_tuple(tuple(_tensor(o) for o in outputs) +
                             tuple(_tensor(values[s.name]) for s in extra))

    forward = torch.library.custom_op(f"tclang::{name}", forward_impl, mutates_args=(),
                                      schema=schema)

    @forward.register_fake
    def _(*args):
        sizes = sizes_of(defn, args)
        shapes = [_shape(t.shape, sizes) for t in defn.outputs] + \
            [_shape(s.shape, sizes) for s in extra]
        dtypes = [t.dtype for t in defn.outputs] + [s.dtype for s in extra]
        return _one_or_tuple(tuple(args[0].new_empty(shape, dtype=_torch_dtype(d))
                                   for shape, d in zip(shapes, dtypes)))

    seeds = list(g.plan.seeds)
    grad_schema = (f"({', '.join(f'Tensor {_arg(x)}' for x in names_in)}"
                   f"{''.join(f', Tensor saved_{i}' for i in range(len(saved)))}"
                   f"{''.join(f', Tensor seed_{i}' for i in range(len(seeds)))}) -> "
                   f"{_returns(len(g.wrt))}")

    def backward_impl(*args):
        args = tuple(a.detach() for a in args)
        n = len(names_in)
        ins, values, grads = args[:n], args[n:n + len(saved)], args[n + len(saved):]
        result = g.backward(ins, {s.name: v for s, v in zip(saved, values)}, grads)
        return _one_or_tuple(tuple(_tensor(r) for r in result))

    backward = torch.library.custom_op(f"tclang::{defn.name}_grad_{digest}", backward_impl,
                                       mutates_args=(), schema=grad_schema)

    @backward.register_fake
    def _(*args):
        by_name = dict(zip(names_in, args))
        return _one_or_tuple(tuple(torch.empty_like(by_name[x]) for x in g.wrt))

    def refuse_twice(ctx, *grads):
        """Differentiating the backward operator (create_graph=True through it): refused
        with what works instead, not PyTorch's "no autograd formula was registered"."""
        raise TCGradError(
            f"the custom operator tclang::{defn.name}_grad_{digest} (the backward of "
            f"{defn.name}, for torch.compile) has no gradient of its own: a double backward "
            "through tclang functions runs eagerly",
            hint="call the function outside torch.compile for create_graph=True "
                 "(torch.compile's AOTAutograd does not support double backward either)")

    backward.register_autograd(refuse_twice, setup_context=lambda ctx, inputs, output: None)

    def setup_context(ctx, inputs, output):
        _, values = g.split(_as_tuple(output))
        ctx.save_for_backward(*inputs, *(values[s.name] for s in saved))

    def autograd(ctx, *output_grads):
        tensors = ctx.saved_tensors
        n = len(names_in)
        ins, values = tensors[:n], tensors[n:]
        names = [t.name for t in defn.outputs]
        # (custom ops' gradients are materialized: an unused output's is zeros)
        seed_values = [output_grads[names.index(s)] for s in seeds]
        grads = _as_tuple(backward(*ins, *values, *seed_values))
        by_name = dict(zip(g.wrt, grads))
        return tuple(by_name.get(x) for x in names_in)

    forward.register_autograd(autograd, setup_context=setup_context)
    _REGISTERED[name] = (forward, n_out)
    return _REGISTERED[name]


def _op_name(fn) -> tuple[str, str]:
    """(operator name, digest): the definition's name and a hash of what its code depends
    on besides the arguments: the source, the backend and the options (a cuda Function
    must not find a cpu one's operator)."""
    defn: Definition = fn.definition
    module = fn.kernel.module
    what = "\0".join((defn.source, defn.name, module.backend, repr(module.options.key())))
    digest = hashlib.sha1(what.encode()).hexdigest()[:10]
    return f"{defn.name}_{digest}", digest


def _forward_only(fn) -> tuple:
    defn: Definition = fn.definition
    name, _ = _op_name(fn)
    if name in _REGISTERED:
        return _REGISTERED[name]
    n_out = len(defn.outputs)
    schema = (f"({', '.join(f'Tensor {_arg(t.name)}' for t in defn.inputs)}) -> "
              f"{_returns(n_out)}")

    def impl(*args):
        result = _as_tuple(fn.kernel(*(a.detach() for a in args)))
        return _one_or_tuple(tuple(_tensor(r) for r in result))

    op = torch.library.custom_op(f"tclang::{name}", impl, mutates_args=(), schema=schema)

    @op.register_fake
    def _(*args):
        sizes = sizes_of(defn, args)
        return _one_or_tuple(tuple(args[0].new_empty(_shape(t.shape, sizes),
                                                     dtype=_torch_dtype(t.dtype))
                                   for t in defn.outputs))

    _REGISTERED[name] = (op, n_out)
    return _REGISTERED[name]


def _returns(n: int) -> str:
    """A schema's return type: one Tensor, or a tuple of them."""
    return "Tensor" if n == 1 else f"({', '.join(['Tensor'] * n)})"


def _one_or_tuple(values: tuple):
    return values[0] if len(values) == 1 else values


def _as_tuple(value) -> tuple:
    return value if isinstance(value, tuple) else (value,)


def _arg(name: str) -> str:
    return f"in_{name}"


def _tensor(x):
    return x if isinstance(x, torch.Tensor) else torch.as_tensor(x)


def _shape(shape, sizes) -> tuple:
    return tuple(d.evaluate(sizes) for d in shape)


def _torch_dtype(dtype):
    import numpy as np
    if dtype is DType.BFLOAT16:
        return torch.bfloat16
    return torch.from_numpy(np.zeros(0, dtype.numpy)).dtype
