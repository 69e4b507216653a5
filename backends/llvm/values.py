"""Statement bodies -> LLVM values: one emitter per node of the typed expression tree.

Every operand already has its operation's type (the checker made casts explicit), so
emission is direct. Integer `/` and `%` follow Python (floor, divisor's sign), with 0 for a
zero divisor; float `%` too. `?:` branches that may read memory are real branches (a
guarded read is only evaluated under its condition); cheap ones become `select`.
Subscripts with an affine form are computed from its index expression in 64-bit
arithmetic; a data-dependent subscript (a gather) is bounds-checked before the load.
"""

from __future__ import annotations

import llvmlite.ir as ir

from backends.llvm import types as T
from polyhedral import loop_ir as L
from tclang.lang import program as P
from tclang.dtypes import DType

_FCMP = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}


class ValueEmitter:
    """Emits one statement's value at one instance; `fn` is the function being built."""

    def __init__(self, fn, statement: L.StatementDef, indices: dict[str, ir.Value],
                 promoted: dict[int, L.Promotion]):
        self.fn = fn
        self.b: ir.IRBuilder = fn.builder
        self.statement = statement
        self.indices = indices  # index name -> i64
        self.promoted = promoted
        self.locals: dict[str, ir.Value] = {}  # what the enclosing lets bound

    def emit(self, e: P.Expr) -> ir.Value:
        match e:
            case P.Const(value=v, dtype=dt):
                return T.constant(v, dt)
            case P.IndexValue(name=n, dtype=dt):
                return T.convert(self.b, self.indices[n], DType.INT64, dt)
            case P.SizeValue(name=n, dtype=dt):
                return T.convert(self.b, self.fn.size(n), DType.INT64, dt)
            case P.Read():
                return self.read(e)
            case P.Unary(op="neg", operand=x, dtype=dt):
                v = self.emit(x)
                return self.b.fneg(v) if dt.is_float else self.b.neg(v)
            case P.Unary(op="not", operand=x):
                return self.b.xor(self.emit(x), ir.Constant(T.I1, 1))
            case P.Binary(op="and", lhs=a, rhs=c):
                return self.b.and_(self.emit(a), self.emit(c))
            case P.Binary(op="or", lhs=a, rhs=c):
                return self.b.or_(self.emit(a), self.emit(c))
            case P.Binary(op=op, lhs=a, rhs=c, dtype=dt):
                return self.arith(op, self.emit(a), self.emit(c), dt)
            case P.Compare(op=op, lhs=a, rhs=c):
                return self.compare(op, self.emit(a), self.emit(c), a.dtype)
            case P.Select():
                return self.select(e)
            case P.Call(name=n, args=args, dtype=dt):
                from backends.llvm import mathlib
                values = [self.emit(a) for a in args]
                return mathlib.emit_builtin(self.b, n, values, dt.compute.value)
            case P.Cast(operand=x, dtype=dt):
                return T.convert(self.b, self.emit(x), x.dtype, dt)
            case P.Let(name=n, value=v, body=body):  # v is unconditional: it dominates body
                self.locals[n] = self.emit(v)
                return self.emit(body)
            case P.Local(name=n):
                return self.locals[n]
        raise TypeError(f"cannot emit {e!r}")

    # ---- memory ----
    def read(self, r: P.Read) -> ir.Value:
        subscripts = []
        for sub, form in zip(r.subscripts, r.affine):
            if form is not None:
                subscripts.append(self.subscript(form))
            else:
                subscripts.append(T.convert(self.b, self.emit(sub), sub.dtype, DType.INT64))
        promotion = self.promoted.get(r.ref)
        checked = [d for d, a in enumerate(r.affine) if a is None or self.fn.check_bounds]
        if promotion is None or promotion.buffer != r.tensor:  # else a contracted slice's
            self.fn.check_element(r.tensor, subscripts, checked, self.statement)
        pointer = self.fn.element(r.tensor, subscripts, promotion)
        return T.load(self.b, pointer, self.fn.dtype_of(r.tensor))

    def subscript(self, e: L.IExpr) -> ir.Value:
        """A subscript's index expression at this instance: the statement's index variables
        are this instance's values (never in the function's per-block memo, which another
        instance in the same block would share); what uses none of them is the function's.
        Its sums and products carry no `nsw`, as subscripts always did: with it, LLVM's O3
        reshapes the bounds-checked and shape-generic code around them."""
        match e:
            case L.Var(name=n) if (index := L.index_name(n)) is not None:
                return self.indices[index]
            case L.Op() if _per_instance(e):
                return self.fn.emit_op(e, self.subscript, wrap=())
        return self.fn.index(e)

    # ---- arithmetic ----
    def arith(self, op: str, a: ir.Value, c: ir.Value, dtype: DType) -> ir.Value:
        b = self.b
        if dtype.is_float:
            # `contract`: a product feeding a sum may become one FMA (one rounding instead
            # of two); `arcp`: a division by a value the loop does not change may become a
            # product with its reciprocal, computed once (softmax's division by the row's
            # sum: two roundings, within 1 ulp of the correctly rounded quotient; vdivps
            # costs ~10 vmulps); both off with reorder_reductions=False, which promises
            # bitwise results
            flags = ("contract",) if self.fn.km.reassociate else ()
            division = ("contract", "arcp") if self.fn.km.reassociate else ()
            match op:
                case "add":
                    return b.fadd(a, c, flags=flags)
                case "sub":
                    return b.fsub(a, c, flags=flags)
                case "mul":
                    return b.fmul(a, c, flags=flags)
                case "div":
                    return b.fdiv(a, c, flags=division)
                case "mod":
                    return self.float_mod(a, c)
        match op:
            case "add":
                return b.add(a, c)
            case "sub":
                return b.sub(a, c)
            case "mul":
                return b.mul(a, c)
            case "div":
                return self.int_div(a, c, dtype)
            case "mod":
                return self.int_mod(a, c, dtype)
        raise ValueError(op)

    def int_div(self, a, c, dtype: DType) -> ir.Value:
        """Floor division; 0 for a zero divisor; x / -1 is -x (no overflow trap)."""
        b = self.b
        zero, one = ir.Constant(a.type, 0), ir.Constant(a.type, 1)
        is_zero = b.icmp_unsigned("==", c, zero)
        safe = b.select(is_zero, one, c)
        if not dtype.is_signed:
            return b.select(is_zero, zero, b.udiv(a, safe))
        minus_one = b.icmp_signed("==", safe, ir.Constant(a.type, -1))
        safe = b.select(minus_one, one, safe)
        q = b.sdiv(a, safe)
        r = b.srem(a, safe)
        adjust = b.and_(b.icmp_signed("!=", r, zero),
                        b.icmp_signed("<", b.xor(r, safe), zero))
        q = b.sub(q, b.zext(adjust, a.type))
        q = b.select(minus_one, b.neg(a), q)
        return b.select(is_zero, zero, q)

    def int_mod(self, a, c, dtype: DType) -> ir.Value:
        """Remainder with the divisor's sign; 0 for a zero divisor."""
        b = self.b
        zero, one = ir.Constant(a.type, 0), ir.Constant(a.type, 1)
        is_zero = b.icmp_unsigned("==", c, zero)
        safe = b.select(is_zero, one, c)
        if not dtype.is_signed:
            return b.select(is_zero, zero, b.urem(a, safe))
        minus_one = b.icmp_signed("==", safe, ir.Constant(a.type, -1))
        safe = b.select(minus_one, one, safe)
        r = b.srem(a, safe)
        fix = b.and_(b.icmp_signed("!=", r, zero), b.icmp_signed("<", b.xor(r, safe), zero))
        r = b.select(fix, b.add(r, safe), r)
        return b.select(b.or_(is_zero, minus_one), zero, r)

    def float_mod(self, a, c) -> ir.Value:
        b = self.b
        zero = ir.Constant(a.type, 0.0)
        r = b.frem(a, c)
        fix = b.and_(b.fcmp_ordered("!=", r, zero),
                     b.xor(b.fcmp_ordered("<", r, zero), b.fcmp_ordered("<", c, zero)))
        r = b.select(fix, b.fadd(r, c), r)
        # a zero result takes the divisor's sign, as in Python (-0.0 % 2 is 0.0)
        sfx = "f32" if a.type == ir.FloatType() else "f64"
        copysign = T.intrinsic(b.module, f"llvm.copysign.{sfx}", a.type, [a.type, a.type])
        return b.select(b.fcmp_ordered("==", r, zero), b.call(copysign, [zero, c]), r)

    def compare(self, op: str, a, c, dtype: DType) -> ir.Value:
        if dtype.is_float:
            if op == "ne":
                return self.b.fcmp_unordered("!=", a, c)
            return self.b.fcmp_ordered(_FCMP[op], a, c)
        if dtype.is_signed:
            return self.b.icmp_signed(_FCMP[op], a, c)
        return self.b.icmp_unsigned(_FCMP[op], a, c)

    def select(self, e: P.Select) -> ir.Value:
        cond = self.emit(e.cond)
        if _cheap(e.then) and _cheap(e.other):
            return self.b.select(cond, self.emit(e.then), self.emit(e.other))
        then_block = self.b.append_basic_block("then")
        other_block = self.b.append_basic_block("else")
        join = self.b.append_basic_block("join")
        self.b.cbranch(cond, then_block, other_block)
        self.b.position_at_end(then_block)
        then_value = self.emit(e.then)
        then_end = self.b.block
        self.b.branch(join)
        self.b.position_at_end(other_block)
        other_value = self.emit(e.other)
        other_end = self.b.block
        self.b.branch(join)
        self.b.position_at_end(join)
        phi = self.b.phi(then_value.type)
        phi.add_incoming(then_value, then_end)
        phi.add_incoming(other_value, other_end)
        return phi


def _per_instance(e: L.IExpr) -> bool:
    """Whether `e` uses a statement index variable."""
    return any(L.index_name(v) is not None for v in L.variables(e))


def _cheap(e: P.Expr) -> bool:
    """Safe and cheap to evaluate unconditionally: no memory read, no division, no call."""
    for node in P.walk(e):
        if isinstance(node, (P.Read, P.Call)):
            return False
        if isinstance(node, P.Binary) and node.op in ("div", "mod"):
            return False
    return True
