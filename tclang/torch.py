"""tclang kernels as PyTorch operations with autograd.

    import tclang.torch as tct
    linear = tct.function(src, "linear")          # a callable on tensors, differentiable
    y = linear(x, w, b); y.sum().backward()       # the backward runs generated kernels

    layer = tct.Module(src, "linear", w=torch.randn(o, i), b=torch.zeros(o))
    y = layer(x)                                  # w and b are the layer's nn.Parameters

A call whose inputs require grad runs the forward that also writes what the backward
reads (`tc.grad`'s saved values, kept by autograd like PyTorch's own saved activations),
and the backward is `tc.grad`'s generated definition, compiled and cached like any kernel.
That backward runs as a tclang Function itself, so with `create_graph=True` autograd records
it and the second derivative is the gradient of the backward definition (and so on, to any
order); where tc.grad refuses a backward definition, differentiating through it raises
that refusal, as PyTorch's once_differentiable functions do.
Tensors go in without a copy (CPU tensors through NumPy views of their memory; CUDA
tensors with backend="cuda"). PyTorch is an optional extra: importing this module needs
it, `import tclang` does not (docs/autodiff.md).
"""

from __future__ import annotations

import torch

import tclang
from tclang.autodiff import Gradient
from tclang.errors import TCGradError, TCZeroGradientError

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
        self._refused: TCGradError | None = None  # why tc.grad refused, once asked
        self._operator = None  # (custom op, outputs): for torch.compile, made on first use
        # Functions of the backward definition and of the training forward (made on first
        # use): what makes the backward differentiable (_Apply.backward)
        self._backward_fn: Function | None = None
        self._saving_fn: Function | None = None

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
        """The gradient with respect to every floating-point input (made on first use). A
        refusal is kept too: torch's gradgradcheck runs the backward once per perturbed
        input, and a backward of 224 KB took tc.grad 5 s to refuse, each time (fuzz seed
        2032, program 369: minutes, reported as a hang)."""
        if self._refused is not None:
            raise self._refused.with_traceback(None)
        if self._gradient is None:
            try:
                self._gradient = Gradient(self.kernel)
            except TCGradError as err:
                self._refused = err
                raise
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
        outputs = _apply(self, inputs)[:len(self.definition.outputs)]
        return outputs[0] if len(outputs) == 1 else outputs

    @property
    def backward_function(self) -> "Function":
        """The backward definition (`self.gradient.source`) as a Function: what the
        backward runs, differentiable in its turn."""
        if self._backward_fn is None:
            self._backward_fn = Function(self.gradient._backward)
        return self._backward_fn

    @property
    def saving_function(self) -> "Function":
        """The training forward (outputs, then the values the backward reads) as a
        Function: its gradient takes the saved values' gradients too (double backward)."""
        if self._saving_fn is None:
            self._saving_fn = self if self.gradient._forward is self.kernel else \
                Function(self.gradient._forward)
        return self._saving_fn

    def __repr__(self) -> str:
        return f"<tclang.torch.Function {self.definition.signature()}>"


def _recording(inputs) -> bool:
    """Whether autograd records a call on these inputs."""
    return torch.is_grad_enabled() and any(isinstance(x, torch.Tensor) and x.requires_grad
                                           for x in inputs)


def _results(g: Gradient, outputs, saved: dict) -> tuple:
    """A training forward's results in its definition's order: the outputs, then the
    saved values that are not outputs."""
    return tuple(outputs) + tuple(saved[s.name] for s in g.plan.saved if not s.is_output)


def _apply(fn: Function, inputs) -> tuple:
    """Every result of fn's training forward (its outputs, then the values its backward
    reads), recorded by autograd when an input requires grad; else the kernel's outputs."""
    if _recording(inputs):
        return _Apply.apply(fn, *inputs)
    outputs = fn.kernel(*(x.detach() if isinstance(x, torch.Tensor) else x for x in inputs))
    return outputs if isinstance(outputs, tuple) else (outputs,)


def _differentiate(fn: Function, parent: Function, args) -> tuple:
    """Run fn (a backward definition) on args, differentiably where autograd records
    (create_graph=True). When tc.grad refuses fn's definition, the result is recorded by
    _Refused instead: differentiating it again raises that refusal, never a silent zero."""
    if _recording(args):
        try:
            fn.gradient
        except TCZeroGradientError:
            # its outputs depend on none of its float inputs: constants, whose derivative
            # is the zero autograd gives them (seed 2030, program 672 of the fuzzer)
            return _apply(fn, tuple(x.detach() if isinstance(x, torch.Tensor) else x
                                    for x in args))[:len(fn.definition.outputs)]
        except TCGradError as err:
            return _Refused.apply(fn, parent, err, *args)
    return _apply(fn, args)[:len(fn.definition.outputs)]


