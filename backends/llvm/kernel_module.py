"""Loop IR -> LLVM functions: the kernel entry and one outlined function per parallel loop.

The entry is `i32 @tclang_main(T* noalias buffers..., i64* sizes, i64* strides, i64* err,
i8* parallel_for)`. An outermost parallel loop is outlined into an internal function over an
iteration range, plus a `task(ctx, lo, hi)` wrapper; the entry calls `parallel_for(task,
ctx, lo, hi)` (the runtime's thread pool) when the loop has enough work, else runs the range
itself: small kernels never pay for threads. A parallel loop also marked reduction is a
scatter's, whose iterations may update the same elements: each chunk updates a private
copy of the target, merged into it at the end (`colliding_loop`). Gathers that fall
outside their tensor record the tensor, dimension and value in `err` and return 1;
nothing outside an array is read.
"""

from __future__ import annotations

import dataclasses

import llvmlite.ir as ir

from backends.access_errors import MAX_SUBSCRIPTS
from backends.llvm import accumulators, lanes
from backends.llvm import types as T
from backends.llvm import vector_values as V
from backends.llvm.values import ValueEmitter
from polyhedral import loop_ir as L
from tclang.dtypes import DType, identity
from tclang.errors import TCCompileError
from tclang.lang.program import reads_of

PARALLEL_WORK = 1 << 15  # statement instances below which a loop stays on one thread
# a scatter target of up to this many elements is privatized per chunk (the polyhedral
# layer threads only such scatters: polyhedral/scatter_loops.py, the same number)
PRIVATE_ELEMENTS = 4096


class KernelModule:
    """Builds the LLVM module of one kernel."""

    def __init__(self, kernel: L.Kernel, triple: str, layout: str, unrolled_width: int = 8):
        """`unrolled_width`: lanes for a vectorized loop that also has an unroll count (see
        metadata_for); the kernel's `choices` decide the rest."""
        choices = kernel.choices
        self.kernel = kernel
        # statement instances below which a parallel loop stays on one thread
        self.parallel_work = 0 if choices.always_threaded else PARALLEL_WORK
        self.vector_width = choices.vector_width  # lanes to ask the vectorizer for (0: its choice)
        self.unrolled_width = unrolled_width
        self.reassociate = choices.reassociate  # float reductions may be reordered (fast-math)
        self.module = ir.Module(name=f"tclang_{kernel.name}")
        self.module.triple = triple
        self.module.data_layout = layout
        self.check_bounds = choices.check_bounds
        # the sizes that are constants of the code (all, or some in a partly generic kernel)
        self.specialized = dict(kernel.size_values) if kernel.size_values else None
        self.strides = [b.strides for b in kernel.buffers]
        # every size and stride is a constant in the code: calls need not pass them
        self.static = kernel.specialized and all(
            s is not None and None not in s for s in self.strides)
        self.regions = 0
        self.loop_metadata: dict[tuple, ir.MDValue] = {}
        self.pfor_type = ir.FunctionType(ir.VoidType(), [
            ir.FunctionType(ir.VoidType(), [T.I8.as_pointer(), T.I64, T.I64]).as_pointer(),
            T.I8.as_pointer(), T.I64, T.I64]).as_pointer()
        self.buffer_types = [T.storage(b.dtype).as_pointer() for b in kernel.buffers]
        # where each buffer's strides start in the strides array the caller passes
        self.stride_positions, position = {}, 0
        for b in kernel.buffers:
            self.stride_positions[b.name] = position
            position += len(b.shape)

    def build(self) -> ir.Module:
        common = [T.I64.as_pointer(), T.I64.as_pointer(), T.I64.as_pointer()]
        fnty = ir.FunctionType(T.I32, self.buffer_types + common + [T.I8.as_pointer()])
        main = ir.Function(self.module, fnty, "tclang_main")
        main.attributes.add("noinline")  # never copied into tclang_packed
        fb = FunctionBuilder(self, main, {}, main.args[-1],
                             tuple(b.name for b in self.kernel.buffers))
        # a register tile's points: straight-line copies, or loops of vector lanes
        vectors = not self.check_bounds and self.kernel.choices.vectorize
        fb.node(lanes.expand_unrolled(self.kernel, vectors))
        fb.finish()
        self._packed_entry(main, common)
        return self.module

    def _packed_entry(self, main: ir.Function, common: list) -> None:
        """`i32 @tclang_packed(i8** buffers, sizes, strides, err, parallel_for)`: the
        entry with the buffers' pointers in an array, so that one native call entry
        (backends/llvm/call_trampoline.py) calls every kernel, whatever its arity."""
        pointers = T.I8.as_pointer().as_pointer()
        fnty = ir.FunctionType(T.I32, [pointers] + common + [T.I8.as_pointer()])
        packed = ir.Function(self.module, fnty, "tclang_packed")
        b = ir.IRBuilder(packed.append_basic_block("entry"))
        args = [b.bitcast(b.load(b.gep(packed.args[0], [ir.Constant(T.I64, k)])), ty)
                for k, ty in enumerate(self.buffer_types)]
        b.ret(b.call(main, args + list(packed.args[1:])))

    def no_vectorize(self) -> ir.MDValue:
        """Loop hints that keep the loop vectorizer off this loop (the SLP vectorizer
        still packs its straight-line body)."""
        m = self.module
        hint = m.add_metadata([ir.MetaDataString(m, "llvm.loop.vectorize.enable"),
                               ir.Constant(T.I1, 0)])
        node = m.add_metadata([None, hint])
        node.operands = (node, hint)
        return node

    def dot_product(self) -> ir.MDValue:
        """Loop hints for an inner dot-product loop of carried accumulators: vectorize, and
        do not unroll first. LLVM fully unrolls a short constant trip count (a 32-wide
        image row) before its loop vectorizer runs, and the SLP vectorizer then makes
        nothing wider than pairs of the unrolled sum: 2.6x slower on a weight gradient."""
        m = self.module
        hints = [m.add_metadata([ir.MetaDataString(m, "llvm.loop.vectorize.enable"),
                                 ir.Constant(T.I1, 1)]),
                 m.add_metadata([ir.MetaDataString(m, "llvm.loop.unroll.disable")])]
        node = m.add_metadata([None] + hints)
        node.operands = (node, *hints)
        return node

    def metadata_for(self, loop: L.For) -> ir.MDValue | None:
        """Loop hints: vectorize (the vectorizer may use SIMD), unroll count."""
        key = (loop.vectorize, loop.unroll)
        if key == (False, 0):
            return None
        width = self.vector_width if loop.vectorize else 0
        if loop.unroll and not width:
            # LLVM 22's vectorizer aborts the process (an assertion: "VPlan cost model and
            # legacy cost model disagreed") choosing a width for a min/max reduction loop
            # with a small unroll count and a short trip count. A fixed width leaves it
            # nothing to choose: the target's lanes, or 1 where we asked for no SIMD.
            width = self.unrolled_width if loop.vectorize else 1
        if key not in self.loop_metadata:
            m = self.module
            hints = []
            if loop.vectorize:
                hints.append(m.add_metadata([ir.MetaDataString(m, "llvm.loop.vectorize.enable"),
                                             ir.Constant(T.I1, 1)]))
            if width:
                hints.append(m.add_metadata([ir.MetaDataString(m, "llvm.loop.vectorize.width"),
                                             ir.Constant(T.I32, width)]))
            if loop.unroll:
                hints.append(m.add_metadata([ir.MetaDataString(m, "llvm.loop.unroll.count"),
                                             ir.Constant(T.I32, loop.unroll)]))
            self.loop_metadata[key] = hints
        node = self.module.add_metadata([None] + self.loop_metadata[key])
        node.operands = (node, *self.loop_metadata[key])  # a loop ID refers to itself
        return node


