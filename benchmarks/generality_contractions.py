"""Random contractions for the generality benchmark: `Z(...) +=! X(...) * Y(...)` with
2-6 indices per operand and result, every operand's and the result's indices in a random order,
several free and reduction indices, and extents drawn so that the whole costs about a
given number of floating-point operations (the runner's default is 5-50 ms in NumPy).

What tensor-contraction benchmarks (TCCG, the chemistry and tensor-network suites) are
made of: a matmul in disguise whose stride-1 indices are anywhere. Each case is written
both as a tclang definition and as an einsum string (the same letters).
"""

from __future__ import annotations

import math
import random

from benchmarks.generality_cases import Case, einsum_reference

LETTERS = "abcdefghijklmnopqrstuvw"  # x, y, z name tensors; sizes are the upper case
SMALL = 1e5  # flops below which a case is a test's, not a measurement
MAX_ELEMENTS = 1 << 23  # per operand and result (32 MB): a contraction, not a copy


def contraction(rng: random.Random, flops: float) -> Case:
    """One random contraction of about `flops` operations (a multiply and an add per
    point of the iteration space)."""
    while True:
        batch, free_x, free_y, red = (rng.randint(0, 1), rng.randint(1, 3), rng.randint(1, 3),
                                      rng.randint(1, 3))
        if 2 <= batch + free_x + red <= 6 and 2 <= batch + free_y + red <= 6 and \
                batch + free_x + free_y <= 6:
            break
    names = rng.sample(LETTERS, batch + free_x + free_y + red)
    b, fx = names[:batch], names[batch:batch + free_x]
    fy = names[batch + free_x:batch + free_x + free_y]
    r = names[batch + free_x + free_y:]
    x, y, z = b + fx + r, b + fy + r, b + fx + fy
    for ix in (x, y, z):
        rng.shuffle(ix)
    extents = _extents(rng, names, flops)
    if max(math.prod(extents[i] for i in ix) for ix in (x, y, z)) > MAX_ELEMENTS:
        return contraction(rng, flops)  # an operand too large for its work: draw again
    return _case(x, y, z, extents)


def _extents(rng: random.Random, names: list[str], flops: float) -> dict[str, int]:
    """Extents whose product is about flops / 2: log-weights drawn at random, so some
    indices are short (2-8) and others long, odd and prime extents included."""
    weights = [rng.uniform(0.3, 1.7) for _ in names]
    total = math.log(max(flops / 2, 2.0))
    extents = {}
    for n, w in zip(names, weights):
        extents[n] = max(2, round(math.exp(total * w / sum(weights))))
    if flops < SMALL and rng.random() < 0.4:  # the small cases (tests) meet extent 1 too
        extents[rng.choice(names)] = 1
    return extents


def _case(x: list[str], y: list[str], z: list[str], extents: dict[str, int]) -> Case:
    spec = f"{''.join(x)},{''.join(y)}->{''.join(z)}"

    def param(t, ix):
        return f"float({', '.join(i.upper() for i in ix)}) {t}"

    source = (f"def contraction({param('X', x)}, {param('Y', y)}) -> (Z) {{\n"
              f"    Z({', '.join(z)}) +=! X({', '.join(x)}) * Y({', '.join(y)})\n}}")
    sizes = " ".join(f"{i}={extents[i]}" for i in sorted(extents))
    return Case("contraction", f"{spec} [{sizes}]", source, "contraction",
                (tuple(extents[i] for i in x), tuple(extents[i] for i in y)),
                einsum_reference(spec), einsum=spec, origin="random contraction")


def contractions(seed: int, count: int, flops: tuple[float, float]) -> list[Case]:
    """`count` random contractions, each of a cost drawn log-uniformly in `flops`."""
    rng = random.Random(seed)
    lo, hi = math.log(flops[0]), math.log(flops[1])
    return [contraction(rng, math.exp(rng.uniform(lo, hi))) for _ in range(count)]
