"""Survey: compile generated programs shape-generic (specialize=False) and print each one's
LLVM IR size, loop-IR size and compile time, worst first; each program in a subprocess under
a time limit. `python benchmarks/generic_compile_size.py SEED COUNT [SECONDS]`."""

import json
import multiprocessing as mp
import random
import resource
import sys
import time
import warnings


def _measure(seed, k, queue):
    import numpy as np
    import tclang
    from tclang.fuzzing.generator import generate
    from tclang.fuzzing.differential import _checked
    from tclang.tools.inputs import random_inputs
    warnings.simplefilter("ignore")
    program = generate(random.Random(f"{seed}:{k}"))
    defn = _checked(program)
    sizes = {s: program.sizes[s] for s in defn.sizes if s in program.sizes}
    inputs = random_inputs(defn, sizes, np.random.default_rng(0))
    kernel = tclang.define(program.source, options=tclang.Options(specialize=False))[program.entry]
    start = time.perf_counter()
    try:
        compiled = kernel.compile(*inputs)
        ir, loops = len(compiled.source), len(compiled.loops)
    except Exception as err:  # noqa: BLE001 - a survey: report and go on
        ir, loops = -1, type(err).__name__ + ": " + str(err).splitlines()[0][:80]
    queue.put((time.perf_counter() - start, ir, loops,
               resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024))


def main(seed, count, limit=30.0):
    rows = []
    for k in range(count):
        queue = mp.Queue()
        proc = mp.Process(target=_measure, args=(seed, k, queue))
        proc.start()
        proc.join(limit)
        if proc.is_alive():
            proc.kill()
            proc.join()
            rows.append((f"{seed}:{k}", limit, "timeout", "", ""))
        else:
            rows.append((f"{seed}:{k}",) + queue.get())
        print(*rows[-1], flush=True, file=sys.stderr)
    rows.sort(key=lambda r: -r[1])
    for row in rows[:15]:
        print(json.dumps(row))


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]) if len(sys.argv) > 3 else 30.0)
