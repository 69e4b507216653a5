"""`tclang export`: the shared library runs from a C program compiled with the system
compiler, with no Python in the process, and gives NumPy's results; bad sizes and a gather
out of its tensor come back as status codes with tclang's messages."""

from __future__ import annotations

import shutil
import subprocess
import sys

import numpy as np
import pytest

import tclang
from tests.corpus import CASES_BY_NAME, assert_close, make_inputs

pytestmark = pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None,
                                reason="no C compiler")

STATUS = {"ok": 0, "bad_argument": 1, "bad_sizes": 2, "index_error": 3}


def driver_source(defn, inputs, strides=None) -> str:
    """A C program that reads the inputs from in<k>.bin, asks the library for each output's
    shape, calls it and writes out<k>.bin; it prints the status and the error message."""
    from tclang.export.c_text import C_TYPES
    name = defn.name
    lines = ["#include <stdio.h>", "#include <stdlib.h>", "#include <string.h>",
             f'#include "{name}.h"',
             "static void *load(const char *path, size_t bytes) {",
             "    void *p = malloc(bytes ? bytes : 1); FILE *f = fopen(path, \"rb\");",
             "    if (!f || fread(p, 1, bytes, f) != bytes) { perror(path); exit(90); }",
             "    fclose(f); return p;", "}",
             "int main(void) {"]
    for k, (t, a) in enumerate(zip(defn.inputs, inputs)):
        c = C_TYPES[t.dtype]
        dims = ", ".join(str(d) for d in a.shape) or "0"
        lines.append(f"    int64_t {t.name}_sizes[] = {{{dims}}};")
        given = strides[k] if strides is not None else None
        if given is not None:
            lines.append(f"    int64_t {t.name}_strides[] = {{{', '.join(map(str, given))}}};")
        stride_arg = f"{t.name}_strides" if given is not None else "NULL"
        lines.append(f"    {c} *{t.name} = load(\"in{k}.bin\", {a.nbytes if given is None else a.base.nbytes});")
        lines.append(f"    const int64_t *{t.name}_st = {stride_arg};")
    shape_args = ", ".join(f"{t.name}_sizes" for t in defn.inputs)
    for k, t in enumerate(defn.outputs):
        c = C_TYPES[t.dtype]
        lines += [f"    int64_t {t.name}_sizes[{max(1, t.rank)}];",
                  f"    int s{k} = tclang_{name}_output_shape({k}, {shape_args}, {t.name}_sizes);",
                  f"    if (s{k}) {{ printf(\"%d %s\\n\", s{k}, tclang_{name}_error()); return 0; }}",
                  f"    size_t n{k} = 1; for (int d = 0; d < {t.rank}; d++) n{k} *= {t.name}_sizes[d];",
                  f"    {c} *{t.name} = malloc(n{k} * sizeof({c}) + 1);",
                  f"    memset({t.name}, 0x7f, n{k} * sizeof({c}));"]  # garbage, not zeros
    args = [f"{t.name}, {t.name}_sizes, {t.name}_st" for t in defn.inputs]
    args += [f"{t.name}, {t.name}_sizes, NULL" for t in defn.outputs]
    lines.append(f"    int status = tclang_{name}({', '.join(args)});")
    lines.append(f"    printf(\"%d %s\\n\", status, tclang_{name}_error());")
    for k, t in enumerate(defn.outputs):
        lines.append(f"    {{ FILE *f = fopen(\"out{k}.bin\", \"wb\"); "
                     f"fwrite({t.name}, sizeof(*{t.name}), n{k}, f); fclose(f); }}")
    lines += ["    return 0;", "}"]
    return "\n".join(lines) + "\n"


def build_driver(lib, defn, inputs, folder, strides=None):
    (folder / "driver.c").write_text(driver_source(defn, inputs, strides))
    compiler = shutil.which("cc") or shutil.which("gcc")
    subprocess.run([compiler, "-std=c11", "-Wall", "-Werror", "-o", "driver", "driver.c",
                    f"-I{lib.header.parent}", f"-L{lib.library.parent}",
                    f"-ltclang_{defn.name}", f"-Wl,-rpath,{lib.library.parent}"],
                   cwd=folder, check=True, capture_output=True)
    return folder / "driver"


