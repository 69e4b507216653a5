"""The loop IR (and final schedule) of every benchmark and test-corpus kernel, as text, so
that a change to the middle end can be shown not to change any of them.

    python benchmarks/loop_ir_dump.py OUT.txt [--quick]
    diff before.txt after.txt   # must print nothing

Each kernel is scheduled for fixed targets (not the machine's: the dump of one commit must
not depend on where it runs): an AVX-512 CPU with 2 cores, an AVX2 CPU with 8, a GPU, and
the reference interpreter; specialized at each corpus shape (benchmark kernels at a small
and a large size) and shape-generic; with the automatic options, with
`reorder_reductions=False` (reductions in program order: other dependences) and with
`fusion="min"`. `--quick` keeps the first target and option set only.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import kernels as K  # noqa: E402
from polyhedral.loop_format import format_kernel  # noqa: E402
from polyhedral.pipeline import schedule_definition  # noqa: E402
from tclang.runtime.arguments import bind_arguments  # noqa: E402
from tclang.errors import TCError  # noqa: E402
from tclang.lang.frontend import check_source  # noqa: E402
from tclang.options import Options  # noqa: E402
from tclang.target import Target, reference_target  # noqa: E402
from tests.corpus import CASES  # noqa: E402

TARGETS = {
    "avx512x2": Target("cpu", "threads", arch="dump", cores=2, vector_bytes=64,
                       l1_bytes=48 * 1024, l2_bytes=2 * 1024 * 1024),
    "avx2x8": Target("cpu", "threads", arch="dump", cores=8, vector_bytes=32),
    "gpu": Target("cuda", "grid", arch="sm_80"),
    "reference": reference_target(),
}
OPTIONS = {
    "auto": Options(),
    "ordered": Options(reorder_reductions=False),
    "min": Options(fusion="min"),
}

BENCHMARK_SIZES = [
    ("matmul", K.MATMUL, [dict(M=64, K=48, N=80), dict(M=1024, K=1024, N=1024)]),
    ("matmul_ta", K.MATMUL_TRANSPOSED_A, [dict(M=64, K=48, N=80), dict(M=1024, K=1024, N=1024)]),
    ("mlp_layer", K.MLP_LAYER, [dict(B=16, I=32, O=24), dict(B=1024, I=1024, O=1024)]),
    ("mlp3", K.MLP3, [dict(B=16, I=32, H=24, O=8), dict(B=1024, I=1024, H=1024, O=1024)]),
    ("chain", K.CHAIN, [dict(N=1000), dict(N=1 << 24)]),
    ("softmax", K.SOFTMAX, [dict(N=16, D=40), dict(N=4096, D=1024)]),
    ("layernorm", K.LAYERNORM, [dict(N=16, D=40), dict(N=4096, D=1024)]),
    ("conv2d", K.CONV2D, [dict(N=1, C=3, H=10, W=12, M=4, KH=3, KW=3),
                          dict(N=8, C=64, H=58, W=58, M=64, KH=3, KW=3)]),
    ("bmm", K.BMM, [dict(B=2, N=8, M=16, K=12), dict(B=64, N=128, M=128, K=128)]),
    ("conv1x1", K.CONV2D_1X1, [dict(N=1, C=3, H=5, W=6, M=4),
                               dict(N=8, C=64, H=56, W=56, M=64)]),
    ("attention", K.ATTENTION, [dict(S=16, D=8, T=12, E=8), dict(S=1024, D=64, T=1024, E=64)]),
    ("rmsnorm", K.RMSNORM, [dict(N=16, D=40), dict(N=4096, D=1024)]),
    ("bias_gelu", K.BIAS_GELU, [dict(N=16, D=40), dict(N=4096, D=1024)]),
]


def kernels():
    """(label, definition, [sizes...]) of every benchmark and corpus kernel."""
    for name, source, sizes in BENCHMARK_SIZES:
        yield f"benchmark {name}", check_source(source).definitions[0], sizes
    rng = np.random.default_rng(0)
    for case in CASES:
        program = check_source(case.source)
        defn = next(d for d in program.definitions if d.name == case.entry)
        sizes = []
        for shape in case.shapes:
            try:
                sizes.append(bind_arguments(defn, case.make_inputs(shape, rng)).sizes)
            except TCError as err:  # a case about bad arguments: nothing to schedule
                sizes.append(f"arguments refused: {type(err).__name__}")
        yield f"corpus {case.name}", defn, sizes


def dump_one(defn, sizes, options, target) -> str:
    try:
        scheduled = schedule_definition(defn, sizes, options, target)
    except TCError as err:
        return f"refused: {type(err).__name__}: {str(err).splitlines()[0]}"
    return (f"strategy: {scheduled.strategy} (fallback: {scheduled.fallback})\n"
            f"{scheduled.schedule}\n{format_kernel(scheduled.kernel)}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    targets = list(TARGETS.items())[:1] if args.quick else list(TARGETS.items())
    options = list(OPTIONS.items())[:1] if args.quick else list(OPTIONS.items())
    start, count = time.perf_counter(), 0
    with open(args.out, "w") as out:
        for label, defn, all_sizes in kernels():
            for tname, target in targets:
                for oname, opts in options:
                    for sizes in list(all_sizes) + [None]:
                        if isinstance(sizes, str):
                            text = sizes
                        else:
                            text = dump_one(defn, sizes, opts, target)
                        size_text = "generic" if sizes is None else sizes
                        out.write(f"==== {label} | {tname} | {oname} | {size_text}\n"
                                  f"{text}\n")
                        count += 1
    print(f"{count} kernels dumped to {args.out} in {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