class _Apply(torch.autograd.Function):
    """One call of fn's training forward. Its results are the outputs and then the saved
    values (the caller sees the outputs): the backward reads both, and a double backward
    sends gradients to both, so both must be outputs of this node."""

    @staticmethod
    def forward(ctx, fn: Function, *inputs):
        g = fn.gradient
        outputs, saved = g.forward(*(x.detach() for x in inputs))
        results = _results(g, outputs, saved)
        ctx.fn = fn
        # the inputs as given and the results as returned: in a double backward they are
        # what connects the backward's own graph to this one
        ctx.save_for_backward(*inputs, *results)
        ctx.set_materialize_grads(False)  # None: a result the loss does not use
        ctx.mark_non_differentiable(*(r for r in results if not r.is_floating_point()))
        return results

    @staticmethod
    def backward(ctx, *grads):
        fn: Function = ctx.fn
        g = fn.gradient
        n = len(fn.definition.inputs)
        tensors = ctx.saved_tensors
        inputs, results = tensors[:n], tensors[n:]
        n_out = len(fn.definition.outputs)
        if all(d is None for d in grads[n_out:]):
            # (the first derivative: nothing reads the saved values but the backward)
            seeds = _seeds(g, fn.definition.outputs, results, grads)
            _, saved = g.split(results)
            args = (*inputs, *(saved[s.name] for s in g.plan.saved), *seeds)
            by_name = dict(zip(g.wrt, _differentiate(fn.backward_function, fn, args)))
            by_name.update(dict.fromkeys(g.plan.zero))  # (below)
        else:
            # a double backward also sends gradients to the saved values: the gradient of
            # the training forward (its outputs and saved values alike) gives theirs
            by_name = _saving_gradient(fn, inputs, results, grads)
        # a gradient zero by construction is None, autograd's zero: where it is the
        # gradient of a saved value (a double backward), the forward's gradient is then
        # not asked for that value, which may be refused (a value read only in a condition
        # and computed through int32(...): fuzz seed 2040, program 1593)
        return (None, *(by_name.get(t.name) if need else None
                        for t, need in zip(fn.definition.inputs, ctx.needs_input_grad[1:])))


def _seeds(g: Gradient, outputs, results, grads) -> list:
    """The output gradients g's backward takes, zeros where autograd gave none."""
    names = [t.name for t in outputs]
    seeds = []
    for name in g.output_names:
        k = names.index(name)
        seeds.append(grads[k] if grads[k] is not None else torch.zeros_like(results[k]))
    return seeds


def _saving_gradient(fn: Function, inputs, results, grads) -> dict:
    """The input gradients given gradients of every result of fn's training forward, by
    input name: the backward of that forward's own definition (tc.grad of it), run
    differentiably like any backward."""
    saving = fn.saving_function
    g2 = saving.gradient
    definition = saving.definition
    if all(s.is_output for s in g2.plan.saved):
        found = dict(zip((t.name for t in definition.outputs), results))
        saved = [found[s.name] for s in g2.plan.saved]
    else:  # it reads values the first forward did not keep: its own training forward
        if _recording(inputs):
            results2 = _Apply.apply(saving, *inputs)
        else:
            outputs, values = g2.forward(*(x.detach() for x in inputs))
            results2 = _results(g2, outputs, values)
        _, values = g2.split(results2)
        saved = [values[s.name] for s in g2.plan.saved]
    seeds = _seeds(g2, definition.outputs, results, grads)
    args = (*inputs, *saved, *seeds)
    by_name = dict(zip(g2.wrt, _differentiate(saving.backward_function, saving, args)))
    by_name.update(dict.fromkeys(g2.plan.zero))
    return by_name


class _Refused(torch.autograd.Function):
    """A backward definition that tc.grad cannot differentiate, run and recorded so that
    differentiating it (a double backward) raises tc.grad's refusal: PyTorch's
    once_differentiable behaviour, with the reason."""

    @staticmethod
    def forward(ctx, fn: Function, parent: Function, error: TCGradError, *args):
        ctx.error = TCGradError(
            f"the backward of {parent.definition.name} ({fn.definition.name}, recorded by "
            f"create_graph=True) has no gradient: {error.message}", error.span,
            error.source, hint="differentiate it once (without create_graph=True through "
                               "it), or write the operation with differentiable builtins")
        results = fn.kernel(*(x.detach() for x in args))
        return results if isinstance(results, tuple) else (results,)

    @staticmethod
    def backward(ctx, *grads):
        raise ctx.error


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
