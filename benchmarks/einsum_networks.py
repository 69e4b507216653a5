"""Tensor networks written as one definition, a statement per contraction step: how an
einsum path (opt_einsum, the einsum benchmarks) runs as a tclang program.

    python benchmarks/einsum_networks.py STEPS [STEPS...] [--seed S] [--run] [--show]

A network of STEPS + 1 input tensors of 2 to 4 indices each, connected (a random spanning
tree of shared indices, then random extra sharing, both between tensors near each other in
the list) with a few open indices that are the output's; the path contracts a pair of
tensors that share an index at each step, the pair whose result has the fewest indices
(ties at random: opt_einsum's greedy path in spirit).
Each step is one statement, `T3(i0, i5) +=! T1(i0, i2) * X4(i2, i5)`; the last writes the
output. `--run` also calls it on random inputs and compares with NumPy's einsum, step by
step; `--show` prints the source.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from dataclasses import dataclass

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@dataclass(frozen=True)
class Network:
    source: str
    inputs: tuple[tuple[str, ...], ...]  # each input's indices
    steps: tuple[tuple[int, int, tuple[str, ...]], ...]  # (left, right, result's indices)
    extents: dict[str, int]  # each index's extent

    def arrays(self, seed: int = 0) -> list[np.ndarray]:
        """Random inputs whose contraction stays near 1 however many steps: values near
        1 scaled by extent ** -(rank / 2), so that each contracted index (two tensors'
        factors, summed over its extent) contributes a factor near 1."""
        rng = np.random.default_rng(seed)
        arrays = []
        for ix in self.inputs:
            shape = [self.extents[i] for i in ix]
            scale = float(np.prod(shape)) ** -0.5
            arrays.append((rng.uniform(0.9, 1.1, shape) * scale).astype(np.float32))
        return arrays

    def reference(self, arrays: list[np.ndarray]) -> np.ndarray:
        """The same path by np.einsum, in float64."""
        pool = [(a.astype(np.float64), ix) for a, ix in zip(arrays, self.inputs)]
        for left, right, out in self.steps:
            (a, ai), (b, bi) = pool[left], pool[right]
            letters = {i: chr(ord("a") + k) for k, i in enumerate(dict.fromkeys(ai + bi))}
            x, y, z = ("".join(letters[i] for i in ix) for ix in (ai, bi, out))
            pool.append((np.einsum(f"{x},{y}->{z}", a, b), out))
        return pool[-1][0].astype(np.float32)


LOCALITY = 4
"""Tensors share indices only with the few before and after them (a lattice more than a
random graph, as circuits and lattice models are): the greedy path's intermediates then
keep a bounded number of indices, as a path that can run must (a random graph's grew
to 39 indices over 177 steps: 2^39 elements)."""


def network(steps: int, seed: int = 0, extent: int = 2, open_indices: int = 2) -> Network:
    """A random connected network of `steps` + 1 tensors and its greedy contraction path."""
    rng = random.Random(seed)
    n = steps + 1
    ranks = [rng.randint(2, 4) for _ in range(n)]
    tensors: list[list[str]] = [[] for _ in range(n)]
    names = iter(f"i{k}" for k in range(10**6))
    for k in range(1, n):  # a spanning tree: each tensor shares an index with a recent one
        near = range(max(0, k - LOCALITY), k)
        other = rng.choice([j for j in near if len(tensors[j]) < ranks[j]] or near)
        index = next(names)
        tensors[k].append(index)
        tensors[other].append(index)
    for k in rng.sample(range(n), min(open_indices, n)):  # the output's indices
        tensors[k].append(next(names))
    for k in range(n):  # more sharing, up to each tensor's rank, with the next few tensors
        while len(tensors[k]) < ranks[k]:
            near = [j for j in range(k + 1, min(n, k + 1 + LOCALITY))
                    if len(tensors[j]) < ranks[j]]
            if not near:
                break
            index = next(names)
            tensors[k].append(index)
            tensors[rng.choice(near)].append(index)
    open_set = {i for ix in tensors for i in ix if sum(i in t for t in tensors) == 1}
    pool = {k: tuple(ix) for k, ix in enumerate(tensors)}
    path = []
    for _ in range(steps):
        pairs = [(a, b) for a in pool for b in pool if a < b and set(pool[a]) & set(pool[b])]
        scored = []
        for a, b in pairs:
            rest = {i for k, ix in pool.items() if k not in (a, b) for i in ix} | open_set
            out = tuple(dict.fromkeys(i for i in pool[a] + pool[b] if i in rest))
            scored.append((len(out), rng.random(), a, b, out))
        _, _, a, b, out = min(scored)
        path.append((a, b, out))
        del pool[a], pool[b]
        pool[len(tensors) + len(path) - 1] = out
    extents = {i: extent for ix in tensors for i in ix}
    return Network(_source(tensors, path), tuple(tuple(t) for t in tensors), tuple(path),
                   extents)


def _source(tensors: list[list[str]], path) -> str:
    params = ", ".join(f"float({', '.join('D' + i[1:] for i in ix)}) X{k}"
                       for k, ix in enumerate(tensors))
    names = [f"X{k}" for k in range(len(tensors))]
    indices = [tuple(ix) for ix in tensors]
    body = []
    for step, (a, b, out) in enumerate(path):
        name = "O" if step == len(path) - 1 else f"T{step}"
        op = "+=!" if (set(indices[a]) | set(indices[b])) - set(out) else "="
        body.append(f"    {name}({', '.join(out)}) {op} {names[a]}({', '.join(indices[a])})"
                    f" * {names[b]}({', '.join(indices[b])})")
        names.append(name)
        indices.append(out)
    return f"def network({params}) -> (O) {{\n" + "\n".join(body) + "\n}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("steps", type=int, nargs="+")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--run", action="store_true", help="call it and compare with NumPy")
    ap.add_argument("--show", action="store_true", help="print the source")
    args = ap.parse_args()
    import tclang
    for steps in args.steps:
        net = network(steps, args.seed)
        if args.show:
            print(net.source)
        kernel = tclang.define(net.source).network
        arrays = net.arrays()
        start = time.perf_counter()
        compiled = kernel.compile(*arrays)
        seconds = time.perf_counter() - start
        top = sorted(compiled.timings.items(), key=lambda kv: -kv[1])[:4]
        print(f"{steps} steps: {seconds:.2f} s ("
              + ", ".join(f"{stage} {t:.2f}" for stage, t in top) + ")", flush=True)
        if args.run:
            np.testing.assert_allclose(kernel(*arrays), net.reference(arrays), rtol=1e-4)
            print("  matches NumPy's einsum")


if __name__ == "__main__":
    main()
