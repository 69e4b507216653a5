"""Library operators that compute what a definition computes, recognised from its structure.

`tclang compare` times a kernel beside its peers and `tclang run` checks it against NumPy;
both need to know what the kernel computes in a library's terms. A definition's *name*
proves nothing (`def conv2d` may be anything), so `recognise(definition, sizes)` reads the
checked program instead:

1. Every statement's value is written as a term in the inputs alone (`Term`): temporaries
   and earlier values of a tensor are inlined where they are read, reductions become
   `Red` nodes over fresh variables, sizes become numbers (recognition is for one set of
   sizes), casts are dropped. Index names, temporaries, statement splits and the order of
   factors stop mattering: `rowmax`, `rowsum` and `Y` of a softmax, or the same softmax
   written in one line with `1 / sum` multiplied in, give one term.
2. Products and quotients are flattened (`Prod`: a constant times factors over factors),
   factors that do not move along a sum's variables are taken out of it, `rsqrt(x)` is
   `1 / sqrt(x)`, `pow(x, 2)` is `x * x`.
3. Matchers look for each operator's shape in that term: an einsum (one product of plain
   reads), a convolution (stride, padding, dilation, groups, any layout), pooling (max or
   average), cumsum, softmax, layer normalization, attention (with or without a causal
   mask). Each derives its parameters (stride, axis, scale, epsilon) from the term.

An `Operator` carries the NumPy and PyTorch calls that compute the definition's output from
its inputs, and says what they are. Recognition can be wrong where a term only looks like
an operator (a layer norm's skeleton with another formula inside), so whoever uses a peer
confirms it on the data: `tclang compare` times a peer only if its result matches the
automatic schedule's, and the checks (`tclang.tools.checking`) fall back to the reference
interpreter where NumPy disagrees.
"""

from __future__ import annotations

from tclang.lang import program as P
from tclang.peers.common import Operator
from tclang.peers.terms import NoMatch, output_term

__all__ = ["Operator", "recognise"]


def recognise(defn: P.Definition, sizes: dict) -> Operator | None:
    """The library operator `defn` computes for `sizes`, from its structure; None if it
    is none that tclang knows, or has no single floating-point output."""
    if len(defn.outputs) != 1 or not defn.outputs[0].dtype.is_float or \
            not all(t.dtype.is_float for t in defn.inputs):
        return None
    term = output_term(defn, sizes)
    if term is None:
        return None
    shape = {t.name: P.evaluate_shape(t.shape, sizes) for t in defn.inputs}
    out = P.evaluate_shape(defn.outputs[0].shape, sizes)
    order = [t.name for t in defn.inputs]
    from tclang.peers.axis_ops import attention, cumsum, layernorm, softmax
    from tclang.peers.contractions import einsum, with_bias
    from tclang.peers.windows import convolution, pooling
    for match in (einsum, convolution, pooling, cumsum, softmax, layernorm, attention,
                  with_bias):
        try:
            found = match(term, shape, out, order)
        except NoMatch:
            found = None
        if found is not None:
            return found
    return None
