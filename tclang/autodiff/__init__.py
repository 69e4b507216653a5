"""Gradients of definitions: `tc.grad(kernel, wrt=...)`.

The backward is generated as comprehensions (adjoint.py) and compiled through the same
pipeline as any definition, on the kernel's backend with its options, cached by shape like
any kernel. A gradient runs in two steps, as a training framework runs it:

    outputs, saved = g.forward(*inputs)          # the outputs, and what the backward reads
    grads = g.backward(inputs, saved, output_grads)

and `g(*inputs, *output_grads)` does both. `g.source` is the backward definition, and
`g.forward_source` the forward that also writes the saved values (docs/autodiff.md).
"""

from __future__ import annotations

from tclang.autodiff.adjoint import GradientSource, build
from tclang.boundary import api_boundary
from tclang.errors import TCArgumentError, TCError, TCGradError

__all__ = ["Gradient", "build", "GradientSource", "sizes_of"]


def sizes_of(defn, arrays) -> dict:
    """The size names' values read off the arrays' shapes (numbers, or torch's symbolic
    sizes under torch.compile), without the argument checks a kernel call makes."""
    sizes = {}
    for t, a in zip(defn.inputs, arrays):
        for dim, value in zip(t.shape, getattr(a, "shape", ())):
            if dim.constant is None and str(dim).isidentifier():
                sizes.setdefault(str(dim), value)
    return sizes


def _shape(shape, sizes) -> tuple | None:
    """A shape in the sizes, or None where an argument did not give them all (the
    kernel's own call then says what is wrong)."""
    try:
        return tuple(d.evaluate(sizes) for d in shape)
    except KeyError:
        return None


def _check_type(name: str, want, grad) -> None:
    """An output gradient (a NumPy array) of its output's type: said here, in the caller's
    terms, not as argument k of the generated backward (its other arguments are saved
    values the caller never passed). Other array kinds are checked by the backward's call."""
    import numpy as np

    from tclang.dtypes import from_numpy
    got = from_numpy(grad.dtype) if isinstance(grad, np.ndarray) else None
    if got is not None and got is not want:
        raise TCArgumentError(f"the gradient of output {name} is {got.value}, but {name} is "
                              f"{want.value}", hint=f"tclang never converts silently: pass "
                              f"it as {want.value}, like {name}")


class Gradient:
    """The gradient of one kernel with respect to some of its inputs (see the module doc)."""

    def __init__(self, kernel, wrt=None):
        from tclang.runtime.kernels import Kernel, Module
        if isinstance(kernel, Gradient):
            # the gradient of a gradient is that of its backward definition (a kernel of
            # inputs, saved values and output gradients): second order, and so on
            kernel = kernel.backward_kernel
        if not isinstance(kernel, Kernel):
            raise TypeError(f"tc.grad takes a kernel (a definition of a module: mod.name) or a "
                            f"gradient, not {type(kernel).__name__}")
        self.kernel = kernel
        self.definition = kernel.definition
        self.plan: GradientSource = build(self.definition, wrt)
        module = kernel.module
        from tclang.lang.frontend import check_source

        def kernel_of(text: str, name: str, what: str):
            if text == self.definition.source and name == self.definition.name:
                return kernel
            try:
                program = check_source(text)
            except TCError as err:  # generated text that does not check is tclang's fault:
                # said at the user's definition, never at a line they did not write
                raise TCGradError(f"{what} of {self.definition.name} does not check "
                                  f"({getattr(err, 'message', err)}); please report it "
                                  "with the definition", self.definition.span,
                                  self.definition.source) from None
            return Module(program, module.backend, module.options)[name]

        self._forward = kernel_of(self.plan.forward, self.plan.forward_name,
                                  "the training forward")
        self._backward = kernel_of(self.plan.backward, self.plan.backward_name,
                                   "the backward")

    @property
    def backward_kernel(self):
        """The backward definition as a kernel: inputs, saved values (`saved`'s order),
        output gradients -> the gradients of `wrt`. `tc.grad(g)` differentiates it."""
        return self._backward

    @property
    def wrt(self) -> tuple[str, ...]:
        return self.plan.wrt

    @property
    def source(self) -> str:
        """The backward definition, as text the language accepts."""
        return self.plan.backward

    @property
    def forward_source(self) -> str:
        """The forward that also writes the values the backward reads (the kernel's own
        source when its outputs are all it needs)."""
        return self.plan.forward

    @property
    def output_names(self) -> tuple[str, ...]:
        """The outputs whose gradients the backward takes, in order."""
        return self.plan.seeds

    def forward(self, *inputs):
        """(outputs as a tuple, saved values by name): run the forward for training."""
        results = self._forward(*inputs)
        return self.split(results if isinstance(results, tuple) else (results,))

    def split(self, results: tuple):
        """The training forward's results as (outputs, saved values by name)."""
        names = [t.name for t in self.definition.outputs]
        outputs, extras = results[:len(names)], iter(results[len(names):])
        saved = {s.name: outputs[names.index(s.name)] if s.is_output else next(extras)
                 for s in self.plan.saved}
        return outputs, saved

    def backward(self, inputs: tuple, saved: dict, output_grads: tuple):
        """The gradients of `wrt` (a tuple, in wrt's order), given the output gradients
        in `output_names` order. Their shapes are checked here; everything else by the
        backward kernel's own call."""
        if len(output_grads) != len(self.plan.seeds):
            raise TCArgumentError(
                f"the gradient of {self.definition.name} takes {len(self.plan.seeds)} output "
                f"gradient{'s' if len(self.plan.seeds) != 1 else ''} "
                f"({', '.join(self.plan.seeds)}), but {len(output_grads)} "
                f"{'was' if len(output_grads) == 1 else 'were'} given")
        sizes = sizes_of(self.definition, inputs)
        outputs = {t.name: t for t in self.definition.outputs}
        for name, grad in zip(self.plan.seeds, output_grads):
            want = _shape(outputs[name].shape, sizes)
            got = tuple(getattr(grad, "shape", ()))
            if want is not None and got != want:
                raise TCArgumentError(f"the gradient of output {name} has shape {got}, but "
                                      f"{name} has shape {want}",
                                      hint="pass one gradient per output, shaped like it")
            _check_type(name, outputs[name].dtype, grad)
        values = [saved[s.name] for s in self.plan.saved]
        grads = self._backward(*inputs, *values, *output_grads)
        return grads if isinstance(grads, tuple) else (grads,)

    @api_boundary
    def __call__(self, *args):
        n = len(self.definition.inputs)
        inputs, output_grads = args[:n], args[n:]
        _, saved = self.forward(*inputs)
        grads = self.backward(inputs, saved, output_grads)
        return grads[0] if len(grads) == 1 else grads

    def __repr__(self) -> str:
        return f"<Gradient of {self.definition.name} with respect to {', '.join(self.wrt)}>"
