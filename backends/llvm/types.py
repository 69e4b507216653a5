"""tclang types in LLVM: how each is stored in memory and computed in registers.

bool is a byte in memory and an i1 in registers; float16 is a `half` in memory and a
`float` in registers (rounded back to half only at stores and at casts to half). bfloat16
is an i16 in memory (the upper half of the float32 of the same value) and a `float` in
registers: a load shifts its bits up, a store or cast rounds to nearest even with integer
operations (no libcall, the same on every CPU; LLVM's `bfloat` type would need
`__truncsfbf2` where the CPU lacks AVX512-BF16).
"""

from __future__ import annotations

import llvmlite.ir as ir

from tclang.dtypes import DType, round_float

I1, I8, I16, I32, I64 = (ir.IntType(1), ir.IntType(8), ir.IntType(16), ir.IntType(32),
                         ir.IntType(64))
HALF, FLOAT, DOUBLE = ir.HalfType(), ir.FloatType(), ir.DoubleType()


def storage(dtype: DType) -> ir.Type:
    if dtype is DType.BOOL:
        return I8
    if dtype is DType.FLOAT16:
        return HALF
    if dtype is DType.BFLOAT16:
        return I16
    if dtype is DType.FLOAT32:
        return FLOAT
    if dtype is DType.FLOAT64:
        return DOUBLE
    return ir.IntType(dtype.bits)


def register(dtype: DType) -> ir.Type:
    if dtype is DType.BOOL:
        return I1
    if dtype.is_narrow_float:
        return FLOAT
    return storage(dtype)


def load(builder: ir.IRBuilder, pointer: ir.Value, dtype: DType) -> ir.Value:
    value = builder.load(pointer)
    if dtype is DType.BOOL:
        return builder.icmp_unsigned("!=", value, ir.Constant(I8, 0))
    if dtype is DType.FLOAT16:
        return builder.fpext(value, FLOAT)
    if dtype is DType.BFLOAT16:
        return bfloat16_value(builder, value)
    return value


def bfloat16_value(builder: ir.IRBuilder, bits: ir.Value) -> ir.Value:
    """The float of bfloat16 `bits` (an i16): exact."""
    wide = builder.shl(builder.zext(bits, I32), ir.Constant(I32, 16))
    return builder.bitcast(wide, FLOAT)


def bfloat16_bits(builder: ir.IRBuilder, value: ir.Value) -> ir.Value:
    """float `value` rounded to nearest-even bfloat16, as its i16 bits; a NaN stays a
    quiet NaN with its sign."""
    u = builder.bitcast(value, I32)
    upper = builder.lshr(u, ir.Constant(I32, 16))
    odd = builder.and_(upper, ir.Constant(I32, 1))
    rounded = builder.lshr(builder.add(builder.add(u, ir.Constant(I32, 0x7FFF)), odd),
                           ir.Constant(I32, 16))
    quiet = builder.or_(upper, ir.Constant(I32, 0x40))
    nan = builder.fcmp_unordered("uno", value, value)
    return builder.trunc(builder.select(nan, quiet, rounded), I16)


def round_bfloat16(builder: ir.IRBuilder, value: ir.Value) -> ir.Value:
    """float `value` rounded to bfloat16, still a float."""
    return bfloat16_value(builder, bfloat16_bits(builder, value))


def store(builder: ir.IRBuilder, value: ir.Value, pointer: ir.Value, dtype: DType) -> None:
    if dtype is DType.BOOL:
        value = builder.zext(value, I8)
    elif dtype is DType.FLOAT16:
        value = builder.fptrunc(value, HALF)
    elif dtype is DType.BFLOAT16:
        value = bfloat16_bits(builder, value)
    builder.store(value, pointer)


def constant(value, dtype: DType) -> ir.Constant:
    """A literal rounded to its type (float literals keep their decimal value until here)."""
    if dtype is DType.BOOL:
        return ir.Constant(I1, int(bool(value)))
    if dtype.is_float:
        return ir.Constant(register(dtype), round_float(value, dtype))
    bits = dtype.bits
    return ir.Constant(register(dtype), int(value) & ((1 << bits) - 1))


