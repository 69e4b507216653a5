"""The reference interpreter: runs a loop-IR kernel on NumPy arrays, statement instance by
statement instance, exactly in the order the generated code would.

It is the oracle for every schedule and both backends. For speed it does not walk the IR
at run time: it writes the kernel as one Python function (NumPy scalars give each value its
exact type: float32 rounding, int wraparound) and runs that. GPU launches run each block's
threads as Python generators that yield at every barrier, so a missing barrier gives wrong
results here as it would on a GPU.
"""

from __future__ import annotations

import itertools
from typing import Callable

import numpy as np

from backends import reference_math
from polyhedral import loop_ir as L
from tclang.lang import program as P
from tclang import bfloat16
from tclang.dtypes import DType
from tclang.errors import TCIndexError

_CMP = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}
_INDEX_BIN = {"add": "+", "sub": "-", "mul": "*", "floordiv": "//", "div_nonneg": "//",
              "rem": "%", "floormod": "%", "lt": "<", "le": "<=", "gt": ">", "ge": ">=",
              "eq": "==", "ne": "!="}
#: index operators in Python
_INDEX_OPERATORS = {**{op: f"({{0}} {sym} {{1}})" for op, sym in _INDEX_BIN.items()},
                    "and": "({0} and {1})", "or": "({0} or {1})", "min": "min({0}, {1})",
                    "max": "max({0}, {1})", "neg": "(-{0})", "not": "(not {0})",
                    "select": "({1} if {0} else {2})"}


def compile_kernel(kernel: L.Kernel, check_bounds: bool = False) -> Callable:
    """A function `run(arrays, sizes)` executing `kernel` on a dict of NumPy arrays."""
    return load_source(_Emitter(kernel, check_bounds).emit(), kernel.name)


def load_source(source: str, name: str) -> Callable:
    """The `run` function of generated reference code (also from the compile cache)."""
    namespace = dict(_RUNTIME)
    exec(compile(source, f"<tclang reference {name}>", "exec"), namespace)
    run = namespace["run"]
    run.source = source
    return run


# ---- helpers the generated code calls ---------------------------------------------------

def _idiv(a, b):
    if b == 0:
        return type(a)(0)
    if b == -1:
        return -a
    return a // b


def _same_python_level(op: str, lhs: P.Expr) -> bool:
    """Whether `lhs` is an arithmetic operation that Python groups the same as `op` on its
    left, so its parentheses can go (arith wraps add, sub and mul in exactly one pair)."""
    levels = {"add": 0, "sub": 0, "mul": 1}
    return isinstance(lhs, P.Binary) and op in levels and \
        levels.get(lhs.op) == levels[op]


def _imod(a, b):
    if b == 0:
        return type(a)(0)
    return a % b


def _f2i(x, dtype):
    """float -> int: truncation toward zero, saturating, NaN -> 0 (LLVM's fptosi.sat)."""
    if np.isnan(x):
        return dtype.type(0)
    info = np.iinfo(dtype)
    value = np.trunc(np.float64(x))
    if value <= info.min:
        return dtype.type(info.min)
    if value >= info.max:
        return dtype.type(info.max)
    return dtype.type(int(value))


def _i2i(x, dtype):
    return np.asarray(x).astype(dtype)[()]


def _check(value, extent, tensor, dim, where, shape, element):
    """A checked subscript: the same message as the compiled backends'."""
    if not 0 <= value < extent:
        subs = ", ".join(str(int(x)) for x in element)
        raise TCIndexError(f"index {int(value)} is out of bounds for dimension {dim} of "
                           f"{tensor} (shape {shape}): element {tensor}[{subs}] in {where}; "
                           "nothing outside the array was accessed")
    return value


def _where(s: L.StatementDef) -> str:
    return f"`{s.text}` (line {s.line})" if s.text else s.id


def _lockstep(threads):
    """Advance every thread to its next barrier, again and again, until all finish."""
    alive = list(threads)
    while alive:
        still = []
        for t in alive:
            try:
                next(t)
                still.append(t)
            except StopIteration:
                pass
        alive = still


