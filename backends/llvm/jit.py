"""LLVM IR text -> optimised object code -> a callable function.

Optimisation is LLVM's O3 pipeline (new pass manager) for the host CPU and its features,
with loop and SLP vectorisation on. Object code is what the disk cache stores: loading it
into a fresh MCJIT engine needs no compilation.

Loading object code is loading.py's job (an ELF loader without LLVM, or an MCJIT engine
from here: `MCJITCode`, freed with its last reference).

optimize()'s LLVM work (parse, verify, O3, emit) runs in a forked optimizer process
(tclang/forked_server.py), replaced every OPTIMIZER_MAX_MODULES modules: llvmlite leaks
~70 KB of native memory per optimization run that no code in the process can give back, so
a process that compiles thousands of kernels would grow by hundreds of megabytes. The
compiler's process sends the IR (after check_code_size) and gets the optimised IR and the
object code back; LLVM rejecting the IR is still a TCCompileError with LLVM's message, an
interrupted optimization kills the process (the next compile forks a new one), and where no
process can be forked the work runs in-process. Loading object code stays in-process: it
does not leak.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import struct
import sys
import tempfile
import threading
import weakref

import llvmlite.binding as llvm

from tclang.errors import TCCompileError
from tclang.forked_server import ForkedServer, RequestFailed, ServerError, ServerUnavailable

# LLVM's global state (one context for every module) is not thread-safe. Reentrant: the
# garbage collector may free an engine (which takes the lock) inside a locked section.
_lock = threading.RLock()
_live_engines = 0


@functools.lru_cache(maxsize=1)
def host() -> tuple[str, str, str]:
    """(triple, cpu name, features) of the machine the kernels run on."""
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    return llvm.get_process_triple(), llvm.get_host_cpu_name(), \
        llvm.get_host_cpu_features().flatten()


@functools.lru_cache(maxsize=1)
def target_machine() -> llvm.TargetMachine:
    """The target machine optimize() and emit use, for the life of the process."""
    return _new_target_machine()


def _new_target_machine(opt: int = 3) -> llvm.TargetMachine:
    """A target machine for the host. An engine takes ownership of the one it is created
    with and destroys it with itself, so each engine gets its own."""
    triple, cpu, features = host()
    target = llvm.Target.from_triple(triple)
    return target.create_target_machine(cpu=cpu, features=features, opt=opt, reloc="pic",
                                        codemodel="jitdefault")


@functools.lru_cache(maxsize=1)
def _resident_target_machine() -> llvm.TargetMachine:
    """Code generation at opt level 0 (fast instruction selection) for the resident
    runtime: it is synchronization and a call trampoline, where the quicker code
    generation matters (5 ms instead of 17-22 ms on the cold path) and its code's speed
    does not."""
    return _new_target_machine(opt=0)


def data_layout() -> str:
    return str(target_machine().target_data)


DEFAULT_MAX_IR_MB = 32  # O3 on more takes minutes and gigabytes


def check_code_size(ir_text: str, kernel: str) -> None:
    """Refuse, before LLVM sees it, generated code too large to optimise in reasonable
    time and memory; the limit is TCLANG_MAX_LLVM_IR_MB (megabytes of IR text)."""
    configured = os.environ.get("TCLANG_MAX_LLVM_IR_MB", "")
    try:
        limit = float(configured) if configured else DEFAULT_MAX_IR_MB
    except ValueError:
        raise TCCompileError(f"TCLANG_MAX_LLVM_IR_MB={configured!r} is not a number of "
                             "megabytes") from None
    size = len(ir_text) / 1e6
    if size > limit:
        raise TCCompileError(
            f"the generated code for {kernel} is {size:.1f} MB of LLVM IR (limit "
            f"{limit:g} MB): split the definition into smaller ones, or compile with "
            "Options(specialize=True) (sizes known at compile time make far smaller code); "
            "the limit is set by TCLANG_MAX_LLVM_IR_MB")


OPTIMIZER_MAX_MODULES = 200
"""Modules one optimizer process handles before it is replaced. llvmlite leaks ~70 KB of
native memory per optimization run (its PassBuilder's instrumentation is never freed, and
reusing one PassBuilder across modules trips an LLVM assertion), so the process that runs
them grows ~14 MB per 200 modules, and that memory goes back to the system with it. A fork
costs a few milliseconds; spread over 200 modules it is nothing."""


def optimize(ir_text: str, vectorize: bool = True, meanwhile=None) -> tuple[str, bytes]:
    """(optimised IR text, object code) for one module of generated IR; `vectorize`
    False (Options(vectorize=False)) keeps LLVM's loop and SLP vectorizers off.
    `meanwhile()`: work of this process to do while the optimizer works (run after it
    where there is no optimizer process).

    The work runs in the optimizer process (see the module docstring), or here when that
    process cannot be forked."""
    with _lock:  # held while forking: no other thread is inside LLVM then
        target_machine()  # LLVM initialised before the fork: the process inherits it
        try:
            return _optimizer.call((ir_text, vectorize), meanwhile=meanwhile)
        except RequestFailed as failure:
            if failure.kind == "TCCompileError":
                raise TCCompileError(failure.message) from None
            raise TCCompileError(f"LLVM failed on the generated IR ({failure}); please "
                                 "report it with the definition") from None
        except ServerUnavailable:
            if meanwhile is not None:
                meanwhile()
            return _optimize_here((ir_text, vectorize))
        except ServerError as failure:  # LLVM crashed (an assertion, a signal)
            raise TCCompileError(f"{failure} while optimizing the generated IR: please "
                                 "report it with the definition, and try "
                                 "Options(vectorize=False)") from None


def _optimize_here(request: tuple[str, bool]) -> tuple[str, bytes]:
    """parse, verify, O3, emit: optimize()'s LLVM work, in whichever process runs it."""
    ir_text, vectorize = request
    with _lock:
        # A context of its own, freed with the module: the global context would keep every
        # constant, type and metadata string of every kernel ever compiled.
        context = llvm.create_context()
        try:
            module = llvm.parse_assembly(ir_text, context)
            module.verify()
        except RuntimeError as err:
            context.close()
            raise TCCompileError(f"LLVM rejected the generated IR: {str(err)[:500]}") from err
        try:
            tm = target_machine()
            options = llvm.create_pipeline_tuning_options(speed_level=3)
            options.loop_vectorization = vectorize
            options.slp_vectorization = vectorize
            # LLVM's own unroller runs only where a loop asks for it (Options(unroll=N)'s
            # hints): register tiles are unrolled by us, vector loops interleaved by the
            # vectorizer. Measured, interleaved best-of-12 calls, 3 rounds: matmul 1024^3,
            # 1000x999x1001, MLP, conv2d 3x3, bmm, softmax, layernorm, an exp chain and
            # bias+GELU within noise of the unroller on; a cold matmul 17-20 ms quicker.
            options.loop_unrolling = False
            # One builder per run: llvmlite's run registers callbacks that point into its
            # own stack frame in the builder's instrumentation, and never frees that
            # instrumentation (~75 KB per run that no code of ours can give back).
            builder = llvm.create_pass_builder(tm, options)
            with _missed_hints_dropped():
                builder.getModulePassManager().run(module, builder)
            return str(module), tm.emit_object(module)
        finally:
            module.close()  # before its context, and under the lock
            context.close()


