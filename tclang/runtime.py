"""The objects users hold: `Module` (a checked source), `Kernel` (one definition, compiled on
first call per shape), `CompiledKernel` (one compilation: run it, read its code).

A call binds and checks the arguments first (no kernel runs on bad arguments), looks the
compiled kernel up in an in-memory map keyed by what the code depends on (shapes, dtypes
and layouts when specialized; ranks and dtypes when shape-generic), compiles on a miss
(once, even when several threads call at the same time), allocates the outputs (zeroed
only where the kernel does not write every point) and runs. Each of these maps keeps the
TCLANG_MAX_VARIANTS most recently used entries (tclang/recent.py): a variant no map and
no user holds is freed, machine code included.
"""

from __future__ import annotations

import difflib
import threading
from typing import Sequence

import numpy as np

from polyhedral import loop_ir as L
from tclang.arguments import Binding, DeviceArray, bind_arguments, check_out, float_fits
from tclang.cachekey import cache_key, canonical_source
from tclang.device_calls import DeviceHotCalls
from tclang.compiler import (Compiled, allocate, compile_definition, compile_target,
                             get_backend)
from tclang.errors import TCArgumentError, TCError
from tclang.host_tensors import like_the_caller
from tclang.options import Options
from tclang.parser import recursion_room
from tclang.program import Definition, Program
from tclang.recent import Recent, max_variants


