"""LLVM itself, in whichever process runs it: the host's target machines, O3 and code
generation of a module, the runtime's object code, and MCJIT engines (the loader of last
resort). Importing this module loads llvmlite's shared library (~25 ms), so the compiler's
process imports it only where it must: jit.py sends optimization to the optimizer process,
which imports this module while the compiler is still scheduling (jit.start); a disk-cache
hit never imports it (loading.py links object code without LLVM).
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

from backends.llvm import elf_loader
from tclang.errors import TCCompileError
from tclang.locks import fork_safe

# LLVM's global state (one context for every module) is not thread-safe. Reentrant: the
# garbage collector may free an engine (which takes the lock) inside a locked section.
_lock = fork_safe(threading.RLock())
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


def optimize_module(ir_text: str, vectorize: bool) -> tuple[str, bytes]:
    """(optimised IR text, object code): parse, verify, O3, emit (jit.optimize's work)."""
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
            try:  # after the engine: making one lets LLVM search the process's libraries
                _check_resolvable(object_code)
            except TCCompileError:
                engine.close()
                raise
            engine.add_object_file(llvm.ObjectFileRef.from_data(object_code))
            engine.finalize_object()
            self._engine = engine
            _live_engines += 1
            weakref.finalize(self, _dispose, engine).atexit = False  # exiting frees it all

    def address(self, name: str) -> int:
        with _lock:
            return self._engine.get_function_address(name) or \
                self._engine.get_global_value_address(name)


def _check_resolvable(object_code: bytes) -> None:
    """TCCompileError naming each function the object calls that neither this process nor
    LLVM has: MCJIT would link its calls to address 0 without a word, and the kernel would
    die with SIGSEGV when it got there (a runtime-library call LLVM's code generator
    chose, `__truncdfhf2`, did: fuzz seed 2030, program 323)."""
    missing = [name for name in elf_loader.undefined_symbols(object_code)
               if not llvm.address_of_symbol(name)]
    if missing:
        raise TCCompileError(
            f"the generated code calls {', '.join(missing)}, which this process does not "
            "have (a runtime-library function LLVM chose for this CPU); the kernel was not "
            "loaded. Please report it, with the program (`tclang explain --stage llvm-opt` "
            "shows where the call is); the reference backend runs the program meanwhile")


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


@functools.lru_cache(maxsize=1)
def runtime_object() -> bytes:
    """The runtime module's object code for this host: the thread pool, and the native
    entry of kernel calls (threads.py, call_trampoline.py). Every kernel's artifact
    carries a copy, so a disk-cache hit loads it without LLVM."""
    import signal

    from backends.access_errors import ERR_FIELDS
    from backends.llvm.call_trampoline import trampoline_ir
    from backends.llvm.parallel_runtime import runtime_ir
    text = runtime_ir(host()[0], data_layout(), signal.SIG_BLOCK, signal.SIG_SETMASK)
    return emit_resident(text + trampoline_ir(ERR_FIELDS))


def prepare() -> None:
    """What every compile needs before its kernel: LLVM initialised for the host and the
    runtime's object code (the optimizer process does this as soon as it starts, while
    the compiler's process is still scheduling)."""
    target_machine()
    runtime_object()
