"""The compiler process's side of LLVM: generated IR -> optimised object code, by the
optimizer process.

O3 and code generation (codegen.py) run in a forked optimizer process
(tclang/forked_server.py), replaced every OPTIMIZER_MAX_MODULES modules: llvmlite leaks
~70 KB of native memory per optimization run that no code in the process can give back, so
a process that compiles thousands of kernels would grow by hundreds of megabytes. The
compiler's process sends the IR (after check_code_size) and gets the optimised IR and the
object code back; LLVM rejecting the IR is still a TCCompileError with LLVM's message, an
interrupted optimization kills the process (the next compile forks a new one), a process
killed while it works (the OOM killer) is replaced and asked again once, and where no
process can be forked the work runs in-process.

The optimizer process also answers what else needs LLVM: the host's triple and data layout
(written into the generated IR) and the runtime's object code. So the compiler's process
does not import llvmlite's shared library at all (~25 ms): a cold compile starts the
optimizer first (`start`, from the backend's `prepare`), which loads LLVM and makes the
runtime's object code while this process parses and schedules. Loading object code stays
in this process and needs no LLVM (loading.py), except the MCJIT loader of last resort.
"""

from __future__ import annotations

import contextlib
import functools
import signal
import sys

from tclang.environment import positive_number
from tclang.errors import TCCompileError
from tclang.forked_server import (ForkedServer, RequestFailed, ServerDied, ServerError,
                                  ServerTimeout, ServerUnavailable)

DEFAULT_MAX_IR_MB = 32  # O3 on more takes minutes and gigabytes


def check_code_size(ir_text: str, kernel: str) -> None:
    """Refuse, before LLVM sees it, generated code too large to optimise in reasonable
    time and memory; the limit is TCLANG_MAX_LLVM_IR_MB (megabytes of IR text)."""
    limit = positive_number("TCLANG_MAX_LLVM_IR_MB", float(DEFAULT_MAX_IR_MB))
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


def start() -> None:
    """Start the optimizer process now if none runs: it loads LLVM and makes the
    runtime's object code while this process does the work before code generation."""
    with _llvm_quiet():
        try:
            _optimizer.start()
        except ServerUnavailable:
            pass  # the first request works in-process


class OptimizerTimeout(TCCompileError):
    """LLVM's optimization of one module ran past its time limit; its process was killed."""


def optimizer_limit(ir_text: str, remaining: float | None) -> float | None:
    """Seconds the optimizer may take on `ir_text`: what the compile budget has left
    (None: no budget), at most SECONDS_BASE plus SECONDS_PER_MB of IR, at least
    SECONDS_MIN. O3 of a 2 MB module usually takes a second or two, but a 1.64 MB
    bfloat16 backward took 9.7 s on a quiet machine (fuzz seed 2038, program 524), and
    twice that beside other work, past the 16.6 s it was allowed at 4 s a megabyte: its
    compile failed. LLVM's vector combiner has worst cases that do not end (fuzz seed
    2031, program 120: more than an hour), so the cap stays, with room for a loaded
    machine."""
    cap = SECONDS_BASE + SECONDS_PER_MB * len(ir_text) / 1e6
    if remaining is not None:
        cap = min(cap, remaining)
    return max(SECONDS_MIN, cap)


SECONDS_BASE, SECONDS_PER_MB, SECONDS_MIN = 10.0, 12.0, 2.0


def optimize(ir_text: str, vectorize: bool = True,
             limit: float | None = None) -> tuple[str, bytes]:
    """(optimised IR text, object code) for one module of generated IR; `vectorize`
    False (Options(vectorize=False)) keeps LLVM's loop and SLP vectorizers off. `limit`:
    seconds, past which `OptimizerTimeout` (the optimizer process is killed; where no
    process can be forked the work runs in this one, unlimited)."""
    return _ask(("optimize", ir_text, vectorize), limit)


@functools.lru_cache(maxsize=1)
def _host_description() -> tuple[str, str, str, str]:
    return _ask(("host",))


def host() -> tuple[str, str, str]:
    """(triple, cpu name, features) of the machine the kernels run on, as LLVM sees it."""
    return _host_description()[:3]


def data_layout() -> str:
    return _host_description()[3]


@functools.lru_cache(maxsize=1)
def runtime_object() -> bytes:
    """The runtime module's object code (codegen.runtime_object), from the optimizer."""
    return _ask(("runtime",))


def _ask(request: tuple, limit: float | None = None):
    """The optimizer's answer to `request`; in this process where none can be forked."""
    with _llvm_quiet():
        try:
            return _optimizer.call(request, limit)
        except ServerTimeout as slow:
            raise OptimizerTimeout(f"{slow} optimizing the generated IR") from None
        except RequestFailed as failure:
            if failure.kind == "TCCompileError":
                raise TCCompileError(failure.message) from None
            raise TCCompileError(f"LLVM failed on the generated IR ({failure}); please "
                                 "report it with the definition") from None
        except ServerUnavailable:
            return _answer(request)
        except ServerDied as died:  # twice: the server tried a fresh process once
            if died.signal == signal.SIGKILL:  # not LLVM's doing: nothing to report
                raise TCCompileError(
                    f"{died} while optimizing the generated IR: out of memory? (the OOM "
                    "killer ends processes with SIGKILL; `dmesg` says whether it did) Free "
                    "memory and compile again, or split the definition into smaller ones") \
                    from None
            raise TCCompileError(f"{died} while optimizing the generated IR: LLVM crashed; "
                                 "please report it with the definition, and try "
                                 "Options(vectorize=False)") from None
        except ServerError as failure:  # it could not be reached at all
            raise TCCompileError(f"{failure} while optimizing the generated IR: please "
                                 "report it with the definition, and try "
                                 "Options(vectorize=False)") from None


def _answer(request: tuple):
    """A request's answer, in whichever process runs it."""
    from backends.llvm import codegen
    kind = request[0]
    if kind == "optimize":
        return codegen.optimize_module(request[1], request[2])
    if kind == "host":
        return (*codegen.host(), codegen.data_layout())
    if kind == "runtime":
        return codegen.runtime_object()
    raise ValueError(f"unknown optimizer request {kind!r}")


def _prepare() -> None:
    """The optimizer process's first work, before any request: LLVM loaded and the
    runtime's object code made (a failure here shows in the request that needs it)."""
    from backends.llvm import codegen
    codegen.prepare()


def _llvm_quiet():
    """LLVM's lock while forking, where this process has loaded LLVM: no other thread is
    inside LLVM then, so the child does not inherit a lock held by nobody."""
    codegen = sys.modules.get("backends.llvm.codegen")
    return codegen._lock if codegen is not None else contextlib.nullcontext()


_optimizer = ForkedServer(_answer, "LLVM optimizer", max_requests=OPTIMIZER_MAX_MODULES,
                          prepare=_prepare)
