"""Interrupted compiles: Ctrl-C while a program compiles, then the same program again.

A child process (forked from the fuzz worker, in a process group of its own, as a shell
runs a command) compiles and runs the program with the run's shared cache directory;
after a delay drawn from the program's seed, SIGINT goes to the child's whole group, as
Ctrl-C in a terminal sends it (tclang's helper processes get it too). Then:

- the child must raise KeyboardInterrupt (during the compile, or while it waits after
  finishing): a child that dies of a signal (a segfault), hangs, or never sees the
  interrupt (or sees another exception instead) fails the program;
- the child, like a notebook after an interrupted cell, compiles and runs the program
  again in the same process: the result must be right;
- the parent compiles the same program with the same cache directory and its memory
  cache emptied, as the next process would: what the interrupted child left in the disk
  cache must give the right result.
"""

from __future__ import annotations

import os
import signal
import time
from tclang.fuzzing import running
from tclang.fuzzing.running import Failure, compare, describe, quiet

WAIT_AFTER = 5.0  # seconds the child waits for a Ctrl-C that comes after its compile


def check_interrupt(program, backend: str, options, inputs, expected, rtol: float,
                    delay: float, check_bounds: bool = True):
    """(failures, notes) for one interrupted compile of `program` (module docstring);
    `expected`: the oracle's outputs for `inputs`."""
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    parent, child = ctx.Pipe(duplex=False)
    process = ctx.Process(target=_child, args=(child, program, backend, options, inputs,
                                               check_bounds))
    process.start()
    child.close()
    label = f"interrupt {backend}"
    status: dict = {}
    try:
        if parent.poll(60):
            parent.recv()  # ready
            time.sleep(delay)
            _interrupt(process.pid)
            if parent.poll(60 + WAIT_AFTER):
                status = parent.recv()
    except (EOFError, OSError):
        pass
    process.join(10)
    if process.is_alive():
        _kill(process.pid)
        process.join()
        return [Failure(label, options, "crash", f"the interrupted child hung (SIGINT "
                                                 f"{delay:.2f} s into its compile)",
                        check="interrupt")], ["interrupt"]
    failures = []
    if process.exitcode:
        why = f"signal {signal.Signals(-process.exitcode).name}" if process.exitcode < 0 \
            else f"exit code {process.exitcode}"
        failures.append(Failure(label, options, "crash",
                                f"the interrupted child died ({why}, SIGINT {delay:.2f} s "
                                f"into its compile)", check="interrupt"))
    elif "error" in status:
        failures.append(Failure(label, options, "lost-interrupt",
                                f"Ctrl-C {delay:.2f} s into the compile came out as "
                                f"{status['error']}", check="interrupt"))
    elif status.get("outcome") == "lost":
        failures.append(Failure(label, options, "lost-interrupt",
                                f"no KeyboardInterrupt within {WAIT_AFTER:g} s of a Ctrl-C "
                                f"{delay:.2f} s into the compile", check="interrupt"))
    elif "again_error" in status:
        failures.append(Failure(label, options, "crash", f"after the interrupt, in the same "
                                f"process: {status['again_error']}", check="interrupt"))
    elif "again" in status:
        problem = _compare(status["again"], expected, rtol)
        if problem:
            failures.append(Failure(label, options, "mismatch", f"after the interrupt, in "
                                    f"the same process: {problem}", check="interrupt"))
    # the next process: the disk cache as the child left it
    from tclang.driver.compiler import forget_compiled
    forget_compiled()
    try:
        problem = _compare(running.call_program(program, backend, options, inputs, check_bounds),
                           expected, rtol)
        if problem:
            failures.append(Failure(label, options, "wrong-cached-kernel",
                                    f"after a compile interrupted {delay:.2f} s in, from the "
                                    f"cache: {problem}", check="interrupt"))
    except Exception as err:  # noqa: BLE001 - a compile that cannot recover is a crash
        failures.append(Failure(label, options, "crash", f"after a compile interrupted "
                                f"{delay:.2f} s in: {describe(err)}", check="interrupt"))
    when = "during the compile" if status.get("during") else "after the compile"
    return failures, ["interrupt", f"interrupt landed {when}"]


def _interrupt(pid: int) -> None:
    """Ctrl-C: SIGINT to the child's process group."""
    try:
        os.killpg(pid, signal.SIGINT)
    except ProcessLookupError:
        pass


def _kill(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _compare(outputs, expected, rtol: float) -> str | None:
    for k, (a, e) in enumerate(zip(outputs, expected)):
        problem = compare(a, e, rtol)
        if problem:
            return f"output {k}: {problem}"
    return None


def _child(conn, program, backend, options, inputs, check_bounds) -> None:
    """Compile and run under a Ctrl-C; report how the interrupt came and the result of
    compiling again in this process."""
    os.setpgid(0, 0)  # a group of its own: the Ctrl-C reaches it and its helpers only
    signal.signal(signal.SIGINT, signal.default_int_handler)
    from tclang.driver.compiler import forget_compiled
    forget_compiled()  # the fuzz worker's kernels are not this process's
    status: dict = {}
    conn.send("ready")
    try:  # the Ctrl-C may come at any point from here on
        with quiet():
            running.call_program(program, backend, options, inputs, check_bounds)
        status["finished"] = True
        time.sleep(WAIT_AFTER)  # the Ctrl-C is on its way
        status["outcome"] = "lost"
    except KeyboardInterrupt:
        status["during"] = "finished" not in status
    except BaseException as err:  # noqa: BLE001 - reported: Ctrl-C must stay Ctrl-C
        status["error"] = describe(err)
    if "during" in status or status.get("finished"):
        try:
            with quiet():
                status["again"] = running.call_program(program, backend, options, inputs,
                                                       check_bounds)
        except BaseException as err:  # noqa: BLE001
            status["again_error"] = describe(err)
    conn.send(status)
    conn.close()
