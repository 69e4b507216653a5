"""The objects users hold: `Module` (a checked source), `Kernel` (one definition, compiled on
first call per shape), `CompiledKernel` (one compilation: run it, read its code).

A call binds and checks the arguments first (no kernel runs on bad arguments), looks the
compiled kernel up in an in-memory map keyed by what the code depends on (shapes, dtypes
and layouts when specialized; ranks and dtypes when shape-generic), compiles on a miss
(once, even when several threads call at the same time), allocates the outputs (zeroed
only where the kernel does not write every point) and runs. Each of these maps keeps the
TCLANG_MAX_VARIANTS most recently used entries (tclang/recent.py): a variant no map and
no user holds is freed, machine code included.

A call that looks exactly like one checked in full before takes the hot path (HotCalls):
no checks, no lookups beyond one map. In a fresh process, the first such call is answered
by the disk cache's call records (tclang/driver/call_records.py), and a source checked before is
not parsed again until something needs its definitions: this module is on that path, so it
imports only NumPy and light modules at the top; the compiler, the argument checks and the
loop IR load on the first call that needs them.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

import numpy as np

from tclang.driver import call_records
from tclang.driver.call_records import Prepared
from tclang.bfloat16 import dtype_key
from tclang.boundary import api_boundary, hide_internal_frames
from tclang.errors import TCArgumentError, TCError
from tclang.runtime.host_tensors import like_the_caller, modified_in_place, refuse_numpy_bfloat16
from tclang.locks import fork_safe
from tclang.recent import Recent, max_variants
from tclang.driver.registry import get_backend

if TYPE_CHECKING:
    from polyhedral import loop_ir as L
    from tclang.runtime.arguments import Binding, DeviceArray
    from tclang.driver.compiler import Compiled
    from tclang.options import Options
    from tclang.lang.program import Definition, Program


#: Options(specialize="auto") on a contraction (Kernel._repeats_specialize): the call of
#: one shape, counted from its first on the generic variant, that gets it a specialized kernel
REPEATS_SPECIALIZED = 3

#: the backends on which Options(specialize="auto") makes partly generic kernels (the GPU
#: backends specialize every shape: their code generation is not measured generic)
PARTLY_GENERIC_BACKENDS = frozenset(("cpu", "reference"))


def bind_arguments(definition: Definition, args, device: bool) -> Binding:
    """The full checks of a call (tclang/runtime/arguments.py), loaded on the first call that
    needs them: a call a record answers never does."""
    from tclang.runtime.arguments import bind_arguments as bind
    return bind(definition, args, device)


class CompiledKernel:
    """One definition compiled for one set of shapes (or for all, if shape-generic)."""

    def __init__(self, compiled: Compiled, definition: Definition, backend: str,
                 options: Options, sizes: dict[str, int] | None, shape_key: tuple | None,
                 fixed: tuple | None = None,
                 generic: tuple[str, ...] = ()):
        self._c = compiled
        self._device = get_backend(backend).device_arrays
        self._texts: dict[str, str] | None = None  # the polyhedral stages' texts, if asked
        self.definition = definition
        self.backend = backend
        self.options = options
        self.sizes = sizes  # None when shape-generic; the constant ones when partly generic
        #: the sizes this kernel takes at run time: () when specialized, all when
        #: shape-generic, those that changed when made by Options(specialize="auto")
        self.generic = generic if sizes is not None else tuple(definition.sizes)
        self._shape_key = shape_key
        self._fixed = fixed  # partly generic: per input, which extents are constants
        info = compiled.info
        self._zero = frozenset(info.zero_fill)
        n_in = len(definition.inputs)
        self._outputs = info.buffers[n_in:n_in + len(definition.outputs)]
        self._scratch = info.buffers[n_in + len(definition.outputs):]
        limit = max_variants()
        self._checked_sizes = Recent(limit)  # sizes whose bounds a shape-generic call checked
        self._hot = HotCalls.of(definition)  # hot key -> (self, prepared)
        self._device_hot = _device_hot_calls() if self._device else None

    @property
    def compiled(self) -> Compiled:
        """The driver's record of this compile (its KernelInfo, artifact and request)."""
        return self._c

    # ---- what users read ----
    @property
    def source(self) -> str:
        """The generated code: LLVM IR (cpu), CUDA C (cuda), Python (reference)."""
        return self._c.artifact.source

    @property
    def loops(self) -> str:
        """The loop nest as readable pseudo-C, with parallel/vector annotations."""
        return self._c.info.loops

    @property
    def schedule(self) -> str:
        """The final isl schedule tree, in isl's YAML notation."""
        return self._c.info.schedule

    @property
    def loop_ir(self) -> L.Kernel:
        """The loop IR itself (frozen dataclasses), for tools and tests. After a disk-cache
        hit it is read from the entry (no isl); only an entry without a readable one is
        scheduled again (the object code is not rebuilt)."""
        from tclang.driver.compiler import loop_ir
        return loop_ir(self._c)

    @property
    def stages(self) -> dict[str, str]:
        """The backend's texts by stage name (llvm, llvm-opt; cuda; python)."""
        return dict(self._c.artifact.stages)

    def stage_text(self, name: str) -> str:
        """The text of one compile stage (tclang.stages.STAGES): the polyhedral ones are
        made again for the asking (scheduling is deterministic), the others are kept."""
        from tclang.stages import STAGES, check_names
        check_names([name])
        if name == "loops":
            return self.loops
        if name == "code":
            return self.source
        if name in self._c.artifact.stages:
            return self._c.artifact.stages[name]
        if name in ("llvm", "llvm-opt", "cuda", "python"):
            raise TCError(f"the {self.backend} backend has no {name!r} stage; its stages are "
                          f"{', '.join(list(STAGES)[:6] + list(self._c.artifact.stages))}")
        if self._texts is None:
            from tclang.driver.compiler import stage_texts
            self._texts = stage_texts(self._c)
        return self._texts[name]

    def summary(self, sizes: dict[str, int] | None = None, limits: dict | None = None):
        """The schedule's decisions on one screen (tclang/driver/summary.py; `.text()` prints
        it): fusion, tiles and why, register tile, packing, threads, vector loops, guards
        left in innermost loops, temporaries, and a roofline estimate for `sizes` (default:
        the sizes it was compiled for) against `limits` (tclang.driver.roofline.
        machine_limits(), or None). Tile reasons are known after a compile in this
        process: `Kernel.compile(..., fresh=True)` makes one."""
        from tclang.driver.summary import summarize
        from tclang.driver.roofline import kernel_work
        if sizes is None and self.sizes is not None and not self.generic:
            sizes = self.sizes
        flops, moved = kernel_work(self.definition, sizes) if sizes is not None else (0, 0)
        return summarize(self.loop_ir, strategy=self.strategy, fallback=self.fallback,
                         options=self.options.describe(), bands=(self._c.shares or self._c).bands,
                         flops=flops, moved=moved, limits=limits)

    @property
    def strategy(self) -> str:
        return self._c.info.strategy

    @property
    def fallback(self) -> str | None:
        """Why the requested fusion strategy was not used, if it was not."""
        return self._c.info.fallback

    @property
    def timings(self) -> dict[str, float]:
        """Seconds per stage of what this call did: a compile's stages, or "cache load"
        (a disk hit), or nothing (in memory already). `compile_timings()` always times
        a compile."""
        return dict(self._c.timings)

    def compile_timings(self) -> dict[str, float]:
        """Seconds per stage of a compile of this kernel: this one's, or, when it came
        from a cache (which times only its load), those of a compile made now for the
        asking, that reads and writes neither cache (explain --stage timings)."""
        from tclang.driver.compiler import compile_timings
        return compile_timings(self._c)

    @property
    def cache(self) -> str:
        """Where this kernel came from: "compiled", "memory" or "disk" (the disk cache)."""
        return self._c.cache

    @property
    def degraded(self) -> bool:
        """Whether its schedule is a fallback forced by circumstance (the scheduler ran
        past its time limit, or its process died): `fallback` says which. The kernel's
        `Kernel` compiles it again after a while (polyhedral/scheduler.py, RETRY_AFTER),
        and no disk-cache entry or call record holds it."""
        return self._c.degraded

    # ---- running ----
    def __call__(self, *args, out=None):
        try:
            result = self._hot.fastest_result(args, out)
            if result is not None:
                return result
            if self._device:
                return _device_call(self, self._device_hot, args, out, lambda binding: self)
            hot = self._hot.look_up(args, out)
            if hot is not None and hot.entry is not None:
                return hot.run()
            refuse_numpy_bfloat16(self.definition, args, out)
            binding = bind_arguments(self.definition, args, self._device)
            result = self.run(binding, out)
            if hot is not None:  # only once the whole call, out= included, was found right
                self._hot.remember(hot, args, binding, self)
            return like_the_caller(result, args, out)
        except TCError as err:  # the API boundary (hide_internal_frames)
            hide_internal_frames(err)
            raise

    def run(self, binding: Binding, out=None, given=None, checked: bool = False):
        """`given`: out= arrays already checked; `checked`: the binding is known to suit
        this kernel (both from the device hot path, whose key this kernel was run on)."""
        from polyhedral import loop_ir as L
        from tclang.runtime.arguments import DeviceArray, check_out
        if not checked:
            self._check_applies(binding)
        sizes = binding.sizes
        if given is None and out is not None:
            given = check_out(self.definition, out, binding)
        arrays: list = list(binding.arrays)
        new = self._allocator(binding)
        results, copy_back = [], []
        for k, buf in enumerate(self._outputs):
            target = given[k] if given is not None else None
            if target is not None and _contiguous(target):
                array = target  # points no statement writes keep their values
            else:
                shape = tuple(L.evaluate(d, sizes) for d in buf.shape)
                if isinstance(target, DeviceArray):  # the same, on the device
                    array = self._device_copy(target)
                    copy_back.append((target, array))
                elif target is not None:  # computed contiguous, then copied into out=
                    array = np.ascontiguousarray(target)
                    copy_back.append((target, array))
                else:
                    array = new(buf, shape, buf.name in self._zero)
            arrays.append(array)
            results.append(target if target is not None else array)
        for buf in self._scratch:
            shape = tuple(L.evaluate(d, sizes) for d in buf.shape)
            arrays.append(new(buf, shape, buf.name in self._zero))
        try:
            self._c.artifact.run(arrays, [sizes[s] for s in self._c.info.sizes])
            for target, array in copy_back:
                if isinstance(target, DeviceArray):
                    get_backend(self.backend).copy(target.obj, array.obj)
                else:
                    np.copyto(target, array)
        finally:  # (a kernel that fails part way has written some of out= already)
            if out is not None or given is not None:
                modified_in_place(out if out is not None else
                                  tuple(getattr(g, "obj", g) for g in given))
        results = [getattr(r, "obj", r) for r in results]  # device arrays: the user's kind
        return results[0] if len(results) == 1 else tuple(results)

    # ---- the hot path: a call whose dtypes, shapes and strides were checked before ----
    def prepare(self, binding: Binding) -> Prepared:
        """What a repeat of this call needs: each new array's dtype, shape and whether it
        starts zeroed, and the size values."""
        from polyhedral import loop_ir as L
        self._check_applies(binding)
        sizes = binding.sizes
        new = tuple((np.zeros if buf.name in self._zero else np.empty,
                     tuple(L.evaluate(d, sizes) for d in buf.shape), buf.dtype.numpy)
                    for buf in self._outputs + self._scratch)
        return Prepared(new, [sizes[s] for s in self._c.info.sizes], len(self._outputs))

    def run_prepared(self, arrays: tuple, prepared: Prepared, outs: tuple | None = None):
        """`outs`: the caller's out= arrays, already known to be C-contiguous, writeable and
        apart from every other argument (HotCalls checks): written in place."""
        try:
            return run_prepared(self._c.artifact.run, arrays, prepared, outs)
        except _AllocationFailed as failed:  # say which array, as the checked path does
            new = prepared.new
            buffers = self._outputs + self._scratch
            k = next(k for k, (make, shape, dtype) in enumerate(new)
                     if not _allocates(make, shape, dtype))
            raise self._too_big(buffers[k], new[k][1], failed.error) from None

    def _allocator(self, binding: Binding):
        """NumPy arrays, or device arrays like the inputs when they live on the GPU."""
        from tclang.runtime.arguments import DeviceArray
        like = next((a for a in binding.arrays if isinstance(a, DeviceArray)), None)
        if like is None:
            return self._allocate
        backend = get_backend(self.backend)
        return lambda buf, shape, zero: DeviceArray(
            backend.allocate(shape, buf.dtype.numpy, zero, like.obj))

    def _device_copy(self, target: DeviceArray) -> DeviceArray:
        """A C-contiguous copy of a strided device out= array (points no statement writes
        keep their values), of the same library: the kernel writes outputs contiguously."""
        from tclang.runtime.arguments import DeviceArray
        backend = get_backend(self.backend)
        array = backend.allocate(target.shape, target.dtype, False, target.obj)
        backend.copy(array, target.obj)
        return DeviceArray(array)

    def _allocate(self, buf: L.Buffer, shape: tuple[int, ...], zero: bool) -> np.ndarray:
        """A new host array; one too big for memory is the caller's error, located at the
        statement whose ranges gave it that shape (NumPy's MemoryError says neither)."""
        from tclang.driver.compiler import allocate
        try:
            return allocate(buf, shape, zero)
        except (MemoryError, ValueError) as err:
            raise self._too_big(buf, shape, err) from None

    def _too_big(self, buf: L.Buffer, shape: tuple[int, ...], err: Exception) -> TCArgumentError:
        nbytes = buf.dtype.numpy.itemsize * int(np.prod(shape, dtype=object))
        defn = self.definition
        writer = next((st for st in defn.statements if st.target == buf.name), None)
        span = writer.span if writer is not None else None
        return TCArgumentError(
            f"{buf.name} of {defn.name} would have shape {shape} ({buf.dtype.value}, "
            f"{nbytes:,} bytes), which cannot be allocated ({type(err).__name__}: {err})",
            span, defn.source, hint="check the sizes of the arguments and the ranges that "
                                    "this statement infers")

    def _check_applies(self, binding: Binding) -> None:
        if self._shape_key is not None:
            key = binding.shape_key() if self._fixed is None else \
                binding.partial_key(self._fixed)
            if key != self._shape_key:
                raise TCArgumentError(
                    f"this CompiledKernel of {self.definition.name} was compiled for the "
                    f"sizes {self.sizes} and its arguments' dtypes and layouts "
                    "(tclang/layouts.py); call the kernel (it compiles for new shapes and "
                    "layouts) or compile again")
            if self._fixed is None:
                return
            zero = [n for n in self.generic if binding.sizes[n] == 0]
            if zero:  # its code assumes every generic size is at least 1 (polyhedral/scop.py)
                raise TCArgumentError(
                    f"this CompiledKernel of {self.definition.name} is generic in "
                    f"{', '.join(self.generic)} for values of at least 1, not "
                    f"{', '.join(f'{n} = 0' for n in zero)}; call the kernel (it runs such a "
                    "call on a specialized kernel)")
        key = tuple(sorted(binding.sizes.items()))
        if key in self._checked_sizes:
            return
        if self._c.info.bounds:
            from polyhedral.bounds_runtime import check_generic_bounds
            check_generic_bounds(self._c.info.bounds, binding.sizes, self.definition.source)
        self._checked_sizes.put(key, True)

    def __repr__(self) -> str:
        shapes = f"sizes {self.sizes}" if self.sizes is not None else "all sizes"
        if self.sizes is not None and self.generic:
            shapes += f", generic in {', '.join(self.generic)}"
        return f"<CompiledKernel {self.definition.name} for {shapes} on {self.backend}>"


