"""The native parallel runtime: LLVM IR for a thread pool that runs `parallel_for` without
Python.

Generated code calls `parallel_for(task, ctx, lo, hi)` for an outermost parallel loop with
enough work, and `task(ctx, lo, hi)` runs iterations [lo, hi) of it. This module builds
the function that does that, and the pool behind it, as one small LLVM module over POSIX
threads (pthread mutexes, condition variables and signal masks; nothing else from libc):

- `tclang_pool_configure(n)` sets how many helper threads to use; the first parallel loop
  after it creates them (the caller is the last worker), with every signal blocked, and
  they wait for a loop to be published: spinning for a moment (SPIN_ROUNDS), then asleep
  on a condition variable.
- `tclang_parallel_for` publishes the loop as a job, wakes the helpers and takes chunks
  itself. Chunks are handed out by an atomic counter (dynamic scheduling, a few chunks per
  thread): a core slowed by another process gets fewer chunks instead of making everyone
  wait. Helpers that wake after the caller took the last chunk find no job and sleep again;
  the caller waits only for helpers that joined, so a slow wake-up costs nothing.
- One loop at a time: a second caller (another Python thread in a kernel) finds the pool
  busy and runs its loop on its own thread, serially, rather than waiting.
- `tclang_pool_forget()` is for a forked child, which has none of the parent's threads: the
  pool counts as not started, and its next parallel loop starts it again (re-initialising
  the mutex and conditions, whatever state the fork caught them in).
- `tclang_pool_stats` counts parallel loops and the chunks run by the caller and by
  helpers: how tests see which threads ran a loop.

Why not libgomp: a process that forks after an OpenMP region hangs in the child's next
one (GNU OpenMP's pool is not fork-safe), and tclang must work in forked children and
multiprocessing workers. Why IR and not C: tclang needs no C compiler at run time, and an
exported library can link this same module.

Pthread objects are opaque blobs of PTHREAD_BLOB bytes, more than any libc on a 64-bit
target needs (glibc: 40 for a mutex and 48 for a condition variable; macOS: 64 and 48).
"""

from __future__ import annotations

import llvmlite.ir as ir

PTHREAD_BLOB = 128
SIGSET_BLOB = 256  # sigset_t: 128 bytes on glibc and musl, 4 on macOS
CHUNKS_PER_THREAD = 4  # dynamic chunks: balance when a core is shared, few atomics
HELPER_STACK = 32 << 20
"""Helper threads' stacks, in bytes (reserved, touched only as used): a packed micro-kernel
keeps its sliver and block there, up to half of L2 each (polyhedral/packing.py), more
than some systems' default thread stack (macOS 512 KiB, musl 128 KiB)."""
SPIN_ROUNDS = 20000
"""Spin-wait rounds (each one `pause`: a few hundred microseconds in all) a helper spends
watching for the next loop before it sleeps on the condition variable. A sleeping helper
is woken through the kernel, and on a virtual machine an idle virtual CPU comes back
slowly: a 64 x 128^3 batched matmul called back to back after a rest ran at 2.9 ms a
call (its helper asleep between calls) and 1.5-2.0 ms with the spin. OpenMP runtimes and
OpenBLAS spin the same way after each parallel region."""

I8P = ir.IntType(8).as_pointer()
I32 = ir.IntType(32)
I64 = ir.IntType(64)
VOID = ir.VoidType()
TASK = ir.FunctionType(VOID, [I8P, I64, I64])
WORKER = ir.FunctionType(I8P, [I8P])
# the job a caller publishes: task, ctx, next iteration (atomic), end, chunk, helpers in it
JOB = ir.LiteralStructType([I8P, I8P, I64, I64, I64, I64])
TASK_FIELD, CTX_FIELD, NEXT_FIELD, HI_FIELD, CHUNK_FIELD, ACTIVE_FIELD = range(6)
# tclang_pool_stats: parallel loops, chunks run by callers, chunks run by helpers
STAT_LOOPS, STAT_CALLER_CHUNKS, STAT_HELPER_CHUNKS = range(3)


def _i64(value: int) -> ir.Constant:
    return ir.Constant(I64, value)


