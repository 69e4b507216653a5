"""The compile driver and its one door: the only place that sees the front end's output,
the polyhedral layer and a backend together.

    compiled = compile_kernel(defn, backend, options, Signature(shapes, sizes, layouts))

`compile_kernel` owns the rest: the tuned-options lookup, the target, the key, both caches,
the pipeline and the backend; `loop_ir`, `stage_texts`, `compile_timings` and
`schedule_kernel` answer from the request a compile recorded (`Compiled.request`), so the
runtime, export, explain and the tools never build a target, a key or a KernelInfo.

    target = compile_target(backend, options)                      # once per compile
    scheduled = schedule_stages(defn, sizes, options, target, layouts, stages)  # middle end
    artifact = backend.build(scheduled.kernel, target)              # code generation + JIT

in front of two caches: an in-memory map (same key, same process: nothing is redone) and
the disk cache (another process compiled it: the object code is loaded, nothing is
compiled). A kernel on a degraded schedule (the scheduler's fallback forced by the time
limit or a killed scheduling process, polyhedral/scheduler.py) goes in neither as if it
were the full one: never to disk (the next process tries the full schedule), and in
memory only until its `retry_at` (then the next lookup compiles again). Backends are
imported on first use, so a machine without CUDA imports tclang fine and only
`backend="cuda"` needs PyCUDA. The middle end runs in a helper process that
is replaced every 200 compilations (tclang/driver/middle_end.py: islpy leaks on every compile).
The door opens the compile's budget (tclang/budget.py) and the middle end its stages
(tclang/stages.py) before the pipeline runs: the pipeline records into them and opens
neither (`schedule_definition`, the pipeline called alone by explain or export, opens both).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import time
from dataclasses import dataclass

import numpy as np

from backends.contract import Artifact, Backend
from polyhedral import loop_ir as L
from tclang import budget as compile_budget, ctrl_c
from tclang.driver import diskcache
from tclang.driver.registry import BACKENDS, get_backend  # noqa: F401 (BACKENDS: for the CLI)
from tclang.bfloat16 import dtype_of_key
from tclang.driver.cachekey import cache_key, canonical_source, key_digest
from tclang.dtypes import DType
from tclang.errors import Span
from tclang.options import Options
from tclang.lang.parser import recursion_room
from tclang.lang.program import Definition
from tclang.recent import HeldWhileUsed, max_variants
from tclang.stages import Stages
from tclang.target import Target, bounds_checking

def compile_target(backend_name: str, options: Options) -> Target:
    """The one Target of a compile: the backend's machine, with the bounds-check mode the
    options (or TCLANG_CHECK_BOUNDS) ask for. The cache key and every stage use it."""
    machine = get_backend(backend_name).target()
    return dataclasses.replace(machine, bounds_checked=bounds_checking(options))


@dataclass(frozen=True)
class KernelInfo:
    """What running a compiled kernel needs, and what explain shows: serializable, so a
    disk-cache hit needs neither the polyhedral layer nor LLVM."""

    name: str
    sizes: tuple[str, ...]
    buffers: tuple[L.Buffer, ...]
    zero_fill: tuple[str, ...]
    statements: tuple[tuple[str, str, int], ...]  # id, source text, line
    loops: str
    schedule: str
    strategy: str
    fallback: str | None
    bounds: tuple = ()  # polyhedral.bounds.BoundsCondition, shape-generic kernels only

    def to_json(self) -> bytes:
        return json.dumps({
            "name": self.name, "sizes": self.sizes,
            "buffers": [[b.name, b.dtype.value, [L.iexpr_to_json(d) for d in b.shape], b.kind]
                        for b in self.buffers],
            "zero_fill": self.zero_fill, "statements": self.statements, "loops": self.loops,
            "schedule": self.schedule, "strategy": self.strategy, "fallback": self.fallback,
            "bounds": [[c.bad_sizes, c.message, list(c.span),
                        None if c.predicate is None else L.iexpr_to_json(c.predicate)]
                       for c in self.bounds],
        }).encode()

    @staticmethod
    def from_json(data: bytes) -> "KernelInfo":
        from polyhedral.bounds_runtime import BoundsCondition
        d = json.loads(data.decode())
        return KernelInfo(
            name=d["name"], sizes=tuple(d["sizes"]),
            buffers=tuple(L.Buffer(n, DType(t), tuple(L.iexpr_from_json(x) for x in shape), k)
                          for n, t, shape, k in d["buffers"]),
            zero_fill=tuple(d["zero_fill"]),
            statements=tuple(tuple(s) for s in d["statements"]), loops=d["loops"],
            schedule=d["schedule"], strategy=d["strategy"], fallback=d["fallback"],
            bounds=tuple(BoundsCondition(b, m, Span(*s),
                                         None if p is None else L.iexpr_from_json(p))
                         for b, m, s, p in d["bounds"]))


@dataclass
class Compiled:
    """One compilation's results. From the disk cache, `kernel` is None and `kernel_blob`
    holds its stored loop IR, read on first use (`loop_ir()`): a call needs only `info`."""

    info: KernelInfo
    artifact: Artifact
    kernel: L.Kernel | None
    timings: dict[str, float]
    cache: str  # "compiled", "memory" or "disk"
    shares: "Compiled | None" = None  # the in-memory map's entry a "memory" hit reuses
    kernel_blob: bytes | None = None
    #: the tiling's report of each band (polyhedral/tiling.py BandReport): what tclang
    #: explain's summary says of tiles; None after a cache hit (not kept on disk)
    bands: tuple | None = None
    # a degraded schedule: the time.monotonic() after which to compile again (None: full)
    retry_at: float | None = None
    made_at: float = dataclasses.field(default_factory=time.monotonic)
    retry_after: float | None = None  # a degraded one's wait before its retry, in seconds
    #: what the door compiled it from (set by `compile_kernel`): loop_ir and the stage
    #: texts are made again from it when no cache kept them
    request: "Request | None" = None

    def __post_init__(self) -> None:
        if self.retry_at is not None and self.retry_after is None:
            self.retry_after = max(0.0, self.retry_at - self.made_at)

    @property
    def degraded(self) -> bool:
        return self.retry_at is not None

    def due(self) -> bool:
        """Whether this degraded compilation should give way to a new compile now."""
        return self.retry_at is not None and time.monotonic() >= self.retry_at

    def loop_ir(self) -> L.Kernel | None:
        """The loop IR, read back from the disk cache's bytes if need be (no isl, no
        scheduling); None if there is none or it is unreadable (then schedule again)."""
        source = self.shares or self
        if source.kernel is None and source.kernel_blob is not None:
            from polyhedral.loop_serial import kernel_from_json
            try:
                with recursion_room():
                    kernel = kernel_from_json(source.kernel_blob)
            except (ValueError, TypeError, KeyError, RecursionError):
                kernel = None
            if kernel is not None and kernel.name == source.info.name:
                source.kernel = kernel
            source.kernel_blob = None
        return source.kernel


@dataclass(frozen=True)
class Signature:
    """What a compile depends on besides the definition and options: the call's shape key
    (shapes, dtypes and layout keys: `Binding.shape_key()`; ranks and dtypes when
    shape-generic; `Binding.partial_key` when partly generic), the sizes the code is
    specialized for (None: shape-generic) and each input's layout (None: generic)."""

    shapes: tuple
    sizes: dict[str, int] | None
    layouts: tuple | None


