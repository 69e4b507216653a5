"""The ELF loader (backends/llvm/elf_loader.py): it links what our target machine emits
exactly as MCJIT does, refuses what it does not know, and the MCJIT fallback takes over."""

from __future__ import annotations

import ctypes
import gc

import numpy as np
import pytest

import tclang as tc
from backends.llvm import elf_loader, loading, threads
from tclang.driver import compiler
from tests.corpus import CASES_BY_NAME, assert_close, check_call, define, make_inputs

pytestmark = pytest.mark.skipif(not elf_loader.supported_host(),
                                reason="the ELF loader links x86-64 objects only")

# kernels that call libm (float64 exp, pow), run parallel loops, gather, carry constants
NAMES = ("matmul", "softmax", "conv2d", "embedding", "builtins_unary", "layernorm",
         "reduction_ops")


def _cases():
    return [CASES_BY_NAME[n] for n in NAMES]


@pytest.mark.parametrize("loader", ["elf", "mcjit"])
@pytest.mark.parametrize("case", _cases(), ids=lambda c: c.name)
def test_both_loaders_run_the_corpus_alike(case, loader, monkeypatch, tmp_path):
    monkeypatch.setenv("TCLANG_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("TCLANG_LOADER", loader)
    compiler.forget_compiled()  # each loader links its own copy
    used = []
    real = loading.LoadedCode.__init__

    def spy(self, *args, **kwargs):
        real(self, *args, **kwargs)
        used.append(self.loader)
    monkeypatch.setattr(loading.LoadedCode, "__init__", spy)
    kernel = define(case, "cpu")[case.entry]
    for shape in case.shapes:
        inputs = make_inputs(case, shape)
        outputs, expected = check_call(case, kernel, inputs)
        assert_close(outputs, expected, case)
    assert used and set(used) == {loader}


def _object_of(src: str, *args):
    compiled = tc.define(src).f.compile(*args)
    return compiled.compiled.artifact.blobs


def test_the_default_loader_is_the_elf_one(monkeypatch):
    monkeypatch.delenv("TCLANG_LOADER", raising=False)
    blobs = _object_of("def f(double(N) X) -> (Y) { Y(i) = exp(X(i)) + pow(X(i), 2.5) }",
                       np.ones(5))
    loaded = loading.LoadedCode(blobs["object"], ("tclang_main",))
    assert loaded.loader == "elf"
    assert loading.LoadedCode(blobs["object"], ("tclang_main",), mcjit=True).loader == "mcjit"


def test_libm_calls_resolve_to_the_process_functions(monkeypatch):
    monkeypatch.delenv("TCLANG_LOADER", raising=False)
    mod = tc.define("def f(double(N) X) -> (Y) { Y(i) = exp(X(i)) + pow(X(i), 2.5) }")
    x = np.linspace(0.1, 3.0, 37)
    np.testing.assert_allclose(mod.f(x), np.exp(x) + x ** 2.5, rtol=1e-14)


def test_an_object_it_refuses_goes_to_mcjit(monkeypatch):
    blobs = _object_of("def f(float(N) X) -> (Y) { Y(i) = X(i) * 2.0 }", np.ones(3, np.float32))

    def refuse(*args, **kwargs):
        raise elf_loader.Unsupported("relocation type 99")
    monkeypatch.setattr(elf_loader, "load_object", refuse)
    loaded = loading.LoadedCode(blobs["object"], ("tclang_main",))
    assert loaded.loader == "mcjit" and loaded.address("tclang_main")


@pytest.mark.parametrize("mangle, problem", [
    (lambda b: b"\x7fELF" + b"\x01" + b[5:], "ELF64"),        # a 32-bit class
    (lambda b: b[:18] + b"\x28\x00" + b[20:], "x86-64"),       # an ARM object
    (lambda b: b[:40] + (len(b) + 1).to_bytes(8, "little") + b[48:], "section table"),
    (lambda b: b"not an object at all", "ELF64"),
])
def test_malformed_objects_are_refused(mangle, problem):
    blobs = _object_of("def f(float(N) X) -> (Y) { Y(i) = X(i) + 1.0 }", np.ones(3, np.float32))
    with pytest.raises(elf_loader.Unsupported, match=problem):
        elf_loader.load_object(mangle(blobs["object"]))


def test_unknown_symbols_are_refused():
    blobs = _object_of("def f(double(N) X) -> (Y) { Y(i) = exp(X(i)) }", np.ones(3))
    with pytest.raises(elf_loader.Unsupported, match="no symbol exp"):
        elf_loader.load_object(blobs["object"], resolve=lambda name: 0)


def test_a_call_no_one_can_resolve_is_a_compile_error_not_a_jump_to_zero():
    """MCJIT links a call of a function that neither the process nor LLVM has to address
    0, silently: the kernel died with SIGSEGV where it called it (`__truncdfhf2`, fuzz
    seed 2030, program 323). Both loaders now refuse such an object, by name."""
    import llvmlite.ir as ir
    from backends.llvm import codegen
    from tclang.errors import TCCompileError
    module = ir.Module()
    module.triple = codegen.host()[0]
    double = ir.FunctionType(ir.DoubleType(), [ir.DoubleType()])
    main = ir.Function(module, double, "tclang_main")
    missing = ir.Function(module, double, "tclang_no_such_function")
    builder = ir.IRBuilder(main.append_basic_block())
    builder.ret(builder.call(missing, [main.args[0]]))
    _, object_code = codegen.optimize_module(str(module), False)
    assert elf_loader.undefined_symbols(object_code) == ["tclang_no_such_function"]
    for mcjit in (False, True):
        with pytest.raises(TCCompileError, match="calls tclang_no_such_function"):
            loading.LoadedCode(object_code, ("tclang_main",), mcjit=mcjit)


def test_mcjit_as_the_first_engine_of_a_process_finds_libc_and_libm(tmp_path):
    """LLVM searches the process's libraries only once an engine exists: the check that
    every called function resolves must come after it, or a fresh process under
    TCLANG_LOADER=mcjit would refuse a kernel calling memset and hypotf."""
    import os
    import subprocess
    import sys
    code = ("import numpy as np, tclang as tc\n"
            "m = tc.define('def f(float(N) A) -> (O, P) { O(i) = hypot(A(i), 0.5)\\n"
            "P(i, j) = 0.0 where i in 0:N, j in 0:N }')\n"
            "o, p = m.f(np.ones(300, np.float32))\n"
            "assert abs(o[0] - 1.25 ** 0.5) < 1e-6 and not p.any()\n")
    env = dict(os.environ, TCLANG_LOADER="mcjit", TCLANG_CACHE_DIR=str(tmp_path))
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]


def test_the_thread_pool_links_and_runs_from_its_object():
    linked = elf_loader.load_object(threads.runtime_object())
    assert {"tclang_parallel_for", "tclang_pool_configure", "tclang_pool_stats"} <= \
        set(linked.symbols)
    stats = (ctypes.c_int64 * 3).from_address(linked.address("tclang_pool_stats"))
    assert list(stats) == [0, 0, 0]  # its own .bss, zeroed, writable


def test_code_is_unmapped_with_its_last_reference(monkeypatch, tmp_path):
    monkeypatch.setenv("TCLANG_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("TCLANG_LOADER", raising=False)
    compiler.forget_compiled()
    gc.collect()
    before = loading.live_objects()
    mod = tc.define("def f(float(N) X) -> (Y) { Y(i) = X(i) * 3.0 }")
    np.testing.assert_array_equal(mod.f(np.ones(4, np.float32)), 3.0)
    assert loading.live_objects() > before
    del mod
    compiler.forget_compiled()
    gc.collect()
    assert loading.live_objects() == before
