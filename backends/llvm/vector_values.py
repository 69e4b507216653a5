"""Statement values on vector lanes: one statement of a lane loop (backends/llvm/lanes.py)
at all its iterations at once.

Each read is either one element for every lane (loaded once, broadcast) or consecutive
elements (one vector load); constants are splat; arithmetic and the builtins lanes.py
admits are LLVM's operations and intrinsics on vectors. Loads and stores of vectors carry
the element's alignment: a row of the tile starts anywhere in its tensor.
"""

from __future__ import annotations

import llvmlite.ir as ir

from backends.llvm import lanes as LN
from backends.llvm.accumulators import affine_form
from backends.llvm import types as T
from backends.llvm.values import ValueEmitter
from polyhedral import loop_ir as L
from tclang.lang import program as P


def vector_pointer(builder: ir.IRBuilder, pointer: ir.Value, lanes: int) -> ir.Value:
    return builder.bitcast(pointer, ir.VectorType(pointer.type.pointee, lanes).as_pointer())


def load(builder: ir.IRBuilder, pointer: ir.Value, lanes: int) -> ir.Value:
    """`lanes` consecutive elements from `pointer` (an element's address) on."""
    element = pointer.type.pointee
    return builder.load(vector_pointer(builder, pointer, lanes), align=_bytes(element))


def store(builder: ir.IRBuilder, value: ir.Value, pointer: ir.Value) -> None:
    element = pointer.type.pointee
    builder.store(value, vector_pointer(builder, pointer, value.type.count),
                  align=_bytes(element))


def splat(builder: ir.IRBuilder, value: ir.Value, lanes: int) -> ir.Value:
    vector = _Printed(ir.VectorType(value.type, lanes), None, "poison")
    one = builder.insert_element(vector, value, ir.Constant(T.I32, 0))
    zeros = _Printed(ir.VectorType(T.I32, lanes), [ir.Constant(T.I32, 0)] * lanes,
                     "zeroinitializer")
    return builder.shuffle_vector(one, vector, zeros)


class _Printed(ir.Constant):
    """A vector constant printed as `text` (llvmlite would print every lane); `lanes`
    for llvmlite's checks of a shuffle's mask."""

    def __init__(self, typ, lanes, text: str):
        super().__init__(typ, lanes)
        self.text = text

    def _get_reference(self):
        return self.text


def _bytes(element: ir.Type) -> int:
    return 8 if element == T.DOUBLE else 4


class VectorValues(ValueEmitter):
    """A ValueEmitter whose values are vectors of `lanes`: `steps` says how far each of
    the statement's indices moves per lane, `strides` the buffers' constant strides."""

    def __init__(self, fn, statement, indices, promoted, lanes: int,
                 steps: dict[str, int], strides, index_exprs: dict[str, L.IExpr]):
        super().__init__(fn, statement, indices, promoted)
        self.lanes = lanes
        self.steps = steps
        self.strides = strides
        self.index_exprs = index_exprs  # the statement's indices as loop-IR expressions

    def emit(self, e: P.Expr) -> ir.Value:
        match e:
            case P.Const():
                scalar = super().emit(e)
                vector = ir.VectorType(scalar.type, self.lanes)
                if scalar.constant == 0 and str(scalar.constant)[0] != "-":  # not -0.0
                    return _Printed(vector, [scalar] * self.lanes, "zeroinitializer")
                return ir.Constant(vector, [scalar] * self.lanes)
            case P.Call(name=name, args=args):
                values = [self.emit(a) for a in args]
                ty = values[0].type
                suffix = f"v{self.lanes}{'f64' if ty.element == T.DOUBLE else 'f32'}"
                fn = T.intrinsic(self.b.module, f"llvm.{LN.VECTOR_CALLS[name]}.{suffix}",
                                 ty, [ty, ty])
                return self.b.call(fn, values)
        return super().emit(e)

    def read(self, r: P.Read) -> ir.Value:
        promotion = self.promoted.get(r.ref)
        buffer = promotion.buffer if promotion is not None else r.tensor
        pointer = self._address(r, promotion, buffer)
        if pointer is None:  # lanes.py admits no gather: every subscript is an expression
            subscripts = [self.subscript(a) for a in r.affine]
            pointer = self.fn.element(r.tensor, subscripts, promotion)
        if LN.read_step(r, self.steps, self.strides.get(buffer)) == 0:
            return splat(self.b, self.b.load(pointer), self.lanes)
        return load(self.b, pointer, self.lanes)

    def _address(self, r: P.Read, promotion, buffer: str) -> ir.Value | None:
        """The address of the read's first lane, or None where a subscript is not linear
        (then ValueEmitter's way)."""
        if self.fn.km.specialized is None or any(a is None for a in r.affine):
            return None  # (register tiles are only in specialized kernels)
        at = {L.index_var(name).name: e for name, e in self.index_exprs.items()}
        subscripts = [L.substitute(a, at) for a in r.affine]
        return address(self.fn, buffer, subscripts, promotion)  # None unless all affine


def address(fn, buffer: str, subscripts: list[L.IExpr], promotion) -> ir.Value | None:
    """The address of buffer[subscripts] (less the promotion's offset), its element offset
    one linear expression of the loops in canonical form, emitted through the function's
    per-block memo (`index`): the rows of a tile share most of it, which LLVM would
    otherwise have to find again among thousands of instructions. None where a stride is
    not a constant or an expression not affine."""
    base, _, strides = fn.buffers[buffer]
    if any(not isinstance(x, ir.Constant) for x in strides):
        return None
    terms: dict[str, int] = {}
    constant = 0
    for k, (subscript, stride) in enumerate(zip(subscripts, strides)):
        if promotion is not None:
            subscript = L.sub(subscript, promotion.offset[k])
        form = affine_form(subscript)
        if form is None:
            return None
        for name, coef in form[0]:
            terms[name] = terms.get(name, 0) + coef * stride.constant
        constant += form[1] * stride.constant
    offset: L.IExpr = L.Int(constant)
    for name, coef in sorted(terms.items()):
        if coef:
            term = L.Var(name) if coef == 1 else L.Op("mul", (L.Int(coef), L.Var(name)))
            offset = term if offset == L.Int(0) else L.Op("add", (offset, term))
    return fn.builder.gep(base, [fn.index(offset)], inbounds=True)
