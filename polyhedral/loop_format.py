"""Loop IR as readable pseudo-C, for `CompiledKernel.loops` and `tclang explain`."""

from __future__ import annotations

from polyhedral import loop_ir as L
from tclang.lang import program as P
from tclang.lang.program_text import expression_text

_INFIX = {"add": "+", "sub": "-", "mul": "*", "div_nonneg": "/", "rem": "%", "lt": "<",
          "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!=", "and": "&&", "or": "||"}


def format_index(e: L.IExpr) -> str:
    match e:
        case L.Var(name=n):
            return n
        case L.Int(value=v):
            return str(v)
        case L.Op(op="neg", args=(a,)):
            return f"-{_wrap(a)}"
        case L.Op(op="not", args=(a,)):
            return f"!{_wrap(a)}"
        case L.Op(op="floordiv", args=(a, b)):
            return f"floord({format_index(a)}, {format_index(b)})"
        case L.Op(op="floormod", args=(a, b)):
            return f"floormod({format_index(a)}, {format_index(b)})"
        case L.Op(op="min" | "max" as op, args=(a, b)):
            return f"{op}({format_index(a)}, {format_index(b)})"
        case L.Op(op="select", args=(c, a, b)):
            return f"({format_index(c)} ? {format_index(a)} : {format_index(b)})"
        case L.Op(op=op, args=(a, b)):
            return f"{_wrap(a)} {_INFIX[op]} {_wrap(b)}"
    raise ValueError(f"not an index expression: {e!r}")


def _wrap(e: L.IExpr) -> str:
    text = format_index(e)
    return f"({text})" if isinstance(e, L.Op) and e.op in _INFIX else text


def format_value(e: P.Expr) -> str:
    """A statement body's typed expression, as pseudo-C."""
    return expression_text(e, loops=True)


def format_statement(s: L.StatementDef) -> str:
    target = f"{s.target}[{']['.join(s.lhs)}]" if s.lhs else s.target
    if s.scatter:  # the element its subscripts name (tclang/lang/scatters.py)
        target = f"{s.target}[{']['.join(format_value(e) for e in s.scatter)}]"
    if s.kind == "init":
        return f"{target} = {format_value(s.value)}"
    if s.kind == "assign":
        return f"{target} = {format_value(s.value)}"
    if s.op in ("min", "max"):
        return f"{target} = {s.op}({target}, {format_value(s.value)})"
    return f"{target} {s.op}= {format_value(s.value)}"


def format_node(node: L.Node, kernel: L.Kernel | None = None, indent: int = 0) -> str:
    return "\n".join(_lines(node, kernel, indent))


def _lines(node: L.Node, kernel: L.Kernel | None, indent: int):
    pad = "  " * indent
    match node:
        case L.Block(body=items):
            for item in items:
                yield from _lines(item, kernel, indent)
        case L.For(var=v, lo=lo, hi=hi, step=step, body=body):
            notes = [name for name, on in (("parallel", node.parallel),
                                           ("unrolled", node.unrolled),
                                           ("vectorize", node.vectorize),
                                           ("reduction", node.reduction)) if on]
            if node.unroll:
                notes.append(f"unroll {node.unroll}")
            note = f"  // {', '.join(notes)}" if notes else ""
            inc = f"{v}++" if step == 1 else f"{v} += {step}"
            yield (f"{pad}for (int {v} = {format_index(lo)}; {v} < {format_index(hi)}; {inc})"
                   f" {{{note}")
            yield from _lines(body, kernel, indent + 1)
            yield f"{pad}}}"
        case L.If(cond=c, then=t, other=o):
            yield f"{pad}if ({format_index(c)}) {{"
            yield from _lines(t, kernel, indent + 1)
            if o is not None:
                yield f"{pad}}} else {{"
                yield from _lines(o, kernel, indent + 1)
            yield f"{pad}}}"
        case L.Run(statement=sid, indices=idx, promoted=promoted):
            call = f"{sid}({', '.join(format_index(i) for i in idx)})"
            if kernel is not None:
                s = kernel.statement(sid)
                binding = ", ".join(f"{n}={format_index(i)}" for n, i in zip(s.indices, idx))
                call = f"{format_statement(s)};  // {sid}: {binding}" if binding else \
                    f"{format_statement(s)};  // {sid}"
            if promoted:
                call += "  [" + ", ".join(f"ref {p.ref} -> {p.buffer}" for p in promoted) + "]"
            yield pad + call
        case L.Copy(buffer=b, tensor=t, direction=d, index=idx, offset=off):
            local = "][".join(format_index(L.sub(i, o)) for i, o in zip(idx, off))
            glob = "][".join(format_index(i) for i in idx)
            if d == "in":
                yield f"{pad}{b}[{local}] = {t}[{glob}];"
            else:
                yield f"{pad}{t}[{glob}] = {b}[{local}];"
        case L.Combine(op=op, dst=d, dst_index=di, src=src, src_index=si):
            dst = f"{d}[{']['.join(format_index(i) for i in di)}]" if di else d
            source = f"{src}[{']['.join(format_index(i) for i in si)}]" if si else src
            if node.atomic:
                yield f"{pad}atomically {dst} = {op}({dst}, {source});  // blocks share it"
                return
            if op is None:
                yield f"{pad}{dst} = {source};"
            elif op in ("min", "max"):
                yield f"{pad}{dst} = {op}({dst}, {source});"
            else:
                yield f"{pad}{dst} {op}= {source};"
        case L.BlockCombine(op=op, partial=b, count=c):
            yield f"{pad}{b}[0] = {op} over {b}[0:{c}];  // the block's threads together"
        case L.Barrier():
            yield f"{pad}__syncthreads();"
        case L.TileContraction():
            yield from _tile_contraction(node, kernel, indent)
        case L.Scratch(buffers=bufs, body=body):
            yield from _declaring(f"{pad}{{  // per thread:", bufs, "", body, kernel, indent)
        case L.Launch(name=n, grid=g, block=b, buffers=bufs, body=body):
            grid = ", ".join(format_index(x) for x in g)
            head = f"{pad}launch {n}<<<grid({grid}), block({', '.join(map(str, b))})>>> {{"
            yield from _declaring(head, bufs, "__{kind}__ ", body, kernel, indent)


