"""tclang kernels as PyTorch operations with autograd.

    import tclang.torch as tct
    linear = tct.function(src, "linear")          # a callable on tensors, differentiable
    y = linear(x, w, b); y.sum().backward()       # the backward runs generated kernels

    layer = tct.Module(src, "linear", w=torch.randn(o, i), b=torch.zeros(o))
    y = layer(x)                                  # w and b are the layer's nn.Parameters

A call whose inputs require grad runs the forward that also writes what the backward
reads (`tc.grad`'s saved values, kept by autograd like PyTorch's own saved activations),
and the backward is `tc.grad`'s generated definition, compiled and cached like any kernel.
Tensors go in without a copy (CPU tensors through NumPy views of their memory; CUDA
tensors with backend="cuda"). PyTorch is an optional extra: importing this module needs
it, `import tclang` does not (docs/autodiff.md).
"""

from __future__ import annotations

import torch

import tclang
from tclang.autodiff import Gradient

__all__ = ["function", "Function", "Module"]


def function(source: str, entry: str, backend: str = "cpu", options=None) -> "Function":
    """The definition `entry` of `source` as a differentiable function of tensors (also
    inside torch.compile, as a custom operator)."""
    fn = Function(tclang.define(source, backend, options)[entry])
    fn.custom_op()
    return fn


class Function:
    """A kernel callable on tensors, recording a gradient when an input requires one."""

    def __init__(self, kernel):
        self.kernel = kernel
        self.definition = kernel.definition
        self._gradient: Gradient | None = None
        self._operator = None  # (custom op, outputs): for torch.compile, made on first use

    def custom_op(self):
        """The kernel as a torch.library custom operator with its gradient registered
        (tclang/torch_ops.py); call this before torch.compile traces a model (Module does
        it when made): building it is Python that Dynamo cannot trace."""
        if self._operator is None:
            from tclang.torch_ops import operators
            self._operator = operators(self)
        return self._operator[0]

    @property
    def gradient(self) -> Gradient:
        """The gradient with respect to every floating-point input (made on first use)."""
        if self._gradient is None:
            self._gradient = Gradient(self.kernel)
        return self._gradient

    def __call__(self, *inputs):
        if torch.compiler.is_compiling():  # one opaque node of the graph (tclang/torch_ops.py)
            if self._operator is None:
                raise tclang.TCError(
                    f"{self.definition.name} was first called inside torch.compile: call "
                    f"its .custom_op() once before compiling (tclang.torch.function and "
                    f"Module do it)")
            op, n = self._operator
            outputs = op(*inputs)
            outputs = outputs[:n] if isinstance(outputs, tuple) else (outputs,)
            return outputs[0] if n == 1 else tuple(outputs)
        if torch.is_grad_enabled() and any(isinstance(x, torch.Tensor) and x.requires_grad
                                           for x in inputs):
            outputs = _Apply.apply(self, *inputs)
            return outputs[0] if len(outputs) == 1 else outputs
        return self.kernel(*(x.detach() if isinstance(x, torch.Tensor) else x
                             for x in inputs))

    def __repr__(self) -> str:
        return f"<tclang.torch.Function {self.definition.signature()}>"


class _Apply(torch.autograd.Function):
    @staticmethod
    def forward(ctx, fn: Function, *inputs):
        g = fn.gradient
        detached = tuple(x.detach() for x in inputs)
        outputs, saved = g.forward(*detached)
        ctx.fn = fn
        ctx.saved_names = tuple(saved)
        ctx.save_for_backward(*detached, *saved.values())
        for out, t in zip(outputs, fn.definition.outputs):
            if not t.dtype.is_float:
                ctx.mark_non_differentiable(out)
        return tuple(outputs)

    @staticmethod
    def backward(ctx, *output_grads):
        fn: Function = ctx.fn
        g = fn.gradient
        n = len(fn.definition.inputs)
        tensors = tuple(t.detach() for t in ctx.saved_tensors)  # outputs come back tracked
        inputs, saved = tensors[:n], dict(zip(ctx.saved_names, tensors[n:]))
        names = [t.name for t in fn.definition.outputs]
        # (autograd materializes the gradient of an output the loss does not use: zeros)
        seeds = [output_grads[names.index(name)].detach() for name in g.output_names]
        grads = g.backward(inputs, saved, tuple(seeds))
        by_name = dict(zip(g.wrt, grads))
        needed = ctx.needs_input_grad[1:]
        result = [by_name.get(t.name) if need else None
                  for t, need in zip(fn.definition.inputs, needed)]
        return (None, *result)


class Module(torch.nn.Module):
    """A layer: the definition's inputs named in `parameters` are the layer's
    `nn.Parameter`s; the others are the arguments of `forward`, in definition order."""

    def __init__(self, source: str, entry: str, backend: str = "cpu", options=None,
                 **parameters: torch.Tensor):
        super().__init__()
        self.fn = function(source, entry, backend, options)
        names = [t.name for t in self.fn.definition.inputs]
        unknown = set(parameters) - set(names)
        if unknown:
            raise tclang.TCError(f"{entry} has no input named {', '.join(sorted(unknown))}; "
                                 f"its inputs are {', '.join(names)}")
        self._order = names
        self._parameter_names = tuple(parameters)
        for name, value in parameters.items():
            self.register_parameter(name, torch.nn.Parameter(value))

    def forward(self, *inputs):
        given = iter(inputs)
        args = []
        for name in self._order:
            args.append(getattr(self, name) if name in self._parameter_names else next(given))
        return self.fn(*args)
