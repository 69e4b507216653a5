"""tclang: a polyhedral JIT compiler for tensor comprehensions.

    import tclang as tc
    mm = tc.define("def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }")
    C = mm.mm(A, B)   # compiled on the first call for these shapes, cached after
"""

from __future__ import annotations

from tclang.version import __version__

from typing import TYPE_CHECKING

from tclang.errors import (TCArgumentError, TCCompileError, TCConfigError, TCError,
                           TCGradError, TCIndexError, TCLaunchError, TCScheduleError,
                           TCSemanticError, TCSyntaxError, TCWarning)
from tclang.boundary import api_boundary as _api_boundary

if TYPE_CHECKING:
    from tclang.options import Options

__all__ = ["define", "compile", "autotune", "compare", "grad", "Options", "TCError",
           "TCSyntaxError", "TCGradError",
           "TCSemanticError", "TCArgumentError", "TCIndexError", "TCCompileError", "TCScheduleError",
           "TCLaunchError", "TCConfigError", "TCWarning", "__version__"]


@_api_boundary
def define(source: str, backend: str = "cpu", options: Options | str | None = None):
    """Check every definition of `source` now; compile each on its first call. (A source
    this installation checked cleanly before is checked again only when something needs
    its definitions: the disk cache keeps a record of it, tclang/driver/call_records.py.)

    backend: "cpu" (LLVM), "cuda" (PyCUDA), "cuda-emulated" (the generated CUDA run on the
    host) or "reference" (the NumPy interpreter, slow, for checking). options: None for
    the automatic schedule, a `tclang.Options` with manual knobs, or "tuned": for each
    shape, the options `tc.autotune` stored in the tuning database for this machine, and
    the automatic schedule where there are none (docs/tuning.md).
    """
    from tclang.driver.registry import BACKENDS

    if backend not in BACKENDS:
        raise TCError(f"unknown backend {backend!r}; choose one of "
                      f"{', '.join(repr(b) for b in BACKENDS)}")
    tuned = options == "tuned"
    if options is not None and not tuned:
        from tclang.options import Options
        if not isinstance(options, Options):
            what = repr(options) if isinstance(options, str) else type(options).__name__
            raise TCError(f'options must be a tclang.Options or "tuned", not {what}')
    from tclang import ctrl_c
    with ctrl_c.Compiling():  # a Ctrl-C while it checks is never dropped (tclang/ctrl_c.py)
        # None: the automatic schedule (the Options object is made when first needed)
        return _module(source, backend, None if tuned else options, tuned)


def _module(source: str, backend: str, options, tuned: bool):
    """(a seam of its own: a test drops a Ctrl-C here, while define checks)"""
    from tclang.runtime.kernels import define_module
    return define_module(source, backend, options, tuned)


def __getattr__(name: str):
    """`tc.Options` is loaded on first use: the backends import `tclang.dtypes` and
    `tclang.errors` through this package and must not pull in the driver's options
    (docs/architecture.md, import rules)."""
    if name == "Options":
        from tclang.options import Options
        return Options
    raise AttributeError(f"module 'tclang' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | {"Options"})


@_api_boundary
def autotune(kernel, *args, **kwargs):
    """Search the options of `kernel` for the shapes of `args` and store the best in the
    tuning database, where `define(..., options="tuned")` finds them (docs/tuning.md).
    Keywords: budget, time_limit, executor, jobs, seed, strategy, database, store,
    progress, min_time (see tclang.tuning.search.autotune)."""
    from tclang.tuning.search import autotune as run
    return run(kernel, *args, **kwargs)


@_api_boundary
def compare(kernel, *args, **kwargs):
    """Automatic vs manual vs tuned schedules of `kernel` for `args`, and NumPy and PyTorch
    wherever tclang recognises the operator (tclang.peers): a Comparison (its `table()` is
    markdown, `plot(path)` a chart). Keywords: manual (Options or specs like
    "tile=32x32x64,unroll=4"), tune (trials), peers, rounds, limits
    (see tclang.tuning.compare.compare)."""
    from tclang.tuning.compare import compare as run
    return run(kernel, *args, **kwargs)


@_api_boundary
def grad(kernel, wrt=None):
    """The gradient of `kernel` (a definition of a module) with respect to the inputs named
    in `wrt` (default: every floating-point input), generated as comprehensions and
    compiled like any kernel: `g(*inputs, *output_gradients)` returns the gradients;
    `g.source` is the backward definition (docs/autodiff.md). `grad(g)` of a gradient is
    the gradient of its backward definition: second derivatives."""
    from tclang.autodiff import Gradient
    return Gradient(kernel, wrt)


@_api_boundary
def compile(source: str, entry: str, *args, backend: str = "cpu",
            options: Options | None = None):
    """Define `source` and compile `entry` for the shapes of `args`: a CompiledKernel."""
    return define(source, backend, options)[entry].compile(*args)