class HotCalls:
    """The one hot path of `Kernel` and `CompiledKernel` calls, with or without `out=`.

    A call is hot when it looks exactly like one checked in full before: the same dtypes,
    shapes and strides of the inputs and, with out=, of the outputs (C-contiguous,
    writeable, apart from every other argument: then the kernel writes them in place).
    Every check of a call depends on nothing else, so a hot call skips them all. The map
    keeps the TCLANG_MAX_VARIANTS most recent kinds of call."""

    def __init__(self, expected: tuple, out_dtypes: tuple):
        """expected: (NumPy dtype, rank) of each input; out_dtypes: each output's dtype."""
        self._entries = Recent(max_variants())
        self._expected = expected
        self._out_dtypes = out_dtypes
        #: the fastest paths, for the most recent kind of call without out= and with it:
        #: `fastest(args)` / `fastest_out(args, out)` is the result, or None (the arrays
        #: differ from that call's: nothing ran)
        self.fastest = None
        self.fastest_out = None

    def fastest_result(self, args, out):
        """The result of this call by the fastest path, or None (it did not apply)."""
        if out is None:
            fastest = self.fastest
            return None if fastest is None else fastest(args)
        fastest = self.fastest_out
        return None if fastest is None else fastest(args, out)

    @staticmethod
    def of(definition: Definition) -> "HotCalls":
        return HotCalls(tuple((t.dtype.numpy, t.rank) for t in definition.inputs),
                        tuple(t.dtype.numpy for t in definition.outputs))

    def __len__(self) -> int:
        return len(self._entries)

    def look_up(self, args, out) -> "_HotCall | None":
        """The call's key and, if seen before, its entry; None: not a call the hot path
        can take (a list, a scalar that does not fit, an out= that needs checking)."""
        found = hot_key(args, self._expected)
        if found is None:
            return None
        arrays, key = found
        outs = None
        if out is not None:
            outs = _hot_outs(out, self._out_dtypes, arrays)
            if outs is None:
                return None
            key = (key, tuple(o.shape for o in outs))
        entry = self._entries.get(key)
        if entry is not None and entry.fastest is not None:  # now the most recent of its kind
            if outs is None:
                self.fastest = entry.fastest
            else:
                self.fastest_out = entry.fastest
        return _HotCall(key, arrays, outs, entry)

    def remember(self, call: "_HotCall", args, binding: Binding, compiled,
                 fastest: bool = True) -> Prepared | None:
        """Keep the entry of a call checked in full; its `prepared` part, or None when the
        call is not one the hot path may repeat."""
        if not _bound_as_given(args, binding):
            return None
        prepared = compiled.prepare(binding)
        self.keep(call, compiled, prepared, compiled.compiled.artifact, fastest)
        return prepared

    def keep(self, call: "_HotCall", runner, prepared: Prepared, artifact,
             fastest_path: bool = True) -> None:
        """Keep the entry of this call (`runner.run_prepared` runs it; a CompiledKernel,
        or a call record's runner), for its repeats; with `fastest_path`, also as the
        native call that repeats skip every lookup for (Artifact.bind)."""
        fastest = None
        if fastest_path and artifact.bind is not None:
            strides = _bound_strides(call, prepared)
            if call.outs is None:
                fastest = _fastest(artifact.bind(call.arrays, sizes=prepared.sizes,
                                                 strides=strides), prepared)
            else:
                fastest = _fastest_out(artifact.bind(call.arrays + call.outs,
                                                     sizes=prepared.sizes, strides=strides),
                                       prepared)
        entry = HotEntry(runner, prepared, fastest)
        self._entries.put(call.key, entry)
        call.entry = entry
        if fastest is not None:
            if call.outs is None:
                self.fastest = fastest
            else:
                self.fastest_out = fastest