def run_driver(driver, defn, inputs, folder, strides=None):
    """(status, message, outputs): the driver run as its own process (no Python in it)."""
    for k, a in enumerate(inputs):
        (a if strides is None or strides[k] is None else a.base).tofile(folder / f"in{k}.bin")
    done = subprocess.run([str(driver)], cwd=folder, capture_output=True, text=True,
                          timeout=120, env={"TCLANG_NUM_THREADS": "2"})
    assert done.returncode == 0, done.stderr
    status, _, message = done.stdout.strip().partition(" ")
    outputs = []
    if int(status) == 0:
        sizes = {}
        for t, a in zip(defn.inputs, inputs):
            for extent, actual in zip(t.shape, a.shape):
                sizes[str(extent)] = actual
        for k, t in enumerate(defn.outputs):
            shape = tuple(d.evaluate(sizes) for d in t.shape)
            outputs.append(np.fromfile(folder / f"out{k}.bin", dtype=t.dtype.numpy)
                           .reshape(shape))
    return int(status), message, tuple(outputs)


EXPORTED = [("matmul", {"M": 67, "K": 61, "N": 71}), ("conv2d_stride2", None),
            ("softmax", {"N": 11, "D": 4}), ("embedding", None), ("batchnorm", None),
            ("layernorm", None), ("moments", None)]


@pytest.mark.parametrize("generic", [False, True], ids=["specialized", "generic"])
@pytest.mark.parametrize("case_name,shape", EXPORTED, ids=[c for c, _ in EXPORTED])
def test_exported_library_matches_numpy_without_python(case_name, shape, generic, tmp_path):
    case = CASES_BY_NAME.get(case_name) or next(
        c for n, c in CASES_BY_NAME.items() if n.startswith(case_name))
    shape = shape or case.shapes[-1]
    module = tclang.define(case.source)
    defn = module[case.entry].definition
    sizes = None if generic else {s: shape[s] for s in defn.sizes}
    lib = module[case.entry].export(tmp_path / "lib", sizes)
    inputs = make_inputs(case, shape)
    driver = build_driver(lib, defn, inputs, tmp_path)
    status, message, outputs = run_driver(driver, defn, inputs, tmp_path)
    assert status == STATUS["ok"], message
    assert_close(outputs, case.reference(*inputs), case)
    if generic:  # the same library for other sizes, prime and size-1 extents among them
        for other in case.shapes[:-1]:
            inputs = make_inputs(case, other)
            driver = build_driver(lib, defn, inputs, tmp_path)
            status, message, outputs = run_driver(driver, defn, inputs, tmp_path)
            assert status == STATUS["ok"], message
            assert_close(outputs, case.reference(*inputs), case)
    else:  # other sizes are refused, with what to do
        other = {k: v + 1 for k, v in shape.items()}
        inputs = make_inputs(case, other)
        driver = build_driver(lib, defn, inputs, tmp_path)
        status, message, _ = run_driver(driver, defn, inputs, tmp_path)
        assert status == STATUS["bad_sizes"] and "--generic" in message, message