def convert(builder: ir.IRBuilder, value: ir.Value, src: DType, dst: DType) -> ir.Value:
    """`dst(value)`: the language's casts (float -> int saturates, NaN -> 0)."""
    if src is dst:
        return value
    if dst is DType.BOOL:
        if src.is_float:
            return builder.fcmp_unordered("!=", value, ir.Constant(value.type, 0.0))
        return builder.icmp_unsigned("!=", value, ir.Constant(value.type, 0))
    if dst.is_float:
        out = register(dst)
        if src is DType.BOOL or (src.is_int and not src.is_signed):
            value = builder.uitofp(value, out)
        elif src.is_int:
            value = builder.sitofp(value, out)
        elif value.type == DOUBLE and dst is DType.FLOAT16:
            value = float_rounded_to_odd(builder, value)
        elif value.type != out:
            value = builder.fpext(value, out) if _width(value.type) < _width(out) else \
                builder.fptrunc(value, out)
        if dst is DType.FLOAT16:  # round to half precision, keep computing in float
            value = builder.fpext(builder.fptrunc(value, HALF), FLOAT)
        elif dst is DType.BFLOAT16:  # round to bfloat16, keep computing in float
            value = round_bfloat16(builder, value)
        return value
    out = register(dst)
    if src.is_float:
        name = f"llvm.fpto{'s' if dst.is_signed else 'u'}i.sat.i{dst.bits}.{_fname(value.type)}"
        fn = _intrinsic(builder.module, name, out, [value.type])
        return builder.call(fn, [value])
    if src is DType.BOOL:
        return builder.zext(value, out)
    if src.bits > dst.bits:
        return builder.trunc(value, out)
    if src.bits < dst.bits:
        return builder.sext(value, out) if src.is_signed else builder.zext(value, out)
    return value  # same width, other signedness: the bits stay


def float_rounded_to_odd(builder: ir.IRBuilder, value: ir.Value) -> ir.Value:
    """double `value` as a float rounded to odd: toward zero, then the last bit set where
    that lost anything. Rounding this to half (nearest even) is rounding `value` to half
    once (24 bits hold half's 11 and two more: Boldo and Melquiond's round-to-odd), as
    NumPy's and CUDA's `__double2half` do; rounding to nearest float first would round
    twice. And LLVM never sees a double-to-half truncation: its code generator may fold
    `fptrunc (fptrunc double to float) to half` into one, lowered to a call of
    `__truncdfhf2`, which this process does not have (the kernel died calling address 0:
    fuzz seed 2030, program 323)."""
    nearest = builder.fptrunc(value, FLOAT)
    back = builder.fpext(nearest, DOUBLE)
    bits = builder.bitcast(nearest, I32)
    fabs = _intrinsic(builder.module, "llvm.fabs.f64", DOUBLE, [DOUBLE])
    away = builder.fcmp_ordered(">", builder.call(fabs, [back]), builder.call(fabs, [value]))
    toward_zero = builder.select(away, builder.sub(bits, ir.Constant(I32, 1)), bits)
    inexact = builder.fcmp_unordered("!=", back, value)  # a NaN too: it stays a NaN
    odd = builder.select(inexact, builder.or_(toward_zero, ir.Constant(I32, 1)), bits)
    return builder.bitcast(odd, FLOAT)


def _width(t: ir.Type) -> int:
    return {HALF: 16, FLOAT: 32, DOUBLE: 64}[t]


def _fname(t: ir.Type) -> str:
    return {HALF: "f16", FLOAT: "f32", DOUBLE: "f64"}[t]


def _intrinsic(module: ir.Module, name: str, ret: ir.Type, args: list[ir.Type]) -> ir.Function:
    existing = module.globals.get(name)
    if existing is not None:
        return existing
    return ir.Function(module, ir.FunctionType(ret, args), name)


intrinsic = _intrinsic
