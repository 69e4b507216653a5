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
from backends.llvm import types as T
from backends.llvm.values import ValueEmitter
from tclang import program as P


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
    vector = ir.Constant(ir.VectorType(value.type, lanes), None)  # zeroinitializer
    one = builder.insert_element(vector, value, ir.Constant(T.I32, 0))
    return builder.shuffle_vector(one, vector, ir.Constant(ir.VectorType(T.I32, lanes), None))


def _bytes(element: ir.Type) -> int:
    return 8 if element == T.DOUBLE else 4


class VectorValues(ValueEmitter):
    """A ValueEmitter whose values are vectors of `lanes`: `steps` says how far each of
    the statement's indices moves per lane, `strides` the buffers' constant strides."""

    def __init__(self, fn, statement, indices, promoted, lanes: int,
                 steps: dict[str, int], strides):
        super().__init__(fn, statement, indices, promoted)
        self.lanes = lanes
        self.steps = steps
        self.strides = strides

    def emit(self, e: P.Expr) -> ir.Value:
        match e:
            case P.Const():
                scalar = super().emit(e)
                return ir.Constant(ir.VectorType(scalar.type, self.lanes),
                                   [scalar] * self.lanes)
            case P.Call(name=name, args=args):
                values = [self.emit(a) for a in args]
                ty = values[0].type
                suffix = f"v{self.lanes}{'f64' if ty.element == T.DOUBLE else 'f32'}"
                fn = T.intrinsic(self.b.module, f"llvm.{LN.VECTOR_CALLS[name]}.{suffix}",
                                 ty, [ty, ty])
                return self.b.call(fn, values)
        return super().emit(e)

    def read(self, r: P.Read) -> ir.Value:
        subscripts = [self.affine(a) for a in r.affine]
        promotion = self.promoted.get(r.ref)
        pointer = self.fn.element(r.tensor, subscripts, promotion)
        buffer = promotion.buffer if promotion is not None else r.tensor
        if LN.read_step(r, self.steps, self.strides.get(buffer)) == 0:
            return splat(self.b, self.b.load(pointer), self.lanes)
        return load(self.b, pointer, self.lanes)