class CompiledKernel:
    """One definition compiled for one set of shapes (or for all, if shape-generic)."""

    def __init__(self, compiled: Compiled, definition: Definition, backend: str,
                 options: Options, sizes: dict[str, int] | None, shape_key: tuple | None,
                 target=None, layouts=None):
        self._c = compiled
        self._target = target  # the Target it was compiled for, and the inputs' strides
        self._layouts = layouts
        self._device = get_backend(backend).device_arrays
        self._texts: dict[str, str] | None = None  # the polyhedral stages' texts, if asked
        self.definition = definition
        self.backend = backend
        self.options = options
        self.sizes = sizes  # None when shape-generic
        self._shape_key = shape_key
        info = compiled.info
        self._zero = frozenset(info.zero_fill)
        n_in = len(definition.inputs)
        self._outputs = info.buffers[n_in:n_in + len(definition.outputs)]
        self._scratch = info.buffers[n_in + len(definition.outputs):]
        limit = max_variants()
        self._checked_sizes = Recent(limit)  # sizes whose bounds a shape-generic call checked
        self._hot = HotCalls(definition)  # hot key -> (self, prepared)
        self._device_hot = DeviceHotCalls()

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
        kernel = self._c.loop_ir()
        if kernel is None:
            from polyhedral.pipeline import schedule_definition
            target = self._target or compile_target(self.backend, self.options)
            with recursion_room():
                kernel = schedule_definition(self.definition, self.sizes, self.options,
                                             target, self._layouts).kernel
            (self._c.shares or self._c).kernel = kernel
        return kernel

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
            from polyhedral.pipeline import schedule_definition
            texts: dict[str, str] = {}
            target = self._target or compile_target(self.backend, self.options)
            with recursion_room():
                schedule_definition(self.definition, self.sizes, self.options, target,
                                    self._layouts, collect=texts)
            self._texts = texts
        return self._texts[name]

    @property
    def strategy(self) -> str:
        return self._c.info.strategy

    @property
    def fallback(self) -> str | None:
        """Why the requested fusion strategy was not used, if it was not."""
        return self._c.info.fallback

    @property
    def timings(self) -> dict[str, float]:
        return dict(self._c.timings)

    @property
    def cache(self) -> str:
        """Where this kernel came from: "compiled", "memory" or "disk" (the disk cache)."""
        return self._c.cache

    # ---- running ----
    def __call__(self, *args, out=None):
        if self._device:
            return _device_call(self, self._device_hot, args, out, lambda binding: self)
        hot = self._hot.look_up(args, out)
        if hot is not None and hot.entry is not None:
            return hot.run()
        binding = bind_arguments(self.definition, args, self._device)
        result = self.run(binding, out)
        if hot is not None:  # only once the whole call, out= included, was found right
            self._hot.remember(hot, args, binding, self)
        return like_the_caller(result, args, out)

    def run(self, binding: Binding, out=None, given=None, checked: bool = False):
        """`given`: out= arrays already checked; `checked`: the binding is known to suit
        this kernel (both from the device hot path, whose key this kernel was run on)."""
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
        self._c.artifact.run(arrays, [sizes[s] for s in self._c.info.sizes])
        for target, array in copy_back:
            if isinstance(target, DeviceArray):
                get_backend(self.backend).copy(target.obj, array.obj)
            else:
                np.copyto(target, array)
        results = [getattr(r, "obj", r) for r in results]  # device arrays: the user's kind
        return results[0] if len(results) == 1 else tuple(results)

    # ---- the hot path: a call whose dtypes, shapes and strides were checked before ----
    def prepare(self, binding: Binding) -> tuple:
        """What a repeat of this call needs: each new array's dtype, shape and whether it
        starts zeroed, and the size values."""
        self._check_applies(binding)
        sizes = binding.sizes
        new = tuple((np.zeros if buf.name in self._zero else np.empty,
                     tuple(L.evaluate(d, sizes) for d in buf.shape), buf.dtype.numpy)
                    for buf in self._outputs + self._scratch)
        return new, [sizes[s] for s in self._c.info.sizes], len(self._outputs)

    def run_prepared(self, arrays: tuple, prepared: tuple, outs: tuple | None = None):
        """`outs`: the caller's out= arrays, already known to be C-contiguous, writeable and
        apart from every other argument (HotCalls checks): written in place."""
        new, sizes, n_outputs = prepared
        try:
            if outs is None:
                made = [make(shape, dtype) for make, shape, dtype in new]
            else:
                made = list(outs) + [make(shape, dtype) for make, shape, dtype
                                     in new[n_outputs:]]
        except (MemoryError, ValueError) as err:  # say which array, as the checked path does
            buffers = self._outputs + self._scratch
            failing = next(k for k, (make, shape, dtype) in enumerate(new)
                           if not _allocates(make, shape, dtype))
            raise self._too_big(buffers[failing], new[failing][1], err) from None
        self._c.artifact.run(list(arrays) + made, sizes)
        return made[0] if n_outputs == 1 else tuple(made[:n_outputs])

    def _allocator(self, binding: Binding):
        """NumPy arrays, or device arrays like the inputs when they live on the GPU."""
        like = next((a for a in binding.arrays if isinstance(a, DeviceArray)), None)
        if like is None:
            return self._allocate
        backend = get_backend(self.backend)
        return lambda buf, shape, zero: DeviceArray(
            backend.allocate(shape, buf.dtype.numpy, zero, like.obj))

    def _device_copy(self, target: DeviceArray) -> DeviceArray:
        """A C-contiguous copy of a strided device out= array (points no statement writes
        keep their values), of the same library: the kernel writes outputs contiguously."""
        backend = get_backend(self.backend)
        array = backend.allocate(target.shape, target.dtype, False, target.obj)
        backend.copy(array, target.obj)
        return DeviceArray(array)

    def _allocate(self, buf: L.Buffer, shape: tuple[int, ...], zero: bool) -> np.ndarray:
        """A new host array; one too big for memory is the caller's error, located at the
        statement whose ranges gave it that shape (NumPy's MemoryError says neither)."""
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
            if binding.shape_key() != self._shape_key:
                raise TCArgumentError(
                    f"this CompiledKernel of {self.definition.name} was compiled for the "
                    f"sizes {self.sizes} and its arguments' dtypes and layouts "
                    "(tclang/layouts.py); call the kernel (it compiles for new shapes and "
                    "layouts) or compile again")
            return
        key = tuple(sorted(binding.sizes.items()))
        if key in self._checked_sizes:
            return
        if self._c.info.bounds:
            from polyhedral.bounds_runtime import check_generic_bounds
            check_generic_bounds(self._c.info.bounds, binding.sizes, self.definition.source)
        self._checked_sizes.put(key, True)

    def __repr__(self) -> str:
        shapes = f"sizes {self.sizes}" if self.sizes is not None else "all sizes"
        return f"<CompiledKernel {self.definition.name} for {shapes} on {self.backend}>"