def _bound_strides(call: "_HotCall", prepared: Prepared) -> list[int]:
    """Every array's strides in elements for a bound call: the inputs' (and out='s) as
    they are, the arrays the runtime makes row-major (`prepared`)."""
    from tclang.layouts import row_major
    given = call.arrays + (call.outs or ())
    strides = [s // a.itemsize for a in given for s in a.strides]
    for _, shape, _ in prepared.new[len(call.outs or ()):]:
        strides.extend(row_major(shape))
    return strides


def _retry_due(runner) -> bool:
    """Whether a hot entry's runner is a degraded kernel whose retry has come (then the
    checked path compiles again, and its call replaces the entry)."""
    compiled = getattr(runner, "compiled", None)
    return compiled is not None and compiled.due()


def _fastest(call, prepared: Prepared):
    """`fastest(args)` over a bound native call (Artifact.bind): allocate the outputs, run
    if the arrays look like the bound ones; the result, or None when they do not (or the
    kernel reported an error, or the outputs cannot be allocated: the checked path, taken
    next, runs the call again and says why)."""
    if call is None:
        return None
    new, n_outputs = prepared.new, prepared.outputs
    if len(new) == 1:
        make, shape, dtype = new[0]

        def fastest(args):
            try:
                made = make(shape, dtype)
            except (MemoryError, ValueError):
                return None
            return made if call(*args, made) == 0 else None
        return fastest

    def fastest_many(args):
        try:
            made = [make(shape, dtype) for make, shape, dtype in new]
        except (MemoryError, ValueError):
            return None
        if call(*args, *made) != 0:
            return None
        return made[0] if n_outputs == 1 else tuple(made[:n_outputs])
    return fastest_many


@dataclass(frozen=True, slots=True)
class HotEntry:
    """A call checked in full, kept for its repeats: `runner.run_prepared` runs it (a
    CompiledKernel, or a call record's runner), `prepared` says what it allocates, and
    `fastest` is its native call bound to those very arrays (Artifact.bind), or None."""

    runner: object
    prepared: Prepared
    fastest: object = None


class _HotCall:
    __slots__ = ("key", "arrays", "outs", "entry")

    def __init__(self, key, arrays, outs, entry):
        self.key, self.arrays, self.outs, self.entry = key, arrays, outs, entry

    def run(self):
        entry = self.entry
        return entry.runner.run_prepared(self.arrays, entry.prepared, self.outs)


def _fastest_out(call, prepared: Prepared):
    """`fastest_out(args, out)` over a native call bound to a call with out= (its outputs
    among the bound arrays): what _hot_outs checks of the out= arrays that depends on more
    than their type, dtype, shape and strides (writeable, sharing no memory with another
    argument) is checked here, the rest by the bound call."""
    if call is None:
        return None
    new, n_outputs = prepared.new, prepared.outputs
    scratch = new[n_outputs:]

    def fastest_out(args, out):
        outs = out if type(out) is tuple else (out,)
        if len(outs) != n_outputs or not _writable_apart(outs, args):
            return None
        try:
            made = [make(shape, dtype) for make, shape, dtype in scratch]
        except (MemoryError, ValueError):
            return None
        if call(*args, *outs, *made) != 0:
            return None
        return outs[0] if n_outputs == 1 else outs
    return fastest_out


def _hot_outs(out, dtypes, arrays) -> tuple | None:
    """The out= arrays if the kernel may write them in place with no check: exact ndarrays
    of the declared dtypes, C-contiguous, writeable, sharing no memory with any other
    argument (NumPy's cheap bounds test; a maybe goes the checked way)."""
    outs = out if type(out) is tuple else (out,)
    if len(outs) != len(dtypes):
        return None
    for o, dtype in zip(outs, dtypes):
        if type(o) is not np.ndarray or o.dtype != dtype or not o.flags.c_contiguous:
            return None
    return outs if _writable_apart(outs, arrays) else None


def _writable_apart(outs: tuple, others: tuple) -> bool:
    """Whether the out= arrays are exact, writeable ndarrays that share no memory with
    each other or with `others` (NumPy's cheap bounds test: a maybe counts as sharing)."""
    for k, o in enumerate(outs):
        if type(o) is not np.ndarray or not o.flags.writeable:
            return False
        for other in others + outs[k + 1:]:
            if np.may_share_memory(o, other):
                return False
    return True


def _allocates(make, shape, dtype) -> bool:
    try:
        make(shape, dtype)
        return True
    except (MemoryError, ValueError):
        return False


def hot_key(args, expected):
    """(arrays, key) when every argument is a NumPy array (or a Python float for a float
    scalar) of the declared dtype and rank; None sends the call down the checked path.
    Equal keys mean equal dtypes, shapes and strides, and every check of a call depends on
    nothing else: a key seen before needs none of them again."""
    if len(args) != len(expected):
        return None
    arrays, parts = [], []
    for a, (dtype, rank) in zip(args, expected):
        if type(a) is not np.ndarray:
            if rank != 0 or type(a) is not float or dtype.kind != "f":
                return None
            with np.errstate(over="ignore"):
                converted = np.asarray(a, dtype)
            if np.isfinite(a) and not np.isfinite(converted):  # arguments.float_fits
                return None  # the checked path says why
            a = converted
        elif a.dtype != dtype or a.ndim != rank:
            return None
        arrays.append(a)
        parts.append(a.shape)
        parts.append(a.strides)
    return tuple(arrays), tuple(parts)


def _device_hot_calls():
    from tclang.runtime.device_calls import DeviceHotCalls
    return DeviceHotCalls()


def _device_call(kernel, hot_calls, args, out, compiled_for):
    """A call on a GPU backend: the hot path if its tensors look like a call checked in
    full before, else the full checks (and the call is remembered)."""
    hot = hot_calls.look_up(args, out)
    if hot is not None and hot.entry is not None:
        return hot.run()
    refuse_numpy_bfloat16(kernel.definition, args, out)
    binding = bind_arguments(kernel.definition, args, True)
    compiled = compiled_for(binding)
    result = compiled.run(binding, out)
    if hot is not None and not compiled.degraded:  # see Kernel.__call__
        hot_calls.remember(hot, binding, compiled)
    return like_the_caller(result, args, out)


def _bound_as_given(args: tuple, binding: Binding) -> bool:
    """Whether the checked call ran on the very arrays the hot path would pass. An argument
    the checks had to convert (a copy of strides that are not whole elements, of another
    byte order) is not: its key describes the original, which the kernel must never see.
    Python floats are converted by hot_key exactly as the checks convert them."""
    return all(bound is given or type(given) is float
               for given, bound in zip(args, binding.arrays))


def _contiguous(array) -> bool:
    if isinstance(array, np.ndarray):
        return array.flags.c_contiguous
    return array.c_contiguous  # a DeviceArray


class Kernel:
    """One definition of a module: call it like a function."""

    def __init__(self, module: "Module", name: str, expected: tuple, out_dtypes: tuple):
        """expected, out_dtypes: what the hot path compares (HotCalls); the definition
        itself is read from the module when first needed."""
        self.module = module
        self.name = name
        limit = max_variants()
        self._compiled = Recent(limit)  # what the code depends on -> CompiledKernel
        self._lock = fork_safe(threading.Lock())  # held for a whole compile
        # the hot path: a call like one already checked in full -> (CompiledKernel, what
        # running it again needs)
        self._hot = HotCalls(expected, out_dtypes)
        self._device_hot = _device_hot_calls() if module.on_device else None
        self._definition: Definition | None = None
        # Options(specialize="auto"): each size's first value, the sizes that took another
        self._first_sizes: dict[str, int] = {}
        self._changed: set[str] = set()
        self._fixed_dims: dict[tuple, tuple] = {}  # generic sizes -> per input, fixed dims
        self._first: CompiledKernel | None = None  # the first specialized variant
        self._generic_calls = Recent(limit)  # shapes -> calls run on a generic variant
        #: what this kernel made, for tests and tools: "specialized", "generic" (some or
        #: all sizes generic) variants looked up in the caches, and how many of them were
        #: "compiled" (not found in the in-memory map or the disk cache)
        self.compile_stats = {"specialized": 0, "generic": 0, "compiled": 0}

    @property
    def definition(self) -> Definition:
        if self._definition is None:
            self._definition = self.module.program_definition(self.name)
        return self._definition

    def __call__(self, *args, out=None):
        try:
            result = self._hot.fastest_result(args, out)
            if result is not None:
                return result
            if self.module.on_device:
                return _device_call(self, self._device_hot, args, out, self._for)
            hot = self._hot.look_up(args, out)
            if hot is not None:
                if hot.entry is None and self.module.records:
                    self._recorded(hot)
                if hot.entry is not None and not _retry_due(hot.entry.runner):
                    try:
                        return hot.run()
                    except _AllocationFailed:
                        pass  # the checked path says which array, and where
            refuse_numpy_bfloat16(self.definition, args, out)
            binding = bind_arguments(self.definition, args, self.module.on_device)
            compiled = self._for(binding)
            result = compiled.run(binding, out)
            if hot is not None and compiled.generic and self._repeats_specialize():
                hot = None  # its repeats come this way and are counted (`_route`)
            if hot is not None:  # only once the whole call, out= included, was found right
                # a degraded kernel (CompiledKernel.degraded) gets no fastest path, which
                # would keep it past its retry, and no call record, which would keep it for good
                degraded = compiled.degraded
                prepared = self._hot.remember(hot, args, binding, compiled, fastest=not degraded)
                if prepared is not None and self.module.records and not degraded:
                    module = self.module
                    call_records.remember_call(module.source, self.name, module.backend_object,
                                               module.backend, module.options_key(), hot.key,
                                               compiled, prepared)
            return like_the_caller(result, args, out)
        except TCError as err:  # the API boundary (hide_internal_frames)
            hide_internal_frames(err)
            raise

    def _recorded(self, hot: "_HotCall") -> None:
        """The disk cache's record of this very call, made hot (call_records.py)."""
        module = self.module
        try:
            found = call_records.load_call(module.source, self.name, module.backend_object,
                                           module.backend, module.options_key(), hot.key)
        except (TCError, ValueError, KeyError, OSError):
            found = None  # an authenticated record this process cannot use: the full path
        if found is not None:
            artifact, prepared = found
            self._hot.keep(hot, _Recorded(artifact), prepared, artifact)

    @api_boundary
    def compile(self, *args, fresh: bool = False) -> CompiledKernel:
        """Compile for the shapes and dtypes of `args` (inputs), without running.
        fresh: compile again even when a cache holds the kernel, so that every stage runs
        and is timed (`timings`) and the tiling's reasons are known (`summary()`)."""
        binding = bind_arguments(self.definition, args, self.module.on_device)
        if not fresh:
            return self._for(binding, note=False)
        fast, generic = self._route(binding, note=False)
        with self._lock:
            compiled = self._compile(binding, fast, generic, fresh=True)
            self._compiled.put(fast, compiled)
        return compiled

    def _policy(self) -> bool | str:
        """True (specialize), False (shape-generic) or "auto" (docs/schedules.md, Dynamic
        shapes): the options' `specialize`, except that a tuned module (options per shape)
        and the GPU backends specialize where "auto" is asked."""
        policy = self.module.options.specialize
        if policy == "auto" and (self.module.tuned or
                                 self.module.backend not in PARTLY_GENERIC_BACKENDS):
            return True
        return policy

    @property
    def generic_sizes(self) -> tuple[str, ...]:
        """The sizes that Options(specialize="auto") compiles generic code for from now on:
        those that took a second value (in definition order)."""
        return tuple(n for n in self.definition.sizes if n in self._changed)

    def _route(self, binding: Binding, note: bool = True) -> tuple:
        """(what the code depends on, the generic sizes of a partly generic kernel or
        None). Specialized: shapes, dtypes and layouts; shape-generic: ranks and dtypes.
        "auto": a specialized kernel until a size takes a second value (`note`: this
        call's sizes count), then a kernel generic in the sizes that changed; a call whose
        shapes have a specialized kernel already (the first ones) keeps it, and a call
        where a generic size is 0 gets one (partly generic code assumes them >= 1)."""
        policy = self._policy()
        if policy is False:
            return tuple((a.ndim, dtype_key(a.dtype)) for a in binding.arrays), None
        shapes = binding.shape_key()
        if policy is True:
            return shapes, None
        if note:
            for name, value in binding.sizes.items():
                if self._first_sizes.setdefault(name, value) != value:
                    self._changed.add(name)
        generic = self.generic_sizes
        if not generic or any(binding.sizes[n] == 0 for n in generic):
            return shapes, None  # (a partly generic kernel assumes its sizes are >= 1)
        found = self._compiled.get(shapes)
        if found is not None and not found.generic and not found._c.due():
            return shapes, None
        if note and self._repeats_specialize():  # a contraction: shapes that recur
            calls = (self._generic_calls.get(shapes) or 0) + 1
            self._generic_calls.put(shapes, calls)
            if calls >= REPEATS_SPECIALIZED:
                return shapes, None
        fixed = self._fixed_dims.get(generic)
        if fixed is None:
            names = set(generic)
            fixed = tuple(tuple(not (d.names() & names) for d in t.shape)
                          for t in self.definition.inputs)
            self._fixed_dims[generic] = fixed
        return binding.partial_key(fixed), generic

    def _repeats_specialize(self) -> bool:
        """Whether shapes that recur get specialized kernels in "auto" mode: on kernels
        whose first specialized variant has a register tile (a contraction: matmul, an MLP
        layer, a convolution), where the generic variant measured up to 2.2x (matmul) and
        11.7x (an MLP layer of one row) slower
        (docs/schedules.md, Dynamic shapes); elsewhere it stays within ~1.25x."""
        first = self._first
        return first is not None and "unrolled" in first.loops

    def _for(self, binding: Binding, note: bool = True) -> CompiledKernel:
        fast, generic = self._route(binding, note)
        found = self._compiled.get(fast)
        if found is not None and not found._c.due():
            return found
        with self._lock:  # two threads asking for the same shapes compile once
            found = self._compiled.get(fast)
            if found is None or found._c.due():  # or a degraded one's retry has come
                found = self._compile(binding, fast, generic)
                self._compiled.put(fast, found)
                if self._first is None and not found.generic and self._policy() == "auto":
                    self._first = found
        return found

    def _compile(self, binding: Binding, fast: tuple, generic: tuple | None = None,
                 fresh: bool = False) -> CompiledKernel:
        """`generic`: the sizes a partly generic kernel takes at run time (`_route`)."""
        from tclang.driver.compiler import Signature, compile_kernel
        backend = self.module.backend
        specialize = self._policy() is not False
        fixed = None
        if generic:
            sizes = {n: v for n, v in binding.sizes.items() if n not in generic}
            fixed = self._fixed_dims[generic]
        else:
            sizes = dict(binding.sizes) if specialize else None
        layouts = tuple(strides for _, _, strides in fast) if specialize else None
        compiled = compile_kernel(self.definition, backend, self.module.options,
                                  Signature(fast, sizes, layouts), tuned=self.module.tuned,
                                  fresh=fresh)
        self.compile_stats["generic" if generic or not specialize else "specialized"] += 1
        if compiled.cache == "compiled":
            self.compile_stats["compiled"] += 1
        return CompiledKernel(compiled, self.definition, backend, compiled.request.options,
                              sizes, fast if specialize else None, fixed,
                              generic or ())

    @api_boundary
    def export(self, directory, sizes: dict[str, int] | None = None, target: str = "cpu",
               arch: str = "sm_80"):
        """Write a shared library with a plain C ABI and its header into `directory`, for
        `sizes` (C-contiguous arguments of exactly those extents) or, with None, for every
        size; it runs without Python. target="cuda" also writes the .cu, PTX and cubin
        (for `arch`) and the library launches the kernels (tclang/export/library.py,
        docs/export.md)."""
        from tclang.export.library import export_kernel
        return export_kernel(self, directory, sizes, target, arch)

    @api_boundary
    def tuned_options(self, *args, database=None) -> Options | None:
        """The options tc.autotune stored for the shapes, dtypes and layouts of `args`
        (inputs) on this machine, or None where it stored none (what `options="tuned"`
        compiles with, and `tclang compare --tuned` times). `database`: a path, default
        TCLANG_TUNING_DB or the cache directory's tuning.sqlite."""
        from tclang.driver.compiler import tuned_options
        binding = bind_arguments(self.definition, args, self.module.on_device)
        return tuned_options(self.definition, self.module.backend, binding.shape_key(),
                             database)

    @property
    def signature(self) -> str:
        return self.definition.signature()

    def __repr__(self) -> str:
        return f"<Kernel {self.signature} on {self.module.backend}>"


class _AllocationFailed(Exception):
    """A prepared call could not allocate its arrays (`error`: NumPy's)."""

    def __init__(self, error: Exception):
        super().__init__(str(error))
        self.error = error


def run_prepared(run, arrays: tuple, prepared: Prepared, outs: tuple | None = None):
    """Run a hot entry: allocate what `prepared` (CompiledKernel.prepare) says beyond the
    out= arrays `outs`, call `run` (an Artifact's), return the outputs."""
    new, sizes, n_outputs = prepared.new, prepared.sizes, prepared.outputs
    given = list(outs or ())
    try:
        made = given + [make(shape, dtype) for make, shape, dtype in new[len(given):]]
    except (MemoryError, ValueError) as err:
        raise _AllocationFailed(err) from None
    run(list(arrays) + made, sizes)
    return made[0] if n_outputs == 1 else tuple(made[:n_outputs])


class _Recorded:
    """A hot entry's runner made from a call record: the artifact alone (no definition,
    no compiled summary). An allocation that fails raises _AllocationFailed: that call
    goes the checked way, which says where."""

    def __init__(self, artifact):
        self._run = artifact.run

    def run_prepared(self, arrays: tuple, prepared: Prepared, outs: tuple | None = None):
        return run_prepared(self._run, arrays, prepared, outs)


class Module:
    """A checked source: each definition is a `Kernel`, as `mod.name` or `mod["name"]`.

    Made from a `Program`, or from a source that a source record says checked cleanly
    (`signatures`): then it is checked again only when its definitions are first needed
    (`program`), which a call answered by a call record never does."""

    def __init__(self, program: Program | None, backend: str, options: Options | None,
                 tuned: bool = False, source: str | None = None,
                 signatures: list[dict] | None = None):
        """options: None for the automatic schedule (Options() when first asked for:
        a call answered by a call record never loads tclang.options)."""
        self._program = program
        self.source = program.source if program is not None else source
        self.backend = backend
        self._options = options
        self._automatic = options is None
        self.tuned = tuned  # options per shape from the tuning database
        # GPU arrays are taken as they are (the backend is loaded here, not at import)
        self.backend_object = get_backend(backend)
        self.on_device = self.backend_object.device_arrays
        # whether calls are written to and answered from the disk cache's call records
        self.records = not tuned and bool(getattr(self.backend_object, "call_blobs", ())) \
            and call_records.enabled()
        if signatures is None:
            signatures = [dict(name=d.name,
                               inputs=[(t.dtype.numpy, t.rank) for t in d.inputs],
                               outputs=[t.dtype.numpy for t in d.outputs])
                          for d in program.definitions]
        self._kernels = {s["name"]: Kernel(self, s["name"], tuple(s["inputs"]),
                                           tuple(s["outputs"])) for s in signatures}

    @property
    def options(self) -> Options:
        if self._options is None:
            from tclang.options import Options
            self._options = Options()
        return self._options

    def options_key(self) -> tuple | str:
        """The options as a call record's key: "automatic" for the automatic schedule."""
        return "automatic" if self._automatic else self._options.key()

    @property
    def program(self) -> Program:
        """The checked source (checked now if the module was made from a source record)."""
        if self._program is None:
            from tclang.lang.frontend import check_source
            self._program = check_source(self.source)
        return self._program

    def program_definition(self, name: str) -> Definition:
        return next(d for d in self.program.definitions if d.name == name)

    @api_boundary
    def __getitem__(self, name: str) -> Kernel:
        try:
            return self._kernels[name]
        except KeyError:
            import difflib
            close = difflib.get_close_matches(name, list(self._kernels), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise TCError(f"no definition named {name!r}: this source defines "
                          f"{', '.join(self._kernels) or 'nothing'}{hint}") from None

    def __getattr__(self, name: str) -> Kernel:
        if name.startswith("__"):
            raise AttributeError(name)
        try:
            return self[name]
        except TCError as err:
            raise AttributeError(str(err)) from None

    def __iter__(self):
        return iter(self._kernels.values())

    def __dir__(self) -> Sequence[str]:
        return list(super().__dir__()) + list(self._kernels)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._kernels)

    def __repr__(self) -> str:
        return f"<tclang Module {', '.join(self._kernels)} on {self.backend}>"


def define_module(source: str, backend: str = "cpu", options: Options | None = None,
                  tuned: bool = False) -> Module:
    """The Module of a source: what `tc.define` returns (without its argument checks and
    its Ctrl-C guard), for the tools below the package face (the tuner's trials, the checks'
    reference runs). A source checked before without error or warning (a source record of
    the disk cache, tclang/driver/call_records.py) is not parsed again until its
    definitions are needed; any other is checked now, and recorded when it checks
    cleanly."""
    if not isinstance(source, str) or not call_records.enabled():
        from tclang.lang.frontend import check_source
        with _expecting_compile(backend):
            program = check_source(source)
        return Module(program, backend, options, tuned=tuned)
    signatures = call_records.signatures(source)
    if signatures is not None:
        return Module(None, backend, options, tuned=tuned, source=source,
                      signatures=signatures)
    with _expecting_compile(backend):
        from tclang.lang.checker import warnings_given
        from tclang.lang.frontend import check_source
        before = warnings_given()
        program = check_source(source)
    if warnings_given() == before:
        call_records.remember_source(source, program)
    return Module(program, backend, options, tuned=tuned)


def _expecting_compile(backend: str):
    """The compiler's helpers start around the parse (compiler.expecting_compile; the
    compiler module loads here, not for a source a call record answers)."""
    from tclang.driver.compiler import expecting_compile
    return expecting_compile(backend)
