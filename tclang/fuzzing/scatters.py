"""Scatter programs (tclang/lang/scatters.py) for the differential fuzzer, from templates.

A gathered subscript on the left, `O(Ids(i), d) op rhs`, with op `+=!`, `max=!`,
`min=!`, or `=` to initialize then `+=`, `max=`, `min=`; index tensors of rank 1 or 2,
whose values `tclang.tools.inputs.random_inputs` keeps inside the target (and repeats: few rows,
many lookups); a value that may gather too (`Tab(Ids(i), d)`); and sometimes a statement
after the scatter that reads all of its target, or one before it that the scatter reads.
float32, float64, int32 and half. They are `Model`s like the generic ones, so the shrinker
works on them; their `family` is "scatter".
"""

from __future__ import annotations

import random

from tclang.fuzzing.generator import (STATS, Decl, Features, GeneratedProgram, Model, Node,
                                      Stmt, checked_draw, fits)

EXTENTS = (1, 1, 2, 3, 5, 7, 11, 13, 17, 31, 33, 64)
VOLUME = 20_000
MANY_VOLUME = 160_000  # a draw with many updates (the reference runs ~150,000 a second)
# the fewest updates the CPU runs on threads (polyhedral/scatter_loops.py, which the tools
# may not import; a test holds the two equal)
PARALLEL_UPDATES = 1 << 15
_ZERO = {"float": "0.0", "double": "double(0.0)", "int32": "0", "half": "half(0.0)"}


def scatter_program(rng: random.Random) -> GeneratedProgram | None:
    """A random scatter program (None if the draw does not check or fit: draw again)."""
    # half too: its sums took the float32-accumulator rewrite, which a scatter broke
    # (fuzz seed 2030, program 724)
    model = _model(rng, rng.choice(("float", "float", "double", "int32", "half")))
    STATS["attempts"] += 1
    defn = checked_draw(model, "scatter: ")
    if defn is None:
        return None
    many = rng.random() < 0.25
    for _ in range(30):
        sizes = {s: rng.choice(EXTENTS) for s in defn.sizes}
        cap = VOLUME
        if many:
            # enough updates into a small target that the CPU runs the scatter on threads,
            # into private copies merged at the end (polyhedral/scatter_loops.py:
            # PARALLEL_UPDATES, PRIVATE_ELEMENTS); else no draw reaches that path
            rows = sizes.get("L", 1)
            sizes["N"] = -(-PARALLEL_UPDATES // rows) + rng.choice((0, 1, 7))
            if "D" in sizes:
                sizes["D"] = rng.choice((1, 2, 3))
            cap = MANY_VOLUME
        if fits(defn, sizes, cap):
            STATS["programs"] += 1
            return GeneratedProgram(model.render(), model.name, sizes, model,
                                    Features(family="scatter", volume_cap=cap))
    return None


def _model(rng: random.Random, dtype: str) -> Model:
    """Ids(N) or Ids(N, L); X the values per lookup; Tab(E, D) the target's shape."""
    two = rng.random() < 0.4
    wide = rng.random() < 0.6  # a row per lookup (O(Ids(i), d)) or one element
    point = ("i", "l") if two else ("i",)
    ids_dims = ("N", "L") if two else ("N",)
    x_dims = ids_dims + (("D",) if wide else ())
    lhs = [f"Ids({', '.join(point)})"] + (["d"] if wide else [])
    tab_dims = ("E", "D") if wide else ("E",)
    inputs = [Decl("Ids", "int32", ids_dims), Decl("X", dtype, x_dims),
              Decl("Tab", dtype, tab_dims)]
    x = f"X({', '.join(point + (('d',) if wide else ()))})"
    value = _value(rng, x, dtype, lhs if rng.random() < 0.3 else None)
    op = rng.choices(("+=!", "max=!", "min=!", "+=", "max=", "min="), (40, 12, 12, 18, 9, 9))[0]
    body = []
    out = ("O", tuple(f"e{k}" for k in range(len(tab_dims))))
    if not op.endswith("!"):  # an initialization over the whole target, read or a constant
        init = f"Tab({', '.join(out[1])})" if rng.random() < 0.6 else _ZERO[dtype]
        body.append(Stmt(out[0], out[1], "=", Node(init)))
    body.append(Stmt(out[0], tuple(lhs), op, Node(value)))
    outputs = [Decl("O", dtype, tab_dims)]
    if rng.random() < 0.4:  # a statement after it reads all of O
        reduce = "+=!" if dtype != "int32" or op.startswith("+") else "max=!"
        body.append(Stmt("S", ("e0",), reduce, Node(f"O({', '.join(out[1])})")))
        outputs.append(Decl("S", None))
    return Model(rng.choice(("scatter", "hist", "embed_back")), tuple(inputs), tuple(outputs),
                 tuple(body))


def _value(rng: random.Random, x: str, dtype: str, gather: list[str] | None) -> str:
    """What each lookup adds (or maxes): X, a function of it, maybe times a gathered row."""
    if dtype == "int32":
        value = rng.choice((x, f"{x} * 2", f"({x} % 3)", "1"))
    else:
        value = rng.choice((x, x, f"{x} * 0.5", f"tanh({x})", "1.0"))
    if gather is not None:  # the table at the same point: a gather on the right too
        value = f"{value} + Tab({', '.join(gather)})"
    return f"half({value})" if dtype == "half" else value