class HotCalls:
    """The one hot path of `Kernel` and `CompiledKernel` calls, with or without `out=`.

    A call is hot when it looks exactly like one checked in full before: the same dtypes,
    shapes and strides of the inputs and, with out=, of the outputs (C-contiguous,
    writeable, apart from every other argument: then the kernel writes them in place).
    Every check of a call depends on nothing else, so a hot call skips them all. The map
    keeps the TCLANG_MAX_VARIANTS most recent kinds of call."""

    def __init__(self, definition: Definition):
        self._entries = Recent(max_variants())
        self._expected = tuple((t.dtype.numpy, t.rank) for t in definition.inputs)
        self._out_dtypes = tuple(t.dtype.numpy for t in definition.outputs)

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
        return _HotCall(key, arrays, outs, self._entries.get(key))

    def remember(self, call: "_HotCall", args, binding: Binding, compiled) -> None:
        if _bound_as_given(args, binding):
            self._entries.put(call.key, (compiled, compiled.prepare(binding)))


class _HotCall:
    __slots__ = ("key", "arrays", "outs", "entry")

    def __init__(self, key, arrays, outs, entry):
        self.key, self.arrays, self.outs, self.entry = key, arrays, outs, entry

    def run(self):
        compiled, prepared = self.entry
        return compiled.run_prepared(self.arrays, prepared, self.outs)


def _hot_outs(out, dtypes, arrays) -> tuple | None:
    """The out= arrays if the kernel may write them in place with no check: exact ndarrays
    of the declared dtypes, C-contiguous, writeable, sharing no memory with any other
    argument (NumPy's cheap bounds test; a maybe goes the checked way)."""
    outs = out if type(out) is tuple else (out,)
    if len(outs) != len(dtypes):
        return None
    for k, (o, dtype) in enumerate(zip(outs, dtypes)):
        if type(o) is not np.ndarray or o.dtype != dtype:
            return None
        flags = o.flags
        if not (flags.c_contiguous and flags.writeable):
            return None
        for other in arrays + outs[k + 1:]:
            if np.may_share_memory(o, other):
                return None
    return outs


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
            if not float_fits(a, converted):
                return None  # the checked path says why
            a = converted
        elif a.dtype != dtype or a.ndim != rank:
            return None
        arrays.append(a)
        parts.append(a.shape)
        parts.append(a.strides)
    return tuple(arrays), tuple(parts)


def _device_call(kernel, hot_calls: DeviceHotCalls, args, out, compiled_for):
    """A call on a GPU backend: the hot path if its tensors look like a call checked in
    full before, else the full checks (and the call is remembered)."""
    hot = hot_calls.look_up(args, out)
    if hot is not None and hot.entry is not None:
        return hot.run()
    binding = bind_arguments(kernel.definition, args, True)
    compiled = compiled_for(binding)
    result = compiled.run(binding, out)
    if hot is not None:
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
    if isinstance(array, DeviceArray):
        return array.c_contiguous
    return array.flags.c_contiguous


