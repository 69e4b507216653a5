"""Helpers for asserting properties of loop IR (not of printed text)."""

import itertools

from polyhedral import loop_ir as L


def enclosing_loops(node, statement: str, chain=()):
    """For each Run of `statement`, the chain of For nodes around it, outermost first."""
    match node:
        case L.Run(statement=s) if s == statement:
            yield chain, node
        case L.For(body=b):
            yield from enclosing_loops(b, statement, chain + (node,))
        case L.Launch(body=b) | L.Scratch(body=b):
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


def executed_instances(kernel: L.Kernel, max_iterations: int = 10**6,
                       sizes: dict[str, int] | None = None) -> dict[str, list[tuple[int, ...]]]:
    """Every statement instance a kernel runs, in order, found by walking its loops: a
    specialized kernel's sizes are numbers, a shape-generic one's come from `sizes`. A GPU
    launch runs its body once for each block and thread, one after another (its barriers
    and the steps of its block reductions run no statement). Loops running more than
    `max_iterations` iterations in all (guarded iterations included) raise AssertionError
    rather than walk on."""
    found: dict[str, list[tuple[int, ...]]] = {}
    iterations = 0

    def walk(node, env):
        nonlocal iterations
        match node:
            case L.Run(statement=s, indices=args):
                found.setdefault(s, []).append(tuple(L.evaluate(a, env) for a in args))
            case L.For(var=v, lo=lo, hi=hi, step=step, body=b):
                trips = range(L.evaluate(lo, env), L.evaluate(hi, env), step)
                iterations += len(trips)
                assert iterations <= max_iterations, \
                    f"loops run over {max_iterations} iterations ({v}: {len(trips)} trips)"
                for value in trips:
                    walk(b, {**env, v: value})
            case L.If(cond=c, then=t, other=o):
                if L.evaluate(c, env):
                    walk(t, env)
                elif o is not None:
                    walk(o, env)
            case L.Block(body=items):
                for item in items:
                    walk(item, env)
            case L.Scratch(body=b):
                walk(b, env)
            case L.Launch(grid=grid, block=block, body=b):
                blocks = [range(L.evaluate(g, env)) for g in grid]
                for ids in itertools.product(*blocks, *(range(t) for t in block)):
                    names = [f"b{k}" for k in range(len(grid))] + \
                        [f"t{k}" for k in range(len(block))]
                    walk(b, {**env, **dict(zip(names, ids))})

    walk(kernel.body, dict(sizes or {}))
    return found