@dataclass(frozen=True)
class Request:
    """One compile as the door saw it: enough to schedule it again (loop IR, stage texts,
    timings) with the same target and options, without a key or a cache."""

    definition: Definition
    backend: str
    options: Options
    signature: Signature
    target: Target


def compile_kernel(defn: Definition, backend: str, options: Options, signature: Signature,
                   *, tuned: bool = False, fresh: bool = False) -> Compiled:
    """THE compile door: `defn` for `signature` on `backend`, through the memory and disk
    caches. `tuned`: the options tc.autotune stored for these shapes on this machine, where
    it stored any (else `options`). `fresh`: compile even when a cache has it (explain
    times every stage). The result's `request` says what was compiled."""
    if tuned:
        options = tuned_options(defn, backend, signature.shapes) or options
    target = compile_target(backend, options)
    key = cache_key(canonical_source(defn), defn.name, signature.shapes, options, backend,
                    target)
    compiled = compile_definition(defn, signature.sizes, options, backend, target, key,
                                  signature.layouts, fresh)
    compiled.request = Request(defn, backend, options, signature, target)
    return compiled


def tuned_options(defn: Definition, backend: str, shapes: tuple,
                  database=None) -> Options | None:
    """What tc.autotune stored for these shapes on this machine, or None. `database`: a
    path, default TCLANG_TUNING_DB or the cache directory's tuning.sqlite."""
    from tclang.driver.tuning_database import TuningDatabase, kernel_key, machine_id
    key = kernel_key(canonical_source(defn), defn.name, shapes, backend)
    machine = machine_id(compile_target(backend, Options()))
    found = TuningDatabase(database).best(key, machine)
    return found["options"] if found else None


