"""The generated CUDA of every e2e program compiles with nvcc, for sm_80 and sm_90 (PTX).

Runs without a GPU: nvcc is on the developers' and CI's machines; the test skips cleanly
where it is not. Both architectures are compiled in one nvcc call per program, and the
programs in parallel, to keep the run short on 2 cores.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import warnings
from concurrent.futures import ThreadPoolExecutor

import pytest

from backends.cuda.codegen import PRELUDE, generate
from polyhedral.pipeline import _row_major, schedule_definition, with_choices
from tclang.errors import TCWarning
from tclang.lang.frontend import check_source
from tclang.layouts import Layout
from tclang.options import Options
from tclang.lang.program import evaluate_shape
from tclang.target import Target
from tests.corpus import CASES

NVCC = shutil.which("nvcc")
GPU = Target("cuda", "grid", arch="sm_90")
ARCHS = ("-gencode", "arch=compute_80,code=compute_80",
         "-gencode", "arch=compute_90,code=compute_90")


def _source(case, options: Options) -> str:
    with warnings.catch_warnings():  # the corpus's own warnings are checked elsewhere
        warnings.simplefilter("ignore", TCWarning)
        program = check_source(case.source)
    defn = program[case.entry]
    sizes = case.shapes[0] if options.specialize else None
    kernel = schedule_definition(defn, sizes, options, GPU).kernel
    layouts = None  # as the runtime passes them: row-major inputs
    if sizes is not None:
        layouts = tuple(Layout(_row_major(list(evaluate_shape(t.shape, sizes))))
                        for t in defn.inputs)
    return generate(with_choices(kernel, options, GPU, layouts)).text


def _compile(text: str) -> tuple[int, str]:
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "kernel.cu")
        with open(path, "w") as f:
            f.write(text)
        result = subprocess.run([NVCC, "--fatbin", *ARCHS, "-std=c++17", path, "-o",
                                 os.path.join(tmp, "kernel.fatbin")],
                                capture_output=True, text=True, timeout=300)
        return result.returncode, result.stderr


# shape-generic code for a sample of programs (every one would double the source)
_GENERIC = {"matmul", "batch_matmul", "convolution", "softmax", "layernorm", "lut",
            "bfloat16_matmul"}


def _sources() -> dict[tuple[str, str], str]:
    jobs = {}
    for case in CASES:
        for label, options in (("specialized", Options()), ("generic", Options(specialize=False))):
            if label == "generic" and case.name not in _GENERIC:
                continue
            jobs[(case.name, label)] = _source(case, options)
    return jobs


@pytest.fixture(scope="module")
def compiled():
    """All programs in one translation unit (the helpers once, kernel names made unique):
    one nvcc call. Only if that fails is each program compiled alone, to name the culprit."""
    if NVCC is None:
        pytest.skip("nvcc is not installed")
    jobs = _sources()
    prelude = PRELUDE
    parts = [prelude]
    for k, text in enumerate(jobs.values()):
        assert text.startswith(prelude)
        parts.append(text[len(prelude):].replace("tclang_", f"tclang_p{k}_"))
    code, errors = _compile("\n".join(parts))
    if code == 0:
        return jobs, {key: (0, "") for key in jobs}
    with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2)) as pool:
        return jobs, dict(zip(jobs, pool.map(_compile, jobs.values())))


@pytest.mark.parametrize("name", [c.name for c in CASES])
def test_nvcc_compiles_for_sm80_and_sm90(compiled, name):
    jobs, results = compiled
    for (case, label), (code, errors) in results.items():
        if case == name:
            assert code == 0, f"{name} ({label}):\n{errors}\n{jobs[(case, label)][:3000]}"


def test_index_arithmetic_is_32_bit_where_it_fits():
    """Specialized code whose sizes and offsets fit in 2^30 indexes in int (the GPU's
    native width); shape-generic code, whose sizes are only known at run time, in 64 bits.
    (Sizes past 2^30 are in tests/e2e/test_big_indices.py.)"""
    jobs = _sources()
    assert "const int i_" in jobs[("matmul", "specialized")]
    assert "long long i_" not in jobs[("matmul", "specialized")]
    assert "const long long i_" in jobs[("matmul", "generic")]