class _Runtime:
    def __init__(self, triple: str, data_layout: str, sig_block: int, sig_setmask: int):
        m = self.module = ir.Module(name="tclang_parallel_runtime")
        m.triple, m.data_layout = triple, data_layout
        blob = ir.ArrayType(ir.IntType(8), PTHREAD_BLOB)
        self.mutex = self._global("tclang_pool_mutex", blob, align=16)
        self.work = self._global("tclang_pool_work", blob, align=16)
        self.done = self._global("tclang_pool_done", blob, align=16)
        self.job = self._global("tclang_pool_job", JOB.as_pointer())
        self.generation = self._global("tclang_pool_generation", I64)
        self.helpers = self._global("tclang_pool_helpers", I64)
        self.busy = self._global("tclang_pool_busy", I32)
        self.started = self._global("tclang_pool_started", I32)
        self.wanted = self._global("tclang_pool_wanted", I64)
        self.sig_block, self.sig_setmask = sig_block, sig_setmask
        self.stats = self._global("tclang_pool_stats", ir.ArrayType(I64, 3), linkage="")
        self.libc = {name: ir.Function(m, ty, name) for name, ty in {
            "pthread_mutex_init": ir.FunctionType(I32, [I8P, I8P]),
            "pthread_mutex_lock": ir.FunctionType(I32, [I8P]),
            "pthread_mutex_unlock": ir.FunctionType(I32, [I8P]),
            "pthread_cond_init": ir.FunctionType(I32, [I8P, I8P]),
            "pthread_cond_wait": ir.FunctionType(I32, [I8P, I8P]),
            "pthread_cond_broadcast": ir.FunctionType(I32, [I8P]),
            "pthread_create": ir.FunctionType(I32, [I64.as_pointer(), I8P,
                                                    WORKER.as_pointer(), I8P]),
            "pthread_detach": ir.FunctionType(I32, [I64]),
            "pthread_attr_init": ir.FunctionType(I32, [I8P]),
            "pthread_attr_setstacksize": ir.FunctionType(I32, [I8P, I64]),
            "pthread_attr_destroy": ir.FunctionType(I32, [I8P]),
            "sigfillset": ir.FunctionType(I32, [I8P]),
            "pthread_sigmask": ir.FunctionType(I32, [I32, I8P, I8P]),
        }.items()}
        self.run_chunks = self._run_chunks()
        self.worker = self._worker()
        self.start = self._start()
        self._parallel_for()
        self._configure()
        self._forget()

    def _global(self, name, ty, align=None, linkage="internal"):
        g = ir.GlobalVariable(self.module, ty, name)
        g.initializer = ir.Constant(ty, None)
        if linkage:
            g.linkage = linkage
        if align:
            g.align = align
        return g

    def _function(self, name, ty, internal=True):
        f = ir.Function(self.module, ty, name)
        if internal:
            f.linkage = "internal"
        return f, ir.IRBuilder(f.append_basic_block("entry"))

    def _call(self, b, name, *args):
        return b.call(self.libc[name], [b.bitcast(a, I8P) if isinstance(a.type, ir.PointerType)
                                        and name != "pthread_create" else a for a in args])

    def _count(self, b, stat) -> None:
        """One more in tclang_pool_stats[stat] (an int, or an i64 value)."""
        index = stat if isinstance(stat, ir.Value) else _i64(stat)
        b.atomic_rmw("add", b.gep(self.stats, [_i64(0), index]), _i64(1), "monotonic")

    @staticmethod
    def _field(b, job, field: int):
        return b.gep(job, [ir.Constant(I32, 0), ir.Constant(I32, field)])

    def _run_chunks(self) -> ir.Function:
        """run_chunks(job, stat): take chunks until none is left; count them under `stat`."""
        f, b = self._function("tclang_run_chunks", ir.FunctionType(VOID, [JOB.as_pointer(),
                                                                          I64]))
        job, stat = f.args
        task = b.bitcast(b.load(self._field(b, job, TASK_FIELD)), TASK.as_pointer())
        ctx = b.load(self._field(b, job, CTX_FIELD))
        hi = b.load(self._field(b, job, HI_FIELD))
        chunk = b.load(self._field(b, job, CHUNK_FIELD))
        loop, body, done = (f.append_basic_block(x) for x in ("take", "run", "done"))
        b.branch(loop)
        b.position_at_end(loop)
        start = b.atomic_rmw("add", self._field(b, job, NEXT_FIELD), chunk, "monotonic")
        b.cbranch(b.icmp_signed(">=", start, hi), done, body)
        b.position_at_end(body)
        end = b.add(start, chunk)
        end = b.select(b.icmp_signed("<", end, hi), end, hi)
        b.call(task, [ctx, start, end])
        self._count(b, stat)
        b.branch(loop)
        b.position_at_end(done)
        b.ret_void()
        return f

    def _pause(self, b) -> None:
        """The CPU's spin-wait hint (x86 `pause`, Arm `yield`): a spinning thread leaves
        the core's resources to its sibling and does not flood the memory bus."""
        arch = self.module.triple.split("-")[0]
        if arch in ("x86_64", "i686", "i386"):
            hint = self.module.globals.get("llvm.x86.sse2.pause") or ir.Function(
                self.module, ir.FunctionType(VOID, []), "llvm.x86.sse2.pause")
            b.call(hint, [])
        elif arch in ("aarch64", "arm64"):
            hint = self.module.globals.get("llvm.aarch64.hint") or ir.Function(
                self.module, ir.FunctionType(VOID, [I32]), "llvm.aarch64.hint")
            b.call(hint, [ir.Constant(I32, 1)])  # YIELD

    def _worker(self) -> ir.Function:
        """A helper thread: wait until the generation changes, join the job if one is
        still published, run chunks, leave; forever (the process's exit ends it). It waits
        spinning for SPIN_ROUNDS first, then asleep on the condition variable."""
        f, b = self._function("tclang_pool_worker", WORKER)
        self._call(b, "pthread_mutex_lock", self.mutex)
        first_seen = b.load(self.generation)
        entry = b.block
        wait, sleep, spin_start, spin, spin_on, spin_end, block, woke, join = (
            f.append_basic_block(x) for x in ("wait", "sleep", "spin.start", "spin",
                                              "spin.on", "spin.end", "block", "woke",
                                              "join"))
        b.branch(wait)
        b.position_at_end(wait)  # the mutex is held here
        seen = b.phi(I64)
        seen.add_incoming(first_seen, entry)
        spun = b.phi(ir.IntType(1))  # this wait has spun already: sleep now
        spun.add_incoming(ir.Constant(ir.IntType(1), 0), entry)
        generation = b.load_atomic(self.generation, "monotonic", 8)
        b.cbranch(b.icmp_unsigned("==", generation, seen), sleep, woke)
        b.position_at_end(sleep)
        b.cbranch(spun, block, spin_start)
        # spin without the mutex, reading the generation the caller bumps to publish a job
        b.position_at_end(spin_start)
        self._call(b, "pthread_mutex_unlock", self.mutex)
        b.branch(spin)
        b.position_at_end(spin)
        rounds = b.phi(I64)
        rounds.add_incoming(_i64(0), spin_start)
        now = b.load_atomic(self.generation, "monotonic", 8)
        more = b.and_(b.icmp_unsigned("==", now, seen),
                      b.icmp_signed("<", rounds, _i64(SPIN_ROUNDS)))
        b.cbranch(more, spin_on, spin_end)
        b.position_at_end(spin_on)
        self._pause(b)
        rounds.add_incoming(b.add(rounds, _i64(1)), spin_on)
        b.branch(spin)
        b.position_at_end(spin_end)
        self._call(b, "pthread_mutex_lock", self.mutex)
        seen.add_incoming(seen, spin_end)
        spun.add_incoming(ir.Constant(ir.IntType(1), 1), spin_end)
        b.branch(wait)
        b.position_at_end(block)
        self._call(b, "pthread_cond_wait", self.work, self.mutex)
        seen.add_incoming(seen, block)
        spun.add_incoming(ir.Constant(ir.IntType(1), 0), block)
        b.branch(wait)
        b.position_at_end(woke)
        job = b.load(self.job)
        seen.add_incoming(generation, woke)
        spun.add_incoming(ir.Constant(ir.IntType(1), 0), woke)
        b.cbranch(b.icmp_unsigned("==", b.ptrtoint(job, I64), _i64(0)), wait, join)
        b.position_at_end(join)
        active = self._field(b, job, ACTIVE_FIELD)
        b.store(b.add(b.load(active), _i64(1)), active)
        self._call(b, "pthread_mutex_unlock", self.mutex)
        b.call(self.run_chunks, [job, _i64(STAT_HELPER_CHUNKS)])
        self._call(b, "pthread_mutex_lock", self.mutex)
        left = b.sub(b.load(active), _i64(1))
        b.store(left, active)
        last, after = f.append_basic_block("last"), f.append_basic_block("after")
        b.cbranch(b.icmp_signed("==", left, _i64(0)), last, after)
        b.position_at_end(last)
        self._call(b, "pthread_cond_broadcast", self.done)
        b.branch(after)
        b.position_at_end(after)
        seen.add_incoming(generation, after)
        spun.add_incoming(ir.Constant(ir.IntType(1), 0), after)
        b.branch(wait)
        return f

    def _parallel_for(self) -> None:
        f, b = self._function("tclang_parallel_for", ir.FunctionType(
            VOID, [I8P, I8P, I64, I64]), internal=False)
        task_p, ctx, lo, hi = f.args
        task = b.bitcast(task_p, TASK.as_pointer())
        trips = b.sub(hi, lo)
        serial, claim, starting, claimed, publish, release = (f.append_basic_block(x) for x in (
            "serial", "claim", "start", "claimed", "publish", "release"))
        few = b.or_(b.icmp_signed("<", trips, _i64(2)),
                    b.icmp_signed("<=", b.load(self.wanted), _i64(0)))
        b.cbranch(few, serial, claim)
        b.position_at_end(serial)
        b.call(task, [ctx, lo, hi])
        self._count(b, STAT_CALLER_CHUNKS)
        b.ret_void()
        b.position_at_end(claim)
        pair = b.cmpxchg(self.busy, ir.Constant(I32, 0), ir.Constant(I32, 1),
                         "acquire", "monotonic")
        b.cbranch(b.extract_value(pair, 1), claimed, serial)
        b.position_at_end(claimed)  # the pool is this caller's until `busy` is cleared
        b.cbranch(b.icmp_unsigned("==", b.load(self.started), ir.Constant(I32, 0)),
                  starting, publish)
        b.position_at_end(starting)
        b.call(self.start, [])
        b.branch(publish)
        b.position_at_end(publish)
        helpers = b.load(self.helpers)
        go = f.append_basic_block("go")
        b.cbranch(b.icmp_signed("<=", helpers, _i64(0)), release, go)
        b.position_at_end(release)  # no helper thread could be made: run it here
        b.store_atomic(ir.Constant(I32, 0), self.busy, "release", 4)
        b.branch(serial)
        b.position_at_end(go)
        self._count(b, STAT_LOOPS)
        job = b.alloca(JOB)
        b.store(task_p, self._field(b, job, TASK_FIELD))
        b.store(ctx, self._field(b, job, CTX_FIELD))
        b.store(lo, self._field(b, job, NEXT_FIELD))
        b.store(hi, self._field(b, job, HI_FIELD))
        chunks = b.mul(b.add(helpers, _i64(1)), _i64(CHUNKS_PER_THREAD))
        chunk = b.sdiv(trips, chunks)
        chunk = b.select(b.icmp_signed("<", chunk, _i64(1)), _i64(1), chunk)
        b.store(chunk, self._field(b, job, CHUNK_FIELD))
        b.store(_i64(0), self._field(b, job, ACTIVE_FIELD))
        self._call(b, "pthread_mutex_lock", self.mutex)
        b.store(job, self.job)
        b.store_atomic(b.add(b.load_atomic(self.generation, "monotonic", 8), _i64(1)),
                       self.generation, "release", 8)
        self._call(b, "pthread_cond_broadcast", self.work)
        self._call(b, "pthread_mutex_unlock", self.mutex)
        b.call(self.run_chunks, [job, _i64(STAT_CALLER_CHUNKS)])
        self._call(b, "pthread_mutex_lock", self.mutex)
        b.store(ir.Constant(JOB.as_pointer(), None), self.job)  # late helpers find none
        wait, sleep, done = (f.append_basic_block(x) for x in ("wait", "sleep", "done"))
        b.branch(wait)
        b.position_at_end(wait)
        active = b.load(self._field(b, job, ACTIVE_FIELD))
        b.cbranch(b.icmp_signed("==", active, _i64(0)), done, sleep)
        b.position_at_end(sleep)
        self._call(b, "pthread_cond_wait", self.done, self.mutex)
        b.branch(wait)
        b.position_at_end(done)
        self._call(b, "pthread_mutex_unlock", self.mutex)
        b.store_atomic(ir.Constant(I32, 0), self.busy, "release", 4)
        b.ret_void()

    def _start(self) -> ir.Function:
        """start(): (re)initialise the mutex and the conditions, create `wanted` detached
        helper threads (HELPER_STACK stacks) with every signal blocked (Ctrl-C must reach
        the thread that runs Python's handler, never a helper), record how many started."""
        f, b = self._function("tclang_pool_start", ir.FunctionType(VOID, []))
        null = ir.Constant(I8P, None)
        self._call(b, "pthread_mutex_init", self.mutex, null)
        self._call(b, "pthread_cond_init", self.work, null)
        self._call(b, "pthread_cond_init", self.done, null)
        b.store(ir.Constant(JOB.as_pointer(), None), self.job)
        blob = ir.ArrayType(ir.IntType(8), SIGSET_BLOB)
        every, previous = b.alloca(blob), b.alloca(blob)
        self._call(b, "sigfillset", every)
        self._call(b, "pthread_sigmask", ir.Constant(I32, self.sig_block), every, previous)
        thread = b.alloca(I64, size=2)  # pthread_t: an integer or a pointer
        attributes = b.alloca(ir.ArrayType(ir.IntType(8), PTHREAD_BLOB))
        self._call(b, "pthread_attr_init", attributes)
        self._call(b, "pthread_attr_setstacksize", attributes, _i64(HELPER_STACK))
        wanted = b.load(self.wanted)
        entry = b.block
        loop, create, done = (f.append_basic_block(x) for x in ("loop", "create", "done"))
        b.branch(loop)
        b.position_at_end(loop)
        made = b.phi(I64)
        made.add_incoming(_i64(0), entry)
        b.cbranch(b.icmp_signed("<", made, wanted), create, done)
        b.position_at_end(create)
        failed = b.icmp_signed("!=", self._call(b, "pthread_create", thread,
                                                b.bitcast(attributes, I8P), self.worker,
                                                null), ir.Constant(I32, 0))
        ok = f.append_basic_block("created")
        b.cbranch(failed, done, ok)
        b.position_at_end(ok)
        self._call(b, "pthread_detach", b.load(thread))
        made.add_incoming(b.add(made, _i64(1)), ok)
        b.branch(loop)
        b.position_at_end(done)
        total = b.phi(I64)
        total.add_incoming(made, loop)
        total.add_incoming(made, create)
        self._call(b, "pthread_sigmask", ir.Constant(I32, self.sig_setmask), previous,
                   ir.Constant(I8P, None))
        self._call(b, "pthread_attr_destroy", attributes)
        b.store(total, self.helpers)
        b.store(ir.Constant(I32, 1), self.started)
        b.ret_void()
        return f

    def _configure(self) -> None:
        """tclang_pool_configure(n): use n helper threads (0: every loop on its caller);
        the pool starts on the first parallel loop after it."""
        f, b = self._function("tclang_pool_configure", ir.FunctionType(VOID, [I64]),
                              internal=False)
        b.store(f.args[0], self.wanted)
        b.ret_void()

    def _forget(self) -> None:
        """tclang_pool_forget(): the pool counts as never started (in a forked child, which
        has none of its threads); the next parallel loop starts it again."""
        f, b = self._function("tclang_pool_forget", ir.FunctionType(VOID, []),
                              internal=False)
        b.store(_i64(0), self.helpers)
        b.store(ir.Constant(I32, 0), self.started)
        b.store(ir.Constant(I32, 0), self.busy)
        b.ret_void()


def runtime_ir(triple: str, data_layout: str, sig_block: int, sig_setmask: int) -> str:
    """The runtime module's LLVM IR text for the given target; `sig_block` and
    `sig_setmask` are the target's SIG_BLOCK and SIG_SETMASK."""
    return str(_Runtime(triple, data_layout, sig_block, sig_setmask).module)