def loop_ir(compiled: Compiled) -> L.Kernel:
    """The loop IR of a compile: kept, read back from the disk cache's bytes (no isl), or,
    for an entry without a readable one, scheduled again (the object code is not rebuilt)."""
    kernel = compiled.loop_ir()
    if kernel is None:
        from polyhedral.pipeline import schedule_definition
        r = compiled.request
        with recursion_room():
            kernel = schedule_definition(r.definition, r.signature.sizes, r.options,
                                         r.target, r.signature.layouts).kernel
        (compiled.shares or compiled).kernel = kernel
    return kernel


def stage_texts(compiled: Compiled) -> dict[str, str]:
    """The polyhedral stages' texts of a compile, made again for the asking (scheduling is
    deterministic): passes, scop, dependences, schedule, transform, loops."""
    from polyhedral.pipeline import schedule_definition
    r = compiled.request
    texts: dict[str, str] = {}
    with recursion_room():
        schedule_definition(r.definition, r.signature.sizes, r.options, r.target,
                            r.signature.layouts, collect=texts)
    return texts


def compile_timings(compiled: Compiled) -> dict[str, float]:
    """Seconds per stage of a compile of this kernel: its own, or, when it came from a
    cache, those of a compile made now that reads and writes neither cache."""
    if compiled.cache == "compiled":
        return dict(compiled.timings)
    r = compiled.request
    return compile_uncached(r.definition, r.signature.sizes, r.options, r.backend,
                            r.target, r.signature.layouts).timings


def schedule_kernel(defn: Definition, backend: str, options: Options,
                    signature: Signature) -> tuple[KernelInfo, L.Kernel, float | None]:
    """(KernelInfo, loop IR, retry_at) of `defn` scheduled for `backend`'s target in this
    process, nothing compiled and no cache read: what `export --target cuda` prints as
    CUDA C (retry_at not None: a degraded schedule)."""
    from polyhedral.pipeline import schedule_definition
    target = compile_target(backend, options)
    with recursion_room():
        scheduled = schedule_definition(defn, signature.sizes, options, target,
                                        signature.layouts)
    return kernel_info(scheduled, ""), scheduled.kernel, scheduled.retry_at


def kernel_info(scheduled, loops: str) -> KernelInfo:
    """The KernelInfo of a scheduled kernel (polyhedral.pipeline's result), `loops` its
    pseudo-C: the one place one is made from a schedule."""
    k = scheduled.kernel
    return KernelInfo(
        name=k.name, sizes=k.sizes, buffers=k.buffers, zero_fill=k.zero_fill,
        statements=tuple((s.id, s.text, s.line) for s in k.statements),
        loops=loops, schedule=scheduled.schedule,
        strategy=scheduled.strategy, fallback=scheduled.fallback, bounds=scheduled.bounds)


# key -> Compiled: two modules defining the same source share one compilation; one nobody
# uses is freed (its machine code with it) once max_variants() newer ones were stored, so
# that defining a module again and again (in a function, say) still finds its kernels
_memory = HeldWhileUsed(max_variants())


@contextlib.contextmanager
def expecting_compile(backend_name: str):
    """Around the parse of a source no call record answered for (tc.define): its first
    call will most likely compile, so the compile's helpers start now. The middle end's
    process (tclang/driver/middle_end.py) starts before the parse and imports isl and the
    polyhedral layer while this process parses and checks; the backend's (the CPU's LLVM
    optimizer, `Backend.prepare`) starts after it, and loads LLVM while this process
    computes the cache key and the middle end schedules: started together with the first,
    three processes shared two cores during the parse. A cold compile then waits for none
    of those imports. A backend name that is not one starts nothing: the call reports it."""
    from tclang.driver import middle_end
    from tclang.errors import TCError
    middle_end.start()
    yield
    try:
        backend = get_backend(backend_name)
    except TCError:
        return
    prepare = getattr(backend, "prepare", None)
    if prepare is not None:
        prepare()