_optimizer = ForkedServer(_optimize_here, "LLVM optimizer", max_requests=OPTIMIZER_MAX_MODULES)


# LLVM's diagnostic handler writes to file descriptor 2 when a loop hint of ours (vectorize,
# width, unroll count) could not be honoured: "<unknown>:0:0: loop not vectorized: ...".
# Our hints are suggestions and the code is correct either way, so those lines are dropped;
# anything else LLVM writes is passed on.
_MISSED_HINT = ("loop not vectorized", "loop not unrolled", "loop not interleaved",
                "unable to perform the requested transformation")


@contextlib.contextmanager
def _missed_hints_dropped():
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError, AttributeError):
        yield  # no usable stderr: nothing to filter
        return
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            text = captured.read().decode(errors="replace")
            kept = [line for line in text.splitlines(keepends=True)
                    if not any(hint in line for hint in _MISSED_HINT)]
            if kept:
                sys.stderr.write("".join(kept))


class MCJITCode:
    """Object code linked into the process by its own MCJIT engine (the loader of last
    resort, loading.py); `address(name)` of a symbol. The last reference going disposes of
    the engine (with its code, its empty module and the object file's copy) under the
    LLVM lock. `process_symbols`: C library functions the object calls, given to LLVM by
    address."""

    def __init__(self, object_code: bytes, process_symbols: tuple[str, ...] = ()):
        global _live_engines
        check_object(object_code)
        with _lock:
            if process_symbols:
                libc = ctypes.CDLL(None)
                for name in process_symbols:
                    llvm.add_symbol(name, ctypes.cast(getattr(libc, name), ctypes.c_void_p).value)
            engine = llvm.create_mcjit_compiler(llvm.parse_assembly(""),
                                                _new_target_machine())
            engine.add_object_file(llvm.ObjectFileRef.from_data(object_code))
            engine.finalize_object()
            self._engine = engine
            _live_engines += 1
            weakref.finalize(self, _dispose, engine).atexit = False  # exiting frees it all

    def address(self, name: str) -> int:
        with _lock:
            return self._engine.get_function_address(name) or \
                self._engine.get_global_value_address(name)


def _dispose(engine) -> None:
    global _live_engines
    with _lock:
        engine.close()
        _live_engines -= 1


def live_engines() -> int:
    """How many engines hold loaded code now (for tests and memory diagnostics)."""
    return _live_engines


def check_object(object_code: bytes) -> None:
    """TCCompileError unless `object_code` looks like an object this host's target machine
    emits: LLVM trusts the headers it is given and can crash the process on anything else
    (object code comes back from the disk cache)."""
    reference = _reference_object()
    if reference[:4] != b"\x7fELF":  # not an ELF host: the leading header fields only
        if object_code[:16] != reference[:16]:
            raise TCCompileError("the object code is not for this machine")
        return
    if len(object_code) < 64 or object_code[:4] != b"\x7fELF":
        raise TCCompileError("the object code is not an ELF object")
    # class, byte order, version; then type (relocatable) and machine
    if object_code[4:7] != reference[4:7] or object_code[16:20] != reference[16:20]:
        raise TCCompileError("the object code is an ELF object for another machine")
    if reference[4] != 2:  # ELF32: the class and machine checks are enough
        return
    order = "<" if reference[5] == 1 else ">"
    section_table, entry_size, count = struct.unpack_from(order + "Q10xHH", object_code, 40)
    if entry_size != 64 or section_table + entry_size * count > len(object_code):
        raise TCCompileError("the object code's section table lies outside it")


@functools.lru_cache(maxsize=1)
def _reference_object() -> bytes:
    """The object code of an empty module: the header every object for this host has."""
    with _lock:
        return target_machine().emit_object(llvm.parse_assembly(""))


def emit_resident(ir_text: str) -> bytes:
    """Object code for `ir_text` (code generation only: it is small, hand-written IR that
    needs no O3): the runtime that kernels call into, never a kernel."""
    with _lock:
        module = llvm.parse_assembly(ir_text)
        module.verify()
        return _resident_target_machine().emit_object(module)
