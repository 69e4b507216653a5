"""Compile time of N independent statements (`O{k}(i) = A(i) + k`), shape-generic or not,
with the time of each stage. `python benchmarks/many_statements.py N [generic]`."""

import sys
import time

import numpy as np

import tclang


def source(n: int) -> str:
    outputs = ", ".join(f"O{k}" for k in range(n))
    body = "\n".join(f"    O{k}(i) = A(i) + {k}.0" for k in range(n))
    return f"def many(float(N) A) -> ({outputs}) {{\n{body}\n}}"


def main(n: int, generic: bool) -> None:
    kernel = tclang.define(source(n), options=tclang.Options(specialize=not generic)).many
    start = time.perf_counter()
    compiled = kernel.compile(np.ones(16, np.float32))
    total = time.perf_counter() - start
    print(f"{n} statements: {total:.2f} s, LLVM IR {len(compiled.source)} chars")
    for stage, seconds in sorted(compiled.timings.items(), key=lambda kv: -kv[1])[:8]:
        print(f"  {stage}: {seconds:.2f} s")


if __name__ == "__main__":
    main(int(sys.argv[1]), len(sys.argv) > 2)