class FunctionBuilder:
    """One function under construction: its values for buffers, sizes, strides, loops."""

    def __init__(self, km: KernelModule, fn: ir.Function, env: dict[str, ir.Value],
                 pfor: ir.Value | None, buffer_names: tuple[str, ...],
                 scratch: dict[str, L.Buffer] | None = None):
        """`fn`'s first arguments are the buffers `buffer_names`, kernel buffers or the
        `scratch` buffers of an enclosing `Scratch` node (an outlined loop takes
        only those it uses, so N independent loops make O(N) code, not O(N^2))."""
        self.km = km
        self.fn = fn
        self.env = dict(env)  # loop variable -> i64
        self.pfor = pfor
        kernel = km.kernel
        n = len(buffer_names)
        self.buffer_names = buffer_names
        self.buffer_args = list(fn.args[:n])
        for arg in self.buffer_args:
            arg.add_attribute("noalias")
        self.sizes_ptr, self.strides_ptr, self.err_ptr = fn.args[n:n + 3]
        # allocas (scratch buffers) go to a block of their own, ahead of everything: one
        # per function call whatever loop their node sits in
        self.allocas = fn.append_basic_block("allocas")
        entry = fn.append_basic_block("entry")
        self.exit = fn.append_basic_block("exit")
        self.builder = ir.IRBuilder(entry)
        self.check_bounds = km.check_bounds
        self._memo_block, self._memo = None, {}  # see `index`
        self._sizes = self._load_sizes()
        self.scratch = dict(scratch or {})  # name -> the Scratch buffers in scope
        self.atomic_targets: set[str] = set()  # scatter targets updated atomically here
        self._flat_loops: list = []  # (counter, head, done) of `_flat_loop`s still open
        self.buffers = {}
        for name, ptr in zip(buffer_names, self.buffer_args):
            if name in self.scratch:
                buffer = self.scratch[name]
                self.buffers[name] = (ptr, buffer, _scratch_strides(buffer))
            else:
                self.buffers[name] = (ptr, kernel.buffer(name), self._load_strides(name))

    def _load_sizes(self) -> dict[str, ir.Value]:
        values = {}
        for k, name in enumerate(self.km.kernel.sizes):
            if self.km.specialized is not None and name in self.km.specialized:
                values[name] = ir.Constant(T.I64, self.km.specialized[name])
            else:
                values[name] = self.builder.load(self.builder.gep(
                    self.sizes_ptr, [ir.Constant(T.I64, k)]), name=f"size.{name}")
        return values

    def _load_strides(self, name: str) -> list[ir.Value]:
        """Each stride the code holds as a constant, else loaded from the call's array."""
        km = self.km
        rank = len(km.kernel.buffer(name).shape)
        known = km.strides[[b.name for b in km.kernel.buffers].index(name)] or (None,) * rank
        position = km.stride_positions[name]
        return [ir.Constant(T.I64, s) if s is not None else self.builder.load(
            self.builder.gep(self.strides_ptr, [ir.Constant(T.I64, position + d)]))
            for d, s in enumerate(known)]

    def finish(self) -> None:
        if not self.builder.block.is_terminated:
            self.builder.branch(self.exit)
        self.builder.position_at_end(self.exit)
        code = self.builder.load(self.err_ptr)
        self.builder.ret(self.builder.trunc(code, T.I32))
        ir.IRBuilder(self.allocas).branch(self.allocas.function.blocks[1])

    # ---- values the emitters ask for ----
    def size(self, name: str) -> ir.Value:
        return self._sizes[name]

    def dtype_of(self, tensor: str) -> DType:
        return self.buffers[tensor][1].dtype

    def element(self, tensor: str, subscripts: list[ir.Value], promotion) -> ir.Value:
        """The address of tensor[subscripts], or with a `promotion` (a packed operand) of
        its copy in the promotion's scratch buffer."""
        if promotion is not None:
            tensor = promotion.buffer
            subscripts = [self.builder.sub(s, self.index(o), flags=("nsw",))
                          for s, o in zip(subscripts, promotion.offset)]
        base, _, strides = self.buffers[tensor]
        offset = ir.Constant(T.I64, 0)
        for sub, stride in zip(subscripts, strides):
            term = sub if (isinstance(stride, ir.Constant) and stride.constant == 1) else \
                self.builder.mul(sub, stride)
            offset = term if (isinstance(offset, ir.Constant) and offset.constant == 0) else \
                self.builder.add(offset, term)
        return self.builder.gep(base, [offset], inbounds=True)

    def check_element(self, tensor: str, subscripts: list[ir.Value], dims, statement) -> None:
        """Branch to the error exit unless each subscript in `dims` is inside `tensor`."""
        for dim in dims:
            self.check_index(tensor, dim, subscripts[dim], statement, subscripts)

    def check_index(self, tensor: str, dim: int, value: ir.Value, statement,
                    subscripts: list[ir.Value]) -> ir.Value:
        """Branch to the error exit unless 0 <= value < extent of tensor's `dim`; the exit
        records the whole element (see backends.access_errors)."""
        b = self.builder
        _, buf, _ = self.buffers[tensor]
        extent = self.index(buf.shape[dim])
        bad = b.or_(b.icmp_signed("<", value, ir.Constant(T.I64, 0)),
                    b.icmp_signed(">=", value, extent))
        fail = b.append_basic_block("out_of_bounds")
        ok = b.append_basic_block("in_bounds")
        b.cbranch(bad, fail, ok)
        b.position_at_end(fail)
        tensor_id = [x.name for x in self.km.kernel.buffers].index(tensor)
        statement_id = [s.id for s in self.km.kernel.statements].index(statement.id)
        first = b.cmpxchg(self.err_ptr, ir.Constant(T.I64, 0), ir.Constant(T.I64, 1),
                          "monotonic", "monotonic")
        won = b.extract_value(first, 1)
        record = b.append_basic_block("record")
        b.cbranch(won, record, self.exit)
        b.position_at_end(record)
        shown = subscripts[:MAX_SUBSCRIPTS]
        fields = [tensor_id, dim, value, statement_id, len(subscripts)] + shown
        for k, v in enumerate(fields, start=1):
            v = v if isinstance(v, ir.Value) else ir.Constant(T.I64, v)
            b.store(v, b.gep(self.err_ptr, [ir.Constant(T.I64, k)]))
        b.branch(self.exit)
        b.position_at_end(ok)
        return value

    def floordiv(self, a: ir.Value, d: ir.Value) -> ir.Value:
        b = self.builder
        q, r = b.sdiv(a, d), b.srem(a, d)
        zero = ir.Constant(a.type, 0)
        adjust = b.and_(b.icmp_signed("!=", r, zero), b.icmp_signed("<", b.xor(r, d), zero))
        return b.sub(q, b.zext(adjust, a.type))

    def floormod(self, a: ir.Value, d: ir.Value) -> ir.Value:
        b = self.builder
        r = b.srem(a, d)
        zero = ir.Constant(a.type, 0)
        fix = b.and_(b.icmp_signed("!=", r, zero), b.icmp_signed("<", b.xor(r, d), zero))
        return b.select(fix, b.add(r, d), r)

    def index(self, e: L.IExpr) -> ir.Value:
        """`e` as an i64, each distinct subexpression emitted once per basic block: isl's
        bounds share subexpressions (min/max/floord of the same sizes), and emitting them
        as trees multiplied shape-generic code out to hundreds of megabytes of IR. A value
        made earlier in the same block dominates every later use there."""
        match e:
            case L.Int(value=v):
                return ir.Constant(T.I64, v)
            case L.Var(name=n):
                return self.env[n] if n in self.env else self._sizes[n]
        if self._memo_block is not self.builder.block:
            self._memo_block, self._memo = self.builder.block, {}
        value = self._memo.get(e)
        if value is None:
            value = self._memo[e] = self.emit_op(e, self.index)
            if self._vector is not None:
                self._made.append(e)
        return value

    def _forget_indices_of(self, var: str) -> None:
        """Forget the index expressions of this block that use `var`: it is bound to
        another value now. A lane split binds its loop's variable to each lane in turn in
        one block; an index derived from it (`l = c3 - 1`, a loop isl shifted) was emitted
        for lane 0 and then read for every lane: each lane summed lane 0's element
        (fuzz seed 2031, program 291, through a gradient)."""
        if self._memo_block is self.builder.block:
            self._memo = {e: v for e, v in self._memo.items() if not L.uses_var(e, var)}

    def emit_op(self, e: L.Op, operand, wrap=("nsw",)) -> ir.Value:
        """`e`'s operation on its operands, `operand(a)` emitting each: `index`, or a
        statement's emitter binding its index variables (ValueEmitter.subscript). `wrap`:
        the flags of a sum, difference or product."""
        b = self.builder
        nonzero = lambda v: b.icmp_signed("!=", v, ir.Constant(T.I64, 0))  # noqa: E731
        match e:
            case L.Op(op="neg", args=(x,)):
                return b.neg(operand(x))
            case L.Op(op="not", args=(x,)):
                return b.zext(b.icmp_signed("==", operand(x), ir.Constant(T.I64, 0)), T.I64)
            case L.Op(op="select", args=(c, x, y)):
                return b.select(nonzero(operand(c)), operand(x), operand(y))
        x, y = (operand(a) for a in e.args)
        match e.op:
            case "add":
                return b.add(x, y, flags=wrap)
            case "sub":
                return b.sub(x, y, flags=wrap)
            case "mul":
                return b.mul(x, y, flags=wrap)
            case "floordiv":
                return self.floordiv(x, y)
            case "floormod":
                return self.floormod(x, y)
            case "div_nonneg":
                return b.sdiv(x, y)
            case "rem":
                return b.srem(x, y)
            case "min":
                return b.select(b.icmp_signed("<", x, y), x, y)
            case "max":
                return b.select(b.icmp_signed(">", x, y), x, y)
            case "and" | "or":
                tx, ty = nonzero(x), nonzero(y)
                return b.zext(b.and_(tx, ty) if e.op == "and" else b.or_(tx, ty), T.I64)
            case "lt" | "le" | "gt" | "ge" | "eq" | "ne":
                op = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}[e.op]
                return b.zext(b.icmp_signed(op, x, y), T.I64)
        raise ValueError(f"unknown index operator {e.op}")

    def _truth(self, e: L.IExpr) -> ir.Value:
        return self.builder.icmp_signed("!=", self.index(e), ir.Constant(T.I64, 0))

    # ---- loop nodes ----
    def node(self, n: L.Node) -> None:
        match n:
            case L.Block(body=items):
                for item in items:
                    self.node(item)
            case L.For() if n.unrolled:
                self.lane_loop(n, lambda: self.node(n.body))
            case L.For() if n.parallel and self.pfor is not None and n.step == 1:
                self.parallel_loop(n)
            case L.For() if n.parallel and n.reduction:
                self.colliding_loop(n)
            case L.For() if (promotion := self._promotion(n)) is not None:
                self.promoted_loop(n, promotion)
            case L.For():
                self.loop(n)
            case L.If(cond=c, then=t, other=o):
                self.branch(c, t, o)
            case L.Run():
                self.run(n)
            case L.Scratch(buffers=buffers, body=body):
                self.scratch_buffers(buffers, body)
            case L.Copy(buffer=buffer, tensor=tensor, direction="in", index=index, offset=offset):
                source = self.element(tensor, [self.index(i) for i in index], None)
                dtype = self.dtype_of(tensor)
                value = T.load(self.builder, source, dtype)
                T.store(self.builder, value, self.element(
                    tensor, [self.index(i) for i in index], L.Promotion(0, buffer, offset)), dtype)
            case _:
                raise TCCompileError(f"internal error: a {type(n).__name__} node in CPU code "
                                     f"(GPU launches, copies and barriers are for GPU "
                                     f"schedules); please report it")

    def scratch_buffers(self, buffers: tuple[L.Buffer, ...], body: L.Node) -> None:
        """Each buffer on this function's stack (a function runs on one thread: an outlined
        parallel loop has its own), 64-byte aligned, dense or with its own strides."""
        b = ir.IRBuilder(self.allocas)
        for buf in buffers:
            # one past its last element, under its strides (maybe padded: packing.py)
            count = 1 + sum((max(L.evaluate(e, {}), 1) - 1) * s.constant
                            for e, s in zip(buf.shape, _scratch_strides(buf)))
            storage = T.storage(buf.dtype)
            array = b.alloca(ir.ArrayType(storage, count), name=buf.name)
            array.align = 64
            pointer = b.bitcast(array, storage.as_pointer())
            self.buffers[buf.name] = (pointer, buf, _scratch_strides(buf))
            self.scratch[buf.name] = buf
        self.node(body)
        for buf in buffers:
            del self.buffers[buf.name], self.scratch[buf.name]

    def branch(self, cond: L.IExpr, then: L.Node, other: L.Node | None) -> None:
        b = self.builder
        then_block, join = b.append_basic_block("if.then"), b.append_basic_block("if.end")
        other_block = b.append_basic_block("if.else") if other is not None else join
        b.cbranch(self._truth(cond), then_block, other_block)
        b.position_at_end(then_block)
        self.node(then)
        b.branch(join)
        if other is not None:
            b.position_at_end(other_block)
            self.node(other)
            b.branch(join)
        b.position_at_end(join)

    def loop(self, n: L.For, lo: ir.Value | None = None, hi: ir.Value | None = None) -> None:
        self._counted_loop(n, [], lambda _: self.node(n.body) or [], lo, hi,
                           self.km.metadata_for(n))

    def _counted_loop(self, n: L.For, values: list, emit_body, lo, hi, hints) -> list:
        """`for (var = lo; var < hi; var += step)` with `values` carried through it as
        phis: `emit_body(phis)` emits one iteration and returns the carried values at its
        end. Returns the values after the loop (the phis, as the exit leaves from the
        header)."""
        b = self.builder
        lo = self.index(n.lo) if lo is None else lo
        hi = self.index(n.hi) if hi is None else hi
        pre = b.block
        header, body = b.append_basic_block(f"{n.var}.head"), b.append_basic_block(f"{n.var}.body")
        done = b.append_basic_block(f"{n.var}.done")
        b.branch(header)
        b.position_at_end(header)
        var = b.phi(T.I64, name=n.var)
        var.add_incoming(lo, pre)
        phis = []
        for v in values:
            phi = b.phi(v.type)
            phi.add_incoming(v, pre)
            phis.append(phi)
        b.cbranch(b.icmp_signed("<", var, hi), body, done)
        b.position_at_end(body)
        saved = self.env.get(n.var)
        self.env[n.var] = var
        updated = emit_body(list(phis))
        step = b.add(var, ir.Constant(T.I64, n.step), flags=("nsw",))
        var.add_incoming(step, b.block)
        for phi, v in zip(phis, updated):
            phi.add_incoming(v, b.block)
        latch = b.branch(header)
        if hints is not None:
            latch.set_metadata("llvm.loop", hints)
        if saved is None:
            self.env.pop(n.var)
        else:
            self.env[n.var] = saved
        b.position_at_end(done)
        return phis
    # ---- accumulators carried in registers (see backends/llvm/accumulators.py) ----
    def _promotion(self, n: L.For) -> accumulators.Promotion | None:
        if self.check_bounds:  # a checked update reports its element where it happens
            return None
        return accumulators.plan(n, self.km.kernel)

    def promoted_loop(self, n: L.For, promotion: accumulators.Promotion) -> None:
        """The loop with each accumulator loaded before it, carried through it (and the
        loops and branches inside it) as an SSA value, and stored after it. Nothing is
        loaded when the loop runs no iteration: its elements may not exist then."""
        b = self.builder
        lo, hi = self.index(n.lo), self.index(n.hi)
        start, after = b.append_basic_block(f"{n.var}.acc"), b.append_basic_block(f"{n.var}.end")
        b.cbranch(b.icmp_signed("<", lo, hi), start, after)
        b.position_at_end(start)
        pointers, values = [], []
        for acc in promotion.accumulators:
            subscripts = [self.index(s) for s in acc.subscripts]
            pointer = self.element(acc.tensor, subscripts, None)
            pointers.append(pointer)
            values.append(V.load(b, pointer, acc.lanes) if acc.lanes > 1 else
                          T.load(b, pointer, self.dtype_of(acc.tensor)))
        order = iter(promotion.targets)
        split = self._lane_split(n, promotion)
        if split is not None:  # a vector of partial sums per accumulator, through every loop
            inner, lanes = split
            vector = ir.VectorType(values[0].type, lanes)
            zeros = ir.Constant(vector, [ir.Constant(values[0].type, 0.0)] * lanes)
            start = [b.insert_element(zeros, v, ir.Constant(T.I32, 0)) for v in values]
            self._lanes = (inner, lanes, promotion.targets)
            try:
                vectors = self._carried_loop(n, start, order, lo, hi)
            finally:
                self._lanes = None
            values = [self._sum_tree([b.extract_element(v, ir.Constant(T.I32, lane))
                                      for lane in range(lanes)]) for v in vectors]
        else:
            scalars = all(acc.lanes == 1 for acc in promotion.accumulators)
            values = self._carried_loop(n, values, order, lo, hi,
                                        widen=scalars and (len(promotion.accumulators) == 1
                                                           or promotion.contiguous))
        for acc, pointer, value in zip(promotion.accumulators, pointers, values):
            if acc.lanes > 1:
                V.store(b, value, pointer)
            else:
                T.store(b, value, pointer, self.dtype_of(acc.tensor))
        b.branch(after)
        b.position_at_end(after)

    _lanes = None  # (the inner loop, lanes, update targets) while lane partials are carried

    def _lane_split(self, n: L.For, promotion: accumulators.Promotion):
        """(inner loop, lanes) when the promoted loop's updates all sit in one innermost
        dot-product loop of a constant trip count that the lanes divide: a weight
        gradient's sum over (n, h, w) with rows w of 32. LLVM's loop vectorizer would sum
        each row's vector of partial sums horizontally at the inner loop's exit, one
        horizontal sum per accumulator per row (most of the time for rows this short).
        Instead each accumulator is carried as one partial sum per lane through every
        loop of the reduction, the inner loop is unrolled by the lanes (the SLP vectorizer
        makes the lanes one vector register) and the lanes are added once, after the
        promoted loop. Only where float sums may be reassociated."""
        if not self.km.reassociate:
            return None
        inner = accumulators.single_inner_loop(n)
        if inner is None or inner is n:
            return None
        kernel = self.km.kernel
        statements = [kernel.statement(r.statement) for r in accumulators.runs_in(n)]
        if any(st.op != "+" for st in statements):
            return None
        dtypes = {self.dtype_of(acc.tensor) for acc in promotion.accumulators}
        if len(dtypes) != 1 or not next(iter(dtypes)).is_float:
            return None
        dtype = next(iter(dtypes))
        lanes = max(2, self.km.unrolled_width * 4 // max(2, dtype.bits // 8))
        if not (isinstance(inner.lo, L.Int) and isinstance(inner.hi, L.Int)) or inner.step != 1:
            return None
        trip = inner.hi.value - inner.lo.value
        if trip < lanes or trip % lanes or \
                len(promotion.accumulators) * lanes > accumulators.MAX_ACCUMULATORS * 2:
            return None
        if not accumulators.innermost_and_contiguous(inner, kernel):
            return None
        if any(not isinstance(x, L.Run) for x in accumulators.children_of(inner.body)):
            return None  # straight-line updates only: each lane's scalars build one vector
        return inner, lanes

    def _sum_tree(self, values: list) -> ir.Value:
        flags = ("reassoc", "contract")
        while len(values) > 1:
            values = [self.builder.fadd(values[k], values[k + 1], flags=flags)
                      if k + 1 < len(values) else values[k] for k in range(0, len(values), 2)]
        return values[0]

    def _lane_loop(self, node: L.For, vectors: list) -> list:
        """The inner loop of a lane split, `lanes` iterations per step: iteration l's update
        of each accumulator goes to lane l of a vector (built from the lanes' scalars:
        consecutive loads, which the SLP vectorizer turns into vector loads and FMAs),
        added to the accumulator's vector once per step."""
        _, lanes, targets = self._lanes
        b = self.builder
        runs = accumulators.runs_in(node.body)

        def body(phis):
            base = self.env[node.var]
            parts: dict[int, list] = {}
            for lane in range(lanes):
                self.env[node.var] = b.add(base, ir.Constant(T.I64, lane), flags=("nsw",))
                self._forget_indices_of(node.var)  # `l = c3 - 1` is lane 0's no more
                for run, k in zip(runs, targets):
                    value = self._run_value(run)
                    per_lane = parts.setdefault(k, [None] * lanes)
                    per_lane[lane] = value if per_lane[lane] is None else \
                        b.fadd(per_lane[lane], value, flags=("reassoc", "contract"))
            self.env[node.var] = base
            self._forget_indices_of(node.var)
            out = list(phis)
            for k, scalars in parts.items():
                built = ir.Constant(out[k].type, [ir.Constant(scalars[0].type, 0.0)] * lanes)
                for lane, x in enumerate(scalars):
                    built = b.insert_element(built, x, ir.Constant(T.I32, lane))
                out[k] = b.fadd(out[k], built, flags=("reassoc", "contract"))
            return out
        stepped = dataclasses.replace(node, step=lanes, vectorize=False)
        return self._counted_loop(stepped, vectors, body, None, None, self.km.no_vectorize())

    def _run_value(self, node: L.Run) -> ir.Value:
        s = self.km.kernel.statement(node.statement)
        return self._emitter(node, s, self._indices(node, s)).emit(s.value)

    def _indices(self, node: L.Run, s: L.StatementDef) -> dict[str, ir.Value]:
        """The statement's index values at `node`: each emitted when first asked for in a
        lane loop (straight-line code, no branch: lanes.py), else all of them here (a
        value first made inside one branch of a `?:` would not dominate the other)."""
        exprs = dict(zip(s.indices, node.indices))
        if self._vector is None:
            return {name: self.index(v) for name, v in exprs.items()}
        return _OnDemand(lambda name: self.index(exprs[name]))

    def _emitter(self, node: L.Run, s: L.StatementDef, indices: dict) -> ValueEmitter:
        """The value emitter of `node`: on vectors inside a lane loop, else on scalars."""
        promoted = {p.ref: p for p in node.promoted}
        if self._vector is None:
            return ValueEmitter(self, s, indices, promoted)
        loop, strides = self._vector
        return V.VectorValues(self, s, indices, promoted, lanes.lanes(loop),
                              lanes.index_steps(node, s, loop.var), strides,
                              dict(zip(s.indices, node.indices)))

    # ---- vector lanes (see backends/llvm/lanes.py) ----
    _vector = None  # (the lane loop, constant strides of the buffers) while inside one

    def lane_loop(self, n: L.For, emit):
        """Emit the body of the lane loop `n` once, on vectors: its variable is its first
        iteration's value, each statement's value a vector of its iterations' values.
        Index expressions made with the variable bound are forgotten after it."""
        strides = {name: tuple(x.constant if isinstance(x, ir.Constant) else None
                               for x in buffer_strides)
                   for name, (_, _, buffer_strides) in self.buffers.items()}
        self.env[n.var] = self.index(n.lo)
        self._vector, self._made = (n, strides), []
        try:
            return emit()
        finally:
            self._vector = None
            del self.env[n.var]
            for e in self._made:  # (the others, of the loops outside, serve the next rows)
                if e in self._memo and L.uses_var(e, n.var):
                    del self._memo[e]

    def _carried_loop(self, n: L.For, values: list, order, lo=None, hi=None,
                      widen: bool | str = False) -> list:
        # one accumulator, or reads contiguous along the loop: the loop vectorizer splits
        # each accumulator into lanes of partial sums; else the unrolled outer-product
        # tile is the SLP vectorizer's (widening the loop would gather its operands)
        if widen == "dot":
            hints = self.km.dot_product()
        else:
            hints = self.km.metadata_for(n) if widen else self.km.no_vectorize()
        return self._counted_loop(n, values, lambda phis: self._carried(n.body, phis, order),
                                  lo, hi, hints)
    def _carried(self, node: L.Node, values: list, order) -> list:
        b = self.builder
        match node:
            case L.Block(body=items):
                for item in items:
                    values = self._carried(item, values, order)
                return values
            case L.For() if node.unrolled:
                return self.lane_loop(node, lambda: self._carried(node.body, values, order))
            case L.For() if self._lanes is not None and node is self._lanes[0]:
                return self._lane_loop(node, values)
            case L.For():
                # an innermost loop that every read moves along contiguously (or not at
                # all) holds a dot product: its accumulators become vectors of partial sums
                inner = accumulators.innermost_and_contiguous(node, self.km.kernel)
                return self._carried_loop(node, values, order, widen="dot" if inner else False)
            case L.If(cond=c, then=t, other=o):
                then_block, join = b.append_basic_block("if.then"), b.append_basic_block("if.end")
                other_block = b.append_basic_block("if.else")
                b.cbranch(self._truth(c), then_block, other_block)
                b.position_at_end(then_block)
                then_values = self._carried(t, values, order)
                then_end = b.block
                b.branch(join)
                b.position_at_end(other_block)
                other_values = self._carried(o, values, order) if o is not None else values
                other_end = b.block
                b.branch(join)
                b.position_at_end(join)
                merged = []
                for x, y in zip(then_values, other_values):
                    phi = b.phi(x.type)
                    phi.add_incoming(x, then_end)
                    phi.add_incoming(y, other_end)
                    merged.append(phi)
                return merged
            case L.Run():
                s = self.km.kernel.statement(node.statement)
                k = next(order)
                values = list(values)
                values[k] = self.combine(s.op, values[k], self._run_value(node),
                                         self.dtype_of(s.target))
                return values
        raise TCCompileError(f"internal error: a {type(node).__name__} node among carried "
                             f"accumulators; please report it")

    def parallel_loop(self, n: L.For) -> None:
        """Outline the loop; run it through `parallel_for` when there is enough work."""
        b = self.builder
        lo, hi = self.index(n.lo), self.index(n.hi)
        outer = sorted(self.env)
        used = self._buffers_used(n)
        region, task = self._outline(n, outer, used)
        args = [self.buffers[name][0] for name in used] + \
            [self.sizes_ptr, self.strides_ptr, self.err_ptr]
        work = _estimate_work(n.body, frozenset(self.env) | {n.var})
        trips = b.sub(hi, lo)
        enough = b.and_(b.icmp_signed(">=", trips, ir.Constant(T.I64, 2)),
                        b.icmp_signed(">=", b.mul(trips, ir.Constant(T.I64, work)),
                                      ir.Constant(T.I64, self.km.parallel_work)))
        threaded = b.and_(enough, b.icmp_unsigned("!=", b.ptrtoint(self.pfor, T.I64),
                                                  ir.Constant(T.I64, 0)))
        par, seq, join = (b.append_basic_block(x) for x in ("par", "seq", "par.done"))
        b.cbranch(threaded, par, seq)
        b.position_at_end(par)
        values = args + [self.env[v] for v in outer]
        ctx = b.alloca(T.I64, size=len(values))
        for k, v in enumerate(values):
            v = b.ptrtoint(v, T.I64) if isinstance(v.type, ir.PointerType) else v
            b.store(v, b.gep(ctx, [ir.Constant(T.I64, k)]))
        pfor = b.bitcast(self.pfor, self.km.pfor_type)
        b.call(pfor, [task, b.bitcast(ctx, T.I8.as_pointer()), lo, hi])
        b.branch(join)
        b.position_at_end(seq)
        b.call(region, args + [lo, hi] + [self.env[v] for v in outer])
        b.branch(join)
        b.position_at_end(join)
        failed = b.icmp_signed("!=", b.load(self.err_ptr), ir.Constant(T.I64, 0))
        go_on = b.append_basic_block("ok")
        b.cbranch(failed, self.exit, go_on)
        b.position_at_end(go_on)

    def colliding_loop(self, n: L.For, lo: ir.Value | None = None,
                       hi: ir.Value | None = None) -> None:
        """Iterations [lo, hi) of a parallel scatter loop whose iterations may update the
        same elements (polyhedral/scatter_loops.py, `parallel_nest`), while other threads
        run other iterations. A target of at most PRIVATE_ELEMENTS elements (known when
        compiled) is privatized: the updates go into a dense copy on this call's stack,
        set to the operator's identity first, and the copy is merged into the target
        once at the end, element by element, with compare-and-swap updates. Any other
        target is updated in place with a compare-and-swap update per instance (an
        atomic add for integers). A bounds error leaves the loop before the merge: which
        in-range updates of the call were applied is then unspecified."""
        kernel = self.km.kernel
        targets: dict[str, str] = {}
        for node in L.walk_nodes(n):
            if isinstance(node, L.Run) and kernel.statement(node.statement).scatter:
                s = kernel.statement(node.statement)
                targets[s.target] = s.op
        private = {}
        for name, op in targets.items():
            buf = self.buffers[name][1]
            try:
                shape = [L.evaluate(e, dict(kernel.size_values)) for e in buf.shape]
            except KeyError:
                continue
            count = 1
            for extent in shape:
                count *= max(extent, 0)
            if 0 < count <= PRIVATE_ELEMENTS and name not in self.scratch:
                private[name] = (op, shape, count)
        b = self.builder
        shared = {}
        for name, (op, shape, count) in private.items():
            pointer, buf, _ = shared[name] = self.buffers[name]
            storage = T.storage(buf.dtype)
            array = ir.IRBuilder(self.allocas).alloca(ir.ArrayType(storage, count),
                                                      name=f"{name}.private")
            array.align = 64
            copy = b.bitcast(array, storage.as_pointer())
            strides, step = [], 1
            for extent in reversed(shape):
                strides.append(ir.Constant(T.I64, step))
                step *= extent
            self.buffers[name] = (copy, buf, list(reversed(strides)))
            first = self._flat_loop(f"{name}.init", count)
            value = ir.Constant(T.register(buf.dtype), identity(op, buf.dtype))
            T.store(b, value, b.gep(copy, [first], inbounds=True), buf.dtype)
            self._end_flat_loop()
        saved = self.atomic_targets
        self.atomic_targets = set(targets) - set(private)
        self.loop(n, lo, hi)
        self.atomic_targets = saved
        for name, (op, shape, count) in private.items():
            copy, buf, _ = self.buffers[name]
            self.buffers[name] = shared[name]
            names = [f"{name}.merge{d}" for d in range(len(shape))]
            flat: ir.Value = ir.Constant(T.I64, 0)
            for var, extent in zip(names, shape):
                k = self._flat_loop(var, extent)
                flat = b.add(b.mul(flat, ir.Constant(T.I64, extent)), k)
                self.env[var] = k
            value = T.load(b, b.gep(copy, [flat], inbounds=True), buf.dtype)
            self.atomic_update(op, self.element(name, [self.env[v] for v in names], None),
                               value, buf.dtype)
            for var in reversed(names):
                del self.env[var]
                self._end_flat_loop()

    def _flat_loop(self, name: str, count: int) -> ir.Value:
        """Open `for (k = 0; k < count; k++)`; returns k. `_end_flat_loop` closes it."""
        b = self.builder
        pre = b.block
        head, body, done = (b.append_basic_block(f"{name}.{x}") for x in ("head", "body", "done"))
        b.branch(head)
        b.position_at_end(head)
        k = b.phi(T.I64, name=name)
        k.add_incoming(ir.Constant(T.I64, 0), pre)
        b.cbranch(b.icmp_signed("<", k, ir.Constant(T.I64, count)), body, done)
        b.position_at_end(body)
        self._flat_loops.append((k, head, done))
        return k

    def _end_flat_loop(self) -> None:
        b = self.builder
        k, head, done = self._flat_loops.pop()
        k.add_incoming(b.add(k, ir.Constant(T.I64, 1)), b.block)
        b.branch(head)
        b.position_at_end(done)

    def atomic_update(self, op: str, target: ir.Value, value: ir.Value, dtype: DType) -> None:
        """target = target <op> value as one atomic step (other threads update the same
        elements): an atomic add of an integer, else a compare-and-swap loop over the
        element's bits with the same step `combine` makes (the same NaN and signed-zero
        rules as the sequential code)."""
        b = self.builder
        if op == "+" and not dtype.is_float:
            b.atomic_rmw("add", target, value, "monotonic")
            return
        storage = T.storage(dtype)
        bits = ir.IntType(dtype.bits)
        address = b.bitcast(target, bits.as_pointer())
        first = b.load_atomic(address, "monotonic", dtype.bits // 8)
        pre = b.block
        retry, done = b.append_basic_block("cas.retry"), b.append_basic_block("cas.done")
        b.branch(retry)
        b.position_at_end(retry)
        seen = b.phi(bits)
        seen.add_incoming(first, pre)
        old = b.bitcast(seen, storage) if dtype.is_float else seen
        new = self.combine(op, old, value, dtype)
        pair = b.cmpxchg(address, seen, b.bitcast(new, bits) if dtype.is_float else new,
                         "monotonic", "monotonic")
        seen.add_incoming(b.extract_value(pair, 0), b.block)
        b.cbranch(b.extract_value(pair, 1), done, retry)
        b.position_at_end(done)

    def _buffers_used(self, n: L.For) -> tuple[str, ...]:
        """The buffers the statements inside loop `n` write or read, in kernel order."""
        kernel = self.km.kernel
        used = set()
        for node in L.walk_nodes(n):
            if isinstance(node, L.Run):
                s = kernel.statement(node.statement)
                used.add(s.target)
                used.update(read.tensor for read in reads_of(s.value))
                used.update(read.tensor for e in s.scatter for read in reads_of(e))
                used.update(p.buffer for p in node.promoted)
            elif isinstance(node, L.Copy):
                used.update((node.tensor, node.buffer))
        # a scratch buffer filled outside the loop is passed in: the threads only read it
        return tuple(name for name in self.buffer_names if name in used) + \
            tuple(name for name in self.scratch if name in used)

    def _outline(self, n: L.For, outer: list[str],
                 used: tuple[str, ...]) -> tuple[ir.Function, ir.Function]:
        km = self.km
        k = km.regions
        km.regions += 1
        common = [T.I64.as_pointer()] * 3
        buffer_types = [T.storage(self.buffers[name][1].dtype).as_pointer() for name in used]
        region_ty = ir.FunctionType(T.I32, buffer_types + common + [T.I64] * (2 + len(outer)))
        region = ir.Function(km.module, region_ty, f"tclang_region{k}")
        region.linkage = "internal"
        # kept out of the entry: inlined, every loop nest would land in one function, on
        # which LLVM's O3 is superlinear (1,000 independent statements took minutes)
        region.attributes.add("noinline")
        rb = FunctionBuilder(km, region, {}, None, used,
                             {name: self.scratch[name] for name in used if name in self.scratch})
        lo, hi = region.args[-(2 + len(outer))], region.args[-(1 + len(outer))]
        for name, arg in zip(outer, region.args[len(region.args) - len(outer):]):
            rb.env[name] = arg
        if n.reduction:  # iterations may update the same elements (a scatter)
            rb.colliding_loop(n, lo, hi)
        else:
            rb.loop(n, lo, hi)
        rb.finish()
        task_ty = ir.FunctionType(ir.VoidType(), [T.I8.as_pointer(), T.I64, T.I64])
        task = ir.Function(km.module, task_ty, f"tclang_task{k}")
        tb = ir.IRBuilder(task.append_basic_block("entry"))
        ctx = tb.bitcast(task.args[0], T.I64.as_pointer())
        unpacked = []
        for j, t in enumerate(buffer_types + common + [T.I64] * len(outer)):
            raw = tb.load(tb.gep(ctx, [ir.Constant(T.I64, j)]))
            unpacked.append(tb.inttoptr(raw, t) if isinstance(t, ir.PointerType) else raw)
        n_fixed = len(buffer_types) + 3
        tb.call(region, unpacked[:n_fixed] + [task.args[1], task.args[2]] + unpacked[n_fixed:])
        tb.ret_void()
        return region, task

    # ---- statement instances ----
    def run(self, r: L.Run) -> None:
        s = self.km.kernel.statement(r.statement)
        indices = self._indices(r, s)
        emitter = self._emitter(r, s, indices)
        dtype = self.dtype_of(s.target)
        # a contracted temporary's slice (polyhedral/contraction.py): its subscripts are
        # the slice's by construction
        promotion = next((p for p in r.promoted if p.ref == -1), None)
        if s.scatter:
            target = self._scatter_target(s, emitter)
            if s.target in self.atomic_targets:
                self.atomic_update(s.op, target, emitter.emit(s.value), dtype)
                return
        else:
            target = self._target(r, s, indices, promotion)
        value = emitter.emit(s.value)
        if self._vector is not None:  # a row of lanes (lanes.py: float, stride 1)
            if s.kind == "reduce":
                current = V.load(self.builder, target, value.type.count)
                value = self.combine(s.op, current, value, dtype)
            V.store(self.builder, value, target)
            return
        if s.kind == "reduce":
            current = T.load(self.builder, target, dtype)
            value = self.combine(s.op, current, value, dtype)
        T.store(self.builder, value, target, dtype)

    def _target(self, r: L.Run, s: L.StatementDef, indices, promotion) -> ir.Value:
        """The address of the element instance `r` writes (checked in bounds-checked mode)."""
        if self.check_bounds and promotion is None:
            lhs = [indices[i] for i in s.lhs]
            self.check_element(s.target, lhs, range(len(lhs)), s)
        target = None
        if self._vector is not None:
            exprs = dict(zip(s.indices, r.indices))
            target = V.address(self, s.target, [exprs[i] for i in s.lhs], promotion)
        if target is None:
            target = self.element(s.target, [indices[i] for i in s.lhs], promotion)
        return target

    def _scatter_target(self, s: L.StatementDef, emitter: ValueEmitter) -> ir.Value:
        """The element a scatter updates (tclang/lang/scatters.py): its subscripts
        evaluated, each checked as a gather's are (never vectorized; in a parallel loop
        the element of a privatized copy, see `colliding_loop`)."""
        subscripts = [T.convert(self.builder, emitter.emit(e), e.dtype, DType.INT64)
                      for e in s.scatter]
        self.check_element(s.target, subscripts, range(len(subscripts)), s)
        return self.element(s.target, subscripts, None)

    def combine(self, op: str, acc: ir.Value, value: ir.Value, dtype: DType) -> ir.Value:
        """A reduction step. Float + and * may be reassociated (the language says reductions
        are associative), so reduction loops vectorize, and contracted with a product into
        an FMA (see ValueEmitter.arith); `Options(reorder_reductions=False)` turns both off."""
        b = self.builder
        flags = ("reassoc", "contract") if self.km.reassociate else ()
        if op == "+":
            return b.fadd(acc, value, flags=flags) if dtype.is_float else b.add(acc, value)
        if op == "*":
            return b.fmul(acc, value, flags=flags) if dtype.is_float else b.mul(acc, value)
        if dtype.is_float:
            # minimumnum/maximumnum ignore a NaN operand as minnum/maxnum do (and order -0 <
            # +0). LLVM 22 vectorizes minnum reductions with a NaN check that, in a loop with
            # early exits (bounds checks), skipped the last iterations: wrong sums of a min
            # (tests/fuzzing/regressions.py); the -num forms vectorize without that check.
            kind = "minimumnum" if op == "min" else "maximumnum"
            name = f"llvm.{kind}.{'f64' if acc.type == T.DOUBLE else 'f32'}"
            return b.call(T.intrinsic(b.module, name, acc.type, [acc.type, acc.type]), [acc, value])
        if dtype is DType.BOOL:
            return b.and_(acc, value) if op == "min" else b.or_(acc, value)
        pick = (b.icmp_signed if dtype.is_signed else b.icmp_unsigned)(
            "<" if op == "min" else ">", value, acc)
        return b.select(pick, value, acc)


class _OnDemand(dict):
    """A dict whose missing keys are made by `make` (and kept) when first looked up."""

    def __init__(self, make):
        super().__init__()
        self.make = make

    def __missing__(self, key):
        value = self[key] = self.make(key)
        return value


def _scratch_strides(buffer: L.Buffer) -> list[ir.Value]:
    """The strides of a scratch buffer (dense, a constant shape): the buffer's own
    (a lanes-first packed operand), else row-major."""
    if buffer.strides:
        return [ir.Constant(T.I64, s) for s in buffer.strides]
    strides, step = [], 1
    for extent in reversed(buffer.shape):
        strides.append(ir.Constant(T.I64, step))
        step *= max(L.evaluate(extent, {}), 1)
    return list(reversed(strides))


def _estimate_work(n: L.Node, loops: frozenset[str] = frozenset()) -> int:
    """Statement instances per iteration of a loop with body `n`. Enclosing loop variables
    count as 0; a trip count that depends on a run-time size counts as 64."""
    match n:
        case L.Block(body=items):
            return max(1, sum(_estimate_work(i, loops) for i in items))
        case L.For(var=v, lo=lo, hi=hi, step=step, body=body):
            env = dict.fromkeys(loops, 0)
            try:
                trips = max(1, (L.evaluate(hi, env) - L.evaluate(lo, env)) // step)
            except KeyError:
                trips = 64
            return min(trips * _estimate_work(body, loops | {v}), 1 << 40)
        case L.If(then=t, other=o):
            return max(_estimate_work(t, loops), _estimate_work(o, loops) if o else 0)
        case L.Scratch(body=body):
            return _estimate_work(body, loops)
    return 1
