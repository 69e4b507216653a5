"""Helpers for asserting properties of loop IR (not of printed text)."""

from polyhedral import loop_ir as L


def enclosing_loops(node, statement: str, chain=()):
    """For each Run of `statement`, the chain of For nodes around it, outermost first."""
    match node:
        case L.Run(statement=s) if s == statement:
            yield chain, node
        case L.For(body=b):
            yield from enclosing_loops(b, statement, chain + (node,))
        case L.Launch(body=b):
            yield from enclosing_loops(b, statement, chain)
        case L.If(then=t, other=o):
            yield from enclosing_loops(t, statement, chain)
            if o is not None:
                yield from enclosing_loops(o, statement, chain)
        case L.Block(body=items):
            for item in items:
                yield from enclosing_loops(item, statement, chain)


def top_level(kernel: L.Kernel):
    body = kernel.body
    return list(body.body) if isinstance(body, L.Block) else [body]


def nest_of(kernel: L.Kernel, statement: str):
    """The top-level node containing `statement`."""
    for node in top_level(kernel):
        if any(True for _ in enclosing_loops(node, statement)):
            return node
    raise KeyError(statement)


def uses(e: L.IExpr, var: str) -> bool:
    return var in L.variables(e)