def test_generic_library_takes_strided_inputs(tmp_path):
    """A transposed view goes in as it is (its strides), as a NumPy call takes it."""
    case = CASES_BY_NAME["matmul"]
    module = tclang.define(case.source)
    defn = module.matmul.definition
    lib = module.matmul.export(tmp_path / "lib")
    rng = np.random.default_rng(3)
    a = rng.standard_normal((7, 13)).astype(np.float32).T  # (13, 7), strides (1, 13)
    b = rng.standard_normal((7, 5)).astype(np.float32)
    strides = [tuple(s // 4 for s in a.strides), None]
    driver = build_driver(lib, defn, (a, b), tmp_path, strides)
    status, message, (c,) = run_driver(driver, defn, (a, b), tmp_path, strides)
    assert status == 0, message
    np.testing.assert_allclose(c, a @ b, rtol=1e-5, atol=1e-5)


def test_gather_out_of_bounds_returns_the_status_code(tmp_path):
    case = CASES_BY_NAME["embedding"]
    module = tclang.define(case.source)
    defn = module.embedding.definition
    lib = module.embedding.export(tmp_path / "lib")
    lut = np.ones((5, 3), np.float32)
    ids = np.array([[0, 4, 9, 1]], np.int32)  # 9 is past E=5
    driver = build_driver(lib, defn, (lut, ids), tmp_path)
    status, message, _ = run_driver(driver, defn, (lut, ids), tmp_path)
    assert status == STATUS["index_error"], message
    with pytest.raises(tclang.TCIndexError) as raised:  # the message Python gives
        module.embedding(lut, ids)
    assert message == str(raised.value)


def test_mismatched_sizes_return_the_status_code(tmp_path):
    case = CASES_BY_NAME["matmul"]
    module = tclang.define(case.source)
    defn = module.matmul.definition
    lib = module.matmul.export(tmp_path / "lib")
    a, b = np.ones((3, 4), np.float32), np.ones((5, 2), np.float32)
    driver = build_driver(lib, defn, (a, b), tmp_path)
    status, message, _ = run_driver(driver, defn, (a, b), tmp_path)
    assert status == STATUS["bad_sizes"]
    assert "size K of matmul is 4 by dimension 1 of A but 5 by dimension 0 of B" in message


def test_export_command_writes_library_and_header(tmp_path):
    source = tmp_path / "mm.tc"
    source.write_text(CASES_BY_NAME["matmul"].source)
    done = subprocess.run([sys.executable, "-m", "tclang.cli", "export", str(source),
                           "--sizes", "M=8,K=4,N=8", "-o", str(tmp_path / "out")],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "out" / "libtclang_matmul.so").exists()
    header = (tmp_path / "out" / "matmul.h").read_text()
    assert "int tclang_matmul(" in header and "M=8, K=4, N=8" in header
    neither = subprocess.run([sys.executable, "-m", "tclang.cli", "export", str(source),
                              "-o", str(tmp_path / "out")], capture_output=True, text=True)
    assert neither.returncode != 0 and "--generic" in neither.stderr
    assert "Traceback" not in neither.stderr


def test_export_refuses_missing_sizes_and_unknown_targets(tmp_path):
    module = tclang.define(CASES_BY_NAME["matmul"].source)
    with pytest.raises(tclang.TCArgumentError, match="needs a value for the size N"):
        module.matmul.export(tmp_path, {"M": 4, "K": 4})
    with pytest.raises(tclang.TCError, match="'cpu' and 'cuda'"):
        module.matmul.export(tmp_path, None, target="metal")


CUDA_DRIVER = r"""
#include <stdio.h>
#include <stdlib.h>
#include <math.h>
#include "softmax.h"
int main(void) {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) { printf("no GPU\n"); return 77; }
    const int n = 37, d = 13;
    int64_t sizes[2] = {n, d}, shape[2];
    float host[n * d], out[n * d];
    for (int i = 0; i < n * d; i++) host[i] = (float)((i * 7) % 11) / 3.0f;
    if (tclang_softmax_output_shape(0, sizes, shape)) return 2;
    float *I, *O;
    cudaMalloc((void **)&I, sizeof host); cudaMalloc((void **)&O, sizeof out);
    cudaMemcpy(I, host, sizeof host, cudaMemcpyHostToDevice);
    int status = tclang_softmax(I, sizes, NULL, O, shape, NULL, 0);
    if (status) { printf("%d %s\n", status, tclang_softmax_error()); return 3; }
    cudaMemcpy(out, O, sizeof out, cudaMemcpyDeviceToHost);
    for (int r = 0; r < n; r++) {
        double mx = -1e30, sum = 0;
        for (int c = 0; c < d; c++) mx = fmax(mx, host[r * d + c]);
        for (int c = 0; c < d; c++) sum += exp(host[r * d + c] - mx);
        for (int c = 0; c < d; c++)
            if (fabs(out[r * d + c] - exp(host[r * d + c] - mx) / sum) > 1e-5) return 4;
    }
    printf("ok\n");
    return 0;
}
"""


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="no nvcc")
def test_cuda_export_builds_ptx_cubin_and_a_launching_library(tmp_path):
    """Built with nvcc on any machine; the driver runs where a GPU is (else it skips)."""
    module = tclang.define(CASES_BY_NAME["softmax"].source)
    lib = module.softmax.export(tmp_path / "lib", None, target="cuda", arch="sm_80")
    folder = lib.library.parent
    assert ".entry tclang_softmax_0" in (folder / "softmax.ptx").read_text()
    assert (folder / "softmax.cubin").read_bytes()[:4] == b"\x7fELF"
    assert "cudaStream_t stream" in lib.header.read_text()
    (tmp_path / "driver.cu").write_text(CUDA_DRIVER)
    subprocess.run([shutil.which("nvcc"), "-o", "driver", "driver.cu", f"-I{folder}",
                    f"-L{folder}", "-ltclang_softmax", f"-Xlinker=-rpath,{folder}"],
                   cwd=tmp_path, check=True, capture_output=True)
    done = subprocess.run([str(tmp_path / "driver")], capture_output=True, text=True)
    if done.returncode == 77:
        pytest.skip("the library and a driver built; no GPU here to run them")
    assert done.returncode == 0, done.stdout + done.stderr


def test_generic_export_of_a_definition_with_obligations(tmp_path):
    """Output extent N - 2 and a constant extent: generic export binds no sizes at all."""
    source = "def f(float(N) X, float(3) w) -> (O) { O(i) +=! X(i + k) * w(k) }"
    module = tclang.define(source)
    defn = module.f.definition
    lib = module.f.export(tmp_path / "lib")
    x, w = np.arange(11, dtype=np.float32), np.array([1, -2, 0.5], np.float32)
    driver = build_driver(lib, defn, (x, w), tmp_path)
    status, message, (o,) = run_driver(driver, defn, (x, w), tmp_path)
    assert status == 0, message
    np.testing.assert_allclose(o, np.convolve(x, w[::-1], "valid"), rtol=1e-6)
    short = np.arange(1, dtype=np.float32)  # N = 1: O would have extent -1
    driver = build_driver(lib, defn, (short, w), tmp_path)
    status, message, _ = run_driver(driver, defn, (short, w), tmp_path)
    assert status == STATUS["bad_sizes"] and "negative extent" in message, message
    with pytest.raises(tclang.TCArgumentError, match="no size Q"):
        module.f.export(tmp_path / "other", {"N": 4, "Q": 2})


@pytest.mark.parametrize("generic", [False, True], ids=["specialized", "generic"])
def test_bfloat16_elements_are_passed_as_their_bits(generic, tmp_path):
    """A bfloat16 matmul's library takes and writes uint16_t bits (the upper half of the
    float32), and computes what the CPU backend computes."""
    torch = pytest.importorskip("torch")
    from tclang import bfloat16
    module = tclang.define("def bmm(bf16(M, K) A, bf16(K, N) B) -> (C) {\n"
                           "    C(m, n) +=! A(m, k) * B(k, n)\n}")
    defn = module.bmm.definition
    shapes = [(7, 13, 5), (1, 1, 1), (16, 11, 3)] if generic else [(7, 13, 5)]
    lib = module.bmm.export(tmp_path / "lib", None if generic else
                            dict(zip("MKN", shapes[0])))
    assert "uint16_t *A" in lib.header.read_text().replace("const ", "")
    gen = torch.Generator().manual_seed(1)
    for m, k, n in shapes:
        a, b = torch.randn(m, k, generator=gen).bfloat16(), torch.randn(k, n, generator=gen).bfloat16()
        inputs = [bfloat16.from_bits(t.view(torch.int16).numpy().view(np.uint16)) for t in (a, b)]
        driver = build_driver(lib, defn, inputs, tmp_path)
        status, message, outputs = run_driver(driver, defn, inputs, tmp_path)
        assert status == STATUS["ok"], message
        got = bfloat16.to_numpy_float32(outputs[0])
        assert np.array_equal(got, module.bmm(a, b).float().numpy())
        truth = (a.double() @ b.double()).float().bfloat16().float().numpy()
        np.testing.assert_allclose(got, truth, rtol=8e-3, atol=8e-3)


@pytest.mark.parametrize("generic", [False, True], ids=["specialized", "generic"])
def test_exported_sum_reading_earlier_points_matches_numpy(generic, tmp_path):
    """A reduction that reads the points of its target before the one it reduces into
    (the forward substitution as one sum) keeps its order in the exported library, run
    on two threads from C: each point is read only once its sum is done."""
    source = ("def fsum(float(N, N) L, float(N) b) -> (x) {\n"
              "    x(i) +=! (k == i) ? b(i) / L(i, i) : -L(i, k) / L(i, i) * x(k) "
              "where k in 0:i + 1\n}")
    module = tclang.define(source)
    defn = module.fsum.definition
    n = 131
    rng = np.random.default_rng(3)
    lower = (np.tril(rng.standard_normal((n, n))) * 0.1 + 4 * np.eye(n)).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    lib = module.fsum.export(tmp_path / "lib", None if generic else {"N": n})
    driver = build_driver(lib, defn, (lower, b), tmp_path)
    status, message, (x,) = run_driver(driver, defn, (lower, b), tmp_path)
    assert status == STATUS["ok"], message
    np.testing.assert_allclose(x, np.linalg.solve(lower.astype(np.float64), b), rtol=1e-4,
                               atol=1e-5)