def _bf2f(b):
    """A bfloat16 element (its uint16 bits) as float32."""
    return np.uint32(int(b) << 16).view(np.float32)


def _f2bf(x):
    """float32 `x` rounded to nearest-even bfloat16: its bits (stored in a uint16 view)."""
    return bfloat16.round_bits(np.float32(x))[()]


def _rbf(x):
    """float32 `x` rounded to bfloat16, as float32 (a cast to bfloat16)."""
    return bfloat16.round_float32(np.float32(x))


_RUNTIME = {"np": np, "_bf2f": _bf2f, "_f2bf": _f2bf, "_rbf": _rbf, "_idiv": _idiv, "_imod": _imod, "_f2i": _f2i, "_i2i": _i2i,
            "_check": _check, "_lockstep": _lockstep, "_math": reference_math,
            "_product": itertools.product, "TCIndexError": TCIndexError}


class _Emitter:
    def __init__(self, kernel: L.Kernel, check_bounds: bool):
        self.kernel = kernel
        self.check_bounds = check_bounds
        self.lines: list[str] = []
        self.constants: dict[object, str] = {}
        self.launches = 0
        self.shapes = {b.name: b.shape for b in kernel.buffers}

    def emit(self) -> str:
        body: list[str] = []
        self.lines = body
        self.node(self.kernel.body, 1, in_thread=False)
        head = ["def run(arrays, sizes):", "  with np.errstate(all='ignore'):"]
        for name in self.kernel.sizes:
            head.append(f"    z_{name} = int(sizes[{name!r}])")
        for name, value in self.kernel.size_values:
            head.append(f"    z_{name} = {value}")
        for b in self.kernel.buffers:  # bfloat16: read and written as its uint16 bits
            view = ".view(np.uint16)" if b.dtype is DType.BFLOAT16 else ""
            head.append(f"    t_{b.name} = arrays[{b.name!r}]{view}")
        consts = [f"{name} = {text}" for text, name in self.constants.items()]
        return "\n".join(consts + head + (["    pass"] if not body else
                                          ["  " + line for line in body])) + "\n"

    def put(self, indent: int, line: str) -> None:
        self.lines.append("  " * indent + line)

    # ---- loop nodes ----
    def node(self, n: L.Node, indent: int, in_thread: bool) -> None:
        match n:
            case L.Block(body=items):
                for item in items:
                    self.node(item, indent, in_thread)
                if not items:
                    self.put(indent, "pass")
            case L.For(var=v, lo=lo, hi=hi, step=step, body=body):
                self.put(indent, f"for {v} in range({self.index(lo)}, {self.index(hi)}, {step}):")
                self.node(body, indent + 1, in_thread)
            case L.If(cond=c, then=t, other=o):
                self.put(indent, f"if {self.index(c)}:")
                self.node(t, indent + 1, in_thread)
                if o is not None:
                    self.put(indent, "else:")
                    self.node(o, indent + 1, in_thread)
            case L.Run():
                self.run(n, indent)
            case L.Copy(buffer=b, tensor=t, direction=d, index=idx, offset=off):
                glob = ", ".join(self.index(i) for i in idx)
                local = ", ".join(f"({self.index(i)}) - ({self.index(o)})"
                                  for i, o in zip(idx, off))
                g = f"t_{t}[{glob},]" if idx else f"t_{t}[()]"
                lo = f"t_{b}[{local},]" if idx else f"t_{b}[()]"
                self.put(indent, f"{lo} = {g}" if d == "in" else f"{g} = {lo}")
            case L.Combine(op=op, dtype=dt, dst=d, dst_index=di, src=src, src_index=si):
                dst = self.buffer_element(d, di)
                value = self.load(self.buffer_element(src, si), dt)
                if op is not None:
                    value = self.combine(op, self.load(dst, dt), value, dt)
                self.put(indent, f"{dst} = {self.stored(value, dt)}")
            case L.BlockCombine(op=op, dtype=dt, partial=b, count=c):
                self.put(indent, "if t0 == 0:")
                self.put(indent + 1, f"for _q in range(1, {c}):")
                first = self.buffer_element(b, (L.Int(0),))
                other = self.buffer_element(b, (L.Var("_q"),))
                value = self.combine(op, self.load(first, dt), self.load(other, dt), dt)
                self.put(indent + 2, f"{first} = {self.stored(value, dt)}")
            case L.Barrier():
                self.put(indent, "yield")
            case L.TileContraction():
                self.tile_contraction(n, indent, in_thread)
            case L.Launch():
                self.launch(n, indent)
            case L.Scratch(buffers=bufs, body=body):
                for b in bufs:
                    self.put(indent, f"t_{b.name} = {self.alloc(b)}")
                    # a contracted temporary's accesses are checked against its slice
                    self.shapes.setdefault(b.name, b.shape)
                self.node(body, indent, in_thread)
            case _:
                raise TypeError(f"unknown loop IR node {n!r}")

    def tile_contraction(self, n: L.TileContraction, indent: int, in_thread: bool) -> None:
        """The block's tile, summed point by point in float32 (k in order) by its first
        thread, then the followers at each point: the node's meaning, not the GPU's
        schedule of it."""
        bm, bn, _ = n.tile
        rows, cols, depth = self.index(n.rows), self.index(n.cols), self.index(n.depth)
        a = self.load(self.buffer_element(n.a.tensor, n.a.index), n.a.dtype)
        b = self.load(self.buffer_element(n.b.tensor, n.b.index), n.b.dtype)
        out = self.buffer_element(n.target, n.out_index)
        put = self.put
        put(indent, "if t0 == 0:")
        put(indent + 1, f"{L.TILE_B} = b2")
        for stage in ("sums", "followers"):
            if stage == "followers" and not n.followers:
                break
            put(indent + 1, f"for _p in range({bm * bn}):")
            put(indent + 2, f"{L.TILE_M} = b1 * {bm} + _p // {bn}")
            put(indent + 2, f"{L.TILE_N} = b0 * {bn} + _p % {bn}")
            put(indent + 2, f"if {L.TILE_M} < {rows} and {L.TILE_N} < {cols}:")
            if stage == "followers":
                for f in n.followers:
                    self.node(f, indent + 3, in_thread)
                continue
            put(indent + 3, "_s = np.float32(0)")
            put(indent + 3, f"for {L.TILE_K} in range({depth}):")
            put(indent + 4, f"_s = np.float32(_s + np.float32({a}) * np.float32({b}))")
            value = "_s" if n.op is None else \
                self.combine(n.op, self.load(out, n.target_dtype), "_s", n.target_dtype)
            put(indent + 3, f"{out} = {self.stored(value, n.target_dtype)}")

    def launch(self, n: L.Launch, indent: int) -> None:
        k = self.launches
        self.launches += 1
        ids = ("b0", "b1", "b2")[:len(n.grid)]
        tids = ("t0", "t1", "t2")[:len(n.block)]
        shared = [b for b in n.buffers if b.kind == "shared"]
        private = [b for b in n.buffers if b.kind == "private"]
        self.put(indent, f"def _thread_{k}({', '.join(ids + tids)}):")
        for b in private:
            self.put(indent + 1, f"t_{b.name} = {self.alloc(b)}")
        self.put(indent + 1, "if False: yield")
        self.node(n.body, indent + 1, in_thread=True)
        grid = ", ".join(f"range({self.index(g)})" for g in n.grid)
        block = ", ".join(f"range({b})" for b in n.block)
        self.put(indent, f"for _b in _product({grid}):")
        for b in shared:
            self.put(indent + 1, f"t_{b.name} = {self.alloc(b)}")
        self.put(indent + 1, f"_lockstep([_thread_{k}(*_b, *_t) for _t in _product({block})])")

    def buffer_element(self, name: str, index) -> str:
        subs = ", ".join(f"{self.index(i)}" for i in index)
        return f"t_{name}[{subs},]" if index else f"t_{name}[()]"

    def alloc(self, b: L.Buffer) -> str:
        shape = ", ".join(self.index(d) for d in b.shape)
        dtype = "uint16" if b.dtype is DType.BFLOAT16 else b.dtype.value
        return f"np.zeros(({shape}{',' if b.shape else ''}), dtype=np.{dtype})"

    # ---- statement instances ----
    def run(self, r: L.Run, indent: int) -> None:
        s = self.kernel.statement(r.statement)
        promoted = {p.ref: p for p in r.promoted}
        self.put(indent, f"# {r.statement}: {s.text}" if s.text else f"# {r.statement}")
        for name, value in zip(s.indices, r.indices):
            self.put(indent, f"i_{name} = {self.index(value)}")
        if s.scatter:  # its subscripts evaluated and checked, as a gather's
            subs = [f"int({self.value(e, s, promoted)})" for e in s.scatter]
            target = self.element(s.target, subs, None, _where(s), [True] * len(subs))
        else:
            checks = [self.check_bounds] * len(s.lhs) if promoted.get(-1) is None else None
            target = self.element(s.target, [f"i_{i}" for i in s.lhs], promoted.get(-1),
                                  _where(s), checks)
        dtype = self.kernel.declared(s.target).dtype
        if s.kind in ("init", "assign"):
            self.put(indent, f"{target} = {self.stored(self.value(s.value, s, promoted), dtype)}")
            return
        value = self.value(s.value, s, promoted)
        current = self.load(target, dtype)
        combined = self.combine(s.op, current, value, dtype)
        self.put(indent, f"{target} = {self.stored(combined, dtype)}")

    def combine(self, op: str, acc: str, value: str, dtype: DType) -> str:
        if op == "+":
            return f"({acc} + {value})"
        if op == "*":
            return f"({acc} * {value})"
        fn = ("np.fmin" if op == "min" else "np.fmax") if dtype.is_float else \
            ("np.minimum" if op == "min" else "np.maximum")
        return f"{fn}({acc}, {value})"

    def element(self, tensor: str, subscripts: list[str], promotion: L.Promotion | None,
                where: str, checks: list | None) -> str:
        if promotion is not None:
            subs = [f"({s}) - ({self.index(o)})" for s, o in zip(subscripts, promotion.offset)]
            name = promotion.buffer
            if not subs:  # a 0-d target accumulated in a one-element buffer
                return f"t_{name}[0]"
        else:
            subs, name = subscripts, tensor
        if checks is not None and any(checks):
            shape = "(" + "".join(f"{self.index(d)}, " for d in self.shapes[tensor]) + ")"
            element = "(" + "".join(f"{s}, " for s in subs) + ")"
            subs = [f"_check({s}, {self.index(self.shapes[tensor][k])}, {tensor!r}, {k}, "
                    f"{where!r}, {shape}, {element})" if check else s
                    for k, (s, check) in enumerate(zip(subs, checks))]
        return f"t_{name}[{', '.join(subs)},]" if subs else f"t_{name}[()]"

    @staticmethod
    def load(text: str, dtype: DType) -> str:
        if dtype is DType.BFLOAT16:
            return f"_bf2f({text})"
        return f"np.float32({text})" if dtype is DType.FLOAT16 else text

    @staticmethod
    def stored(value: str, dtype: DType) -> str:
        """`value` as an element of a `dtype` array holds it (float16: NumPy rounds; a
        bfloat16 element is its bits, rounded here)."""
        return f"_f2bf({value})" if dtype is DType.BFLOAT16 else value

    def const(self, value, dtype: DType) -> str:
        literal = f"float('{value}')" if isinstance(value, float) and not np.isfinite(value) \
            else repr(value)
        if dtype is DType.FLOAT16:
            key = f"np.float32(np.float16({literal}))"
        elif dtype is DType.BFLOAT16:
            key = f"_rbf({literal})"
        else:
            key = f"np.{dtype.numpy.name}({literal})"
        if key not in self.constants:
            self.constants[key] = f"_k{len(self.constants)}"
        return self.constants[key]

    def value(self, e: P.Expr, s: L.StatementDef, promoted: dict[int, L.Promotion]) -> str:
        v = lambda x: self.value(x, s, promoted)  # noqa: E731
        match e:
            case P.Const(value=val, dtype=dt):
                return self.const(val, dt)
            case P.IndexValue(name=n, dtype=dt):
                return self.cast(f"np.int64(i_{n})", DType.INT64, dt)
            case P.SizeValue(name=n, dtype=dt):
                return self.cast(f"np.int64(z_{n})", DType.INT64, dt)
            case P.Read(tensor=t, subscripts=subs, affine=aff, ref=ref):
                texts = [f"int({v(x)})" for x in subs]
                checks = [self.check_bounds or a is None for a in aff]
                elem = self.element(t, texts, promoted.get(ref), _where(s), checks)
                return self.load(elem, self.kernel.declared(t).dtype)
            case P.Unary(op="neg", operand=x):
                return f"(-{v(x)})"
            case P.Unary(op="not", operand=x):
                return f"np.bool_(not {v(x)})"
            case P.Binary(op="and", lhs=a, rhs=b):
                return f"np.bool_({v(a)} and {v(b)})"
            case P.Binary(op="or", lhs=a, rhs=b):
                return f"np.bool_({v(a)} or {v(b)})"
            case P.Binary(op=op, lhs=a, rhs=b, dtype=dt):
                left = v(a)
                if _same_python_level(op, a):  # a + b + c, not ((a + b) + c): Python's
                    left = left[1:-1]          # parser refuses 200 nested parentheses
                return self.arith(op, left, v(b), dt)
            case P.Compare(op=op, lhs=a, rhs=b):
                return f"np.bool_({v(a)} {_CMP[op]} {v(b)})"
            case P.Select(cond=c, then=t, other=o):
                return f"({v(t)} if {v(c)} else {v(o)})"
            case P.Call(name=n, args=args, dtype=dt):
                joined = ", ".join(v(a) for a in args)
                return f"_math.call({n!r}, ({joined},), np.dtype(np.{dt.compute.value}))"
            case P.Cast(operand=x, dtype=dt):
                return self.cast(v(x), x.dtype, dt)
            case P.Let(name=n, value=x, body=body):  # x is unconditional
                return f"(l_{n} := {v(x)}, {v(body)})[1]"
            case P.Local(name=n):
                return f"l_{n}"
        raise TypeError(f"unknown expression {e!r}")

    @staticmethod
    def arith(op: str, a: str, b: str, dtype: DType) -> str:
        if op in ("add", "sub", "mul"):
            return f"({a} {_INDEX_BIN[op]} {b})"
        if op == "div":
            return f"({a} / {b})" if dtype.is_float else f"_idiv({a}, {b})"
        return f"np.remainder({a}, {b})" if dtype.is_float else f"_imod({a}, {b})"

    @staticmethod
    def cast(x: str, src: DType, dst: DType) -> str:
        if dst is DType.BOOL:
            return f"np.bool_({x} != 0)"
        if dst is DType.FLOAT16:
            return f"np.float32(np.float16({x}))"
        if dst is DType.BFLOAT16:
            return f"_rbf({x})"
        if dst.is_float:
            return f"np.{dst.value}({x})"
        if src.is_float:
            return f"_f2i({x}, np.dtype(np.{dst.value}))"
        return f"_i2i({x}, np.{dst.value})"

    def index(self, e: L.IExpr) -> str:
        return L.render_index(e, self.variable, str, _INDEX_OPERATORS)

    def variable(self, name: str) -> str:
        return f"z_{name}" if name in self.kernel.sizes else name