def compile_definition(defn: Definition, sizes: dict[str, int] | None, options: Options,
                       backend_name: str, target: Target, key: tuple, layouts,
                       fresh: bool = False) -> Compiled:
    """Compile one definition for `sizes` (None: shape-generic) and `target` (from
    `compile_target`), through both caches. `layouts`: each input's strides in elements
    when specialized (the key includes them), else None. `fresh`: compile even when a
    cache has it (and replace the entries): tclang explain times every stage this way."""
    hit = None if fresh else _memory.get(key)
    if hit is not None and not hit.due():
        return Compiled(hit.info, hit.artifact, None, {}, "memory", shares=hit,
                        retry_at=hit.retry_at)
    # a Ctrl-C from here on comes out as KeyboardInterrupt, even one Python drops in a
    # finalizer or an at-fork hook (tclang/ctrl_c.py)
    with ctrl_c.Compiling():
        return _load_or_compile(defn, sizes, options, backend_name, target, key, layouts,
                                fresh, hit)


def _load_or_compile(defn: Definition, sizes, options: Options, backend_name: str,
                     target: Target, key: tuple, layouts, fresh: bool,
                     hit: "Compiled | None") -> Compiled:
    backend = get_backend(backend_name)
    digest = key_digest(key)
    start = time.perf_counter()
    blobs = None if fresh else diskcache.load(digest, key)
    if blobs is not None:
        restored = _restore(backend, blobs, key)
        if restored is not None:
            compiled = Compiled(restored[0], restored[1], None,
                                {"cache load": time.perf_counter() - start}, "disk",
                                kernel_blob=blobs.get("loop-ir"))
            _remember(key, compiled)
            return compiled
    prepare = getattr(backend, "prepare", None)
    if prepare is not None:  # e.g. LLVM loads in its own process while isl schedules
        prepare()
    compiled = _compile(defn, sizes, options, backend, target, layouts)
    if compiled.degraded and hit is not None and hit.degraded:
        _back_off(compiled, hit)
    if not compiled.degraded:  # under the key of the full schedule: only the full one
        blobs = {**compiled.artifact.blobs, "info": compiled.info.to_json()}
        loop_ir = _serialized(compiled.kernel)
        if loop_ir is not None:
            blobs["loop-ir"] = loop_ir
        diskcache.store(digest, key, blobs)
    _remember(key, compiled)
    return compiled


def _back_off(compiled: Compiled, last: Compiled) -> None:
    """Degraded again when its retry came: wait twice as long as last time before the
    next try (MAX_RETRY_AFTER at most). A program whose dependences alone spend the
    compile budget would otherwise cost this process the whole budget every RETRY_AFTER
    (the scheduler backs off its own time-outs, not a budget spent before it)."""
    from polyhedral.scheduler import MAX_RETRY_AFTER
    wait = min(MAX_RETRY_AFTER, 2 * (last.retry_after or 0.0))
    if compiled.retry_after < wait:
        compiled.retry_at, compiled.retry_after = compiled.made_at + wait, wait


def compile_uncached(defn: Definition, sizes: dict[str, int] | None, options: Options,
                     backend_name: str, target: Target, layouts) -> Compiled:
    """A compile that neither caches read nor fill: what `explain --stage timings` times
    for a kernel that came from a cache."""
    backend = get_backend(backend_name)
    with ctrl_c.Compiling():
        prepare = getattr(backend, "prepare", None)
        if prepare is not None:
            prepare()
        return _compile(defn, sizes, options, backend, target, layouts)


def _serialized(kernel: L.Kernel) -> bytes | None:
    """The loop IR for the disk cache; None if it cannot be written (then a disk hit that
    asks for `loop_ir` schedules again): the cache is an optimization, never a failure."""
    from polyhedral.loop_serial import kernel_to_json
    try:
        with recursion_room():  # as deep as the expressions the parser accepts
            return kernel_to_json(kernel)
    except (RecursionError, ValueError, TypeError):
        return None


def forget_compiled() -> None:
    """Drop every compilation this process holds in memory (their users keep theirs): the
    next compile of anything goes to the disk cache or compiles (a tuning trial measuring
    a cold compile)."""
    _memory.clear()


def _remember(key: tuple, compiled: Compiled) -> None:
    _memory.put(key, compiled)