def _tile_contraction(n: L.TileContraction, kernel, indent: int):
    pad = "  " * indent
    bm, bn, bk = n.tile
    engine = "tensor cores" if n.engine == "mma" else "CUDA cores, 8x8 a thread"
    warps = f", {n.warp_tile[0]}x{n.warp_tile[1]} a warp" if n.engine == "mma" else ""
    yield (f"{pad}// a {bm}x{bn} tile of the sum a block, {bk} deep a stage, on the "
           f"{engine}{warps}")
    yield (f"{pad}for ({L.TILE_B} < {format_index(n.batch)}, {L.TILE_M} < "
           f"{format_index(n.rows)}, {L.TILE_N} < {format_index(n.cols)}) {{  // tiled")

    def element(op: L.TileOperand) -> str:
        return f"{op.tensor}[{']['.join(format_index(i) for i in op.index)}]"

    out = f"{n.target}[{']['.join(format_index(i) for i in n.out_index)}]"
    assign = "=" if n.op is None else f"{n.op}="
    yield (f"{pad}  {out} {assign} sum({L.TILE_K} < {format_index(n.depth)}) "
           f"{element(n.a)} * {element(n.b)};")
    for f in n.followers:
        yield from _lines(f, kernel, indent + 1)
    yield f"{pad}}}"


def _declaring(head: str, buffers, qualifier: str, body, kernel, indent: int):
    """A braced region that declares `buffers` (GPU launch, CPU scratch) around `body`."""
    pad = "  " * indent
    yield head
    for buf in buffers:
        dims = "".join(f"[{format_index(d)}]" for d in buf.shape)
        layout = ""
        if buf.strides and list(buf.strides) != sorted(buf.strides, reverse=True):
            layout = f"  // strides ({', '.join(map(str, buf.strides))}): lanes-first"
        yield f"{pad}  {qualifier.format(kind=buf.kind)}{buf.dtype.value} {buf.name}{dims};" \
            + layout
    yield from _lines(body, kernel, indent + 1)
    yield f"{pad}}}"


def _dims(b: L.Buffer) -> str:
    return "".join(f"[{format_index(d)}]" for d in b.shape)


def format_kernel(kernel: L.Kernel) -> str:
    """The whole kernel: its arrays, then its loop nest."""
    lines = [f"// kernel {kernel.name}"]
    if kernel.size_values:
        lines.append("// sizes: " + ", ".join(f"{n}={v}" for n, v in kernel.size_values))
    elif kernel.sizes:
        lines.append("// sizes (at run time): " + ", ".join(kernel.sizes))
    plans = {p.buffer.name: p for p in kernel.temporaries}
    for b in kernel.buffers:
        if b.name not in plans:
            lines.append(f"// {b.kind} {b.dtype.value} {b.name}{_dims(b)}")
    for p in kernel.temporaries:
        b = p.buffer
        what = f"contracted to {p.note}, one per iteration of {p.loop} (per thread)" \
            if p.contracted else f"kept: {p.note}"
        lines.append(f"// temporary {b.dtype.value} {b.name}{_dims(b)}: {what}")
    lines.append(format_node(kernel.body, kernel))
    return "\n".join(lines)