class Kernel:
    """One definition of a module: call it like a function."""

    def __init__(self, module: "Module", definition: Definition):
        self.module = module
        self.definition = definition
        self.name = definition.name
        limit = max_variants()
        self._compiled = Recent(limit)  # what the code depends on -> CompiledKernel
        self._lock = threading.Lock()
        # the hot path: a call like one already checked in full -> (CompiledKernel, what
        # running it again needs)
        self._hot = HotCalls(definition)
        self._device_hot = DeviceHotCalls()

    def __call__(self, *args, out=None):
        if self.module.on_device:
            return _device_call(self, self._device_hot, args, out, self._for)
        hot = self._hot.look_up(args, out)
        if hot is not None and hot.entry is not None:
            return hot.run()
        binding = bind_arguments(self.definition, args, self.module.on_device)
        compiled = self._for(binding)
        result = compiled.run(binding, out)
        if hot is not None:  # only once the whole call, out= included, was found right
            self._hot.remember(hot, args, binding, compiled)
        return like_the_caller(result, args, out)

    def compile(self, *args) -> CompiledKernel:
        """Compile for the shapes and dtypes of `args` (inputs), without running."""
        return self._for(bind_arguments(self.definition, args, self.module.on_device))

    def _for(self, binding: Binding) -> CompiledKernel:
        options = self.module.options
        fast = binding.shape_key() if options.specialize else \
            tuple((a.ndim, a.dtype.str) for a in binding.arrays)
        found = self._compiled.get(fast)
        if found is not None:
            return found
        with self._lock:  # two threads asking for the same shapes compile once
            found = self._compiled.get(fast)
            if found is None:
                found = self._compile(binding, fast)
                self._compiled.put(fast, found)
        return found

    def _compile(self, binding: Binding, fast: tuple) -> CompiledKernel:
        options, backend = self.module.options, self.module.backend
        if self.module.tuned:
            options = self._tuned_options(fast)
        sizes = dict(binding.sizes) if options.specialize else None
        layouts = tuple(strides for _, _, strides in fast) if options.specialize else None
        target = compile_target(backend, options)
        key = cache_key(canonical_source(self.definition), self.name, fast, options,
                        backend, target)
        compiled = compile_definition(self.definition, sizes, options, backend, target, key,
                                      layouts)
        return CompiledKernel(compiled, self.definition, backend, options, sizes,
                              fast if options.specialize else None, target, layouts)

    def export(self, directory, sizes: dict[str, int] | None = None, target: str = "cpu",
               arch: str = "sm_80"):
        """Write a shared library with a plain C ABI and its header into `directory`, for
        `sizes` (C-contiguous arguments of exactly those extents) or, with None, for every
        size; it runs without Python. target="cuda" also writes the .cu, PTX and cubin
        (for `arch`) and the library launches the kernels (tclang/export.py,
        docs/export.md)."""
        from tclang.export import export_kernel
        return export_kernel(self, directory, sizes, target, arch)

    def _tuned_options(self, shapes: tuple) -> Options:
        """What tc.autotune stored for these shapes on this machine, else automatic."""
        from tclang.tuning.database import TuningDatabase, kernel_key, machine_id
        key = kernel_key(canonical_source(self.definition), self.name, shapes,
                         self.module.backend)
        found = TuningDatabase().best(key, machine_id(compile_target(self.module.backend,
                                                                     Options())))
        return found["options"] if found else Options()

    @property
    def signature(self) -> str:
        return self.definition.signature()

    def __repr__(self) -> str:
        return f"<Kernel {self.signature} on {self.module.backend}>"


class Module:
    """A checked source: each definition is a `Kernel`, as `mod.name` or `mod["name"]`."""

    def __init__(self, program: Program, backend: str, options: Options,
                 tuned: bool = False):
        self.program = program
        self.backend = backend
        self.options = options
        self.tuned = tuned  # options per shape from the tuning database
        # GPU arrays are taken as they are (the backend is loaded here, not at import)
        self.on_device = get_backend(backend).device_arrays
        self._kernels = {d.name: Kernel(self, d) for d in program.definitions}

    def __getitem__(self, name: str) -> Kernel:
        try:
            return self._kernels[name]
        except KeyError:
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