def _restore(backend: Backend, blobs: dict[str, bytes], key: tuple):
    """The cached kernel, or None after warning: an entry that authenticated can still be
    unusable (written by a buggy or other tclang), and any failure here means rebuild,
    never crash; the rebuilt entry then replaces it."""
    try:
        info = KernelInfo.from_json(blobs["info"])
        _check_info(info, key)
        return info, backend.restore(blobs, info)
    except Exception as err:
        import warnings
        from tclang.errors import TCWarning
        warnings.warn(TCWarning(f"discarding an unusable compile cache entry "
                                f"({type(err).__name__}: {err}); rebuilding it"),
                      stacklevel=4)
        return None


def _check_info(info: KernelInfo, key: tuple) -> None:
    """ValueError unless the kernel summary agrees with the key (its name, and the rank,
    dtype and, for a specialized kernel, shape of each input): the sizes in it decide how
    much memory a call allocates and the kernel touches."""
    parts = dict(key)
    if info.name != parts["entry"]:
        raise ValueError(f"kernel {info.name!r} stored for {parts['entry']!r}")
    inputs = [b for b in info.buffers if b.kind == "input"]
    if len(inputs) != len(parts["shapes"]):
        raise ValueError(f"{len(inputs)} inputs stored for {len(parts['shapes'])}")
    for buffer, shape in zip(inputs, parts["shapes"]):
        _check_buffer(buffer, shape)
    for buffer in info.buffers:
        if any(isinstance(d, L.Int) and d.value < 0 for d in buffer.shape):
            raise ValueError(f"buffer {buffer.name} has a negative extent")


def _check_buffer(buffer: L.Buffer, shape: tuple) -> None:
    """`shape` is the key's (extents, dtype, strides) of a specialized kernel's input (an
    extent None: a generic size of a partly generic one) or (rank, dtype) of a
    shape-generic one's."""
    extents, dtype = shape[0], shape[1]
    rank = len(extents) if isinstance(extents, tuple) else extents
    name = buffer.name
    if dtype_of_key(dtype).newbyteorder("=") != np.dtype(buffer.dtype.numpy).newbyteorder("="):
        raise ValueError(f"input {name} stored as {buffer.dtype.value}, called with {dtype}")
    if len(buffer.shape) != rank:
        raise ValueError(f"input {name} stored with rank {len(buffer.shape)}, not {rank}")
    if isinstance(extents, tuple) and any(isinstance(d, L.Int) and e is not None and
                                          d.value != e
                                          for d, e in zip(buffer.shape, extents)):
        raise ValueError(f"input {name} stored for another shape than {extents}")


def _compile(defn: Definition, sizes, options: Options, backend: Backend, target: Target,
             layouts) -> Compiled:
    from polyhedral.loop_format import format_kernel
    from tclang.driver import middle_end  # isl loads on the first compile

    # one budget for the whole compile (tclang/budget.py): scheduling (in the middle end's
    # helper process, replaced now and then: islpy leaks on every compile) and code generation
    with recursion_room(), compile_budget.compiling(defn.name, options) as budget:
        scheduled = middle_end.schedule(defn, sizes, options, target, layouts,
                                        getattr(backend, "while_scheduling", None))
        fell_back = budget.fell_back
        ctrl_c.checkpoint()  # a Ctrl-C that Python dropped meanwhile: here, not after LLVM
        kernel = scheduled.kernel
        stages = Stages(defn.name)
        with stages("code"):
            artifact = backend.build(kernel, target)
        ctrl_c.checkpoint()
        stages.show("code", artifact.source)
        for name, text in artifact.stages.items():
            stages.show(name, text)
        loops = format_kernel(kernel)
        retry_at = scheduled.retry_at
        if retry_at is None and budget.fell_back != fell_back:  # the backend's way out
            from polyhedral.scheduler import RETRY_AFTER
            retry_at = time.monotonic() + RETRY_AFTER
    timings = {**scheduled.timings, **stages.timings}
    return Compiled(kernel_info(scheduled, loops), artifact, kernel, timings, "compiled",
                    bands=scheduled.bands, retry_at=retry_at)


def allocate(buffer: L.Buffer, shape: tuple[int, ...], zero: bool) -> np.ndarray:
    return (np.zeros if zero else np.empty)(shape, dtype=buffer.dtype.numpy)
