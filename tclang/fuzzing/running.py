"""How the fuzzers run one program on one configuration, and how they judge the result:
the oracle, a failure's record, a kernel called as a user would, the tolerance a float
result is held to, and an error described in a line. differential.py and the extra checks
(gradients.py, interrupts.py, modules.py) all use these; `call_program` is looked up here at
each call, so a test that replaces it reaches every check.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import traceback
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

import tclang
from tclang.bfloat16 import NUMPY_HAS_BFLOAT16, bits, is_bfloat16, to_numpy_float32
from tclang.dtypes import DType
from tclang.errors import TCWarning
from tclang.fuzzing.generator import GeneratedProgram
from tclang.lang import program as P
from tclang.lang.frontend import check_source
from tclang.lang.recurrences import recurrence_reads
from tclang.runtime.host_tensors import as_torch, host_view

# the program as written: the passes on the checked program (tclang/passes) are off, so
# every other configuration, which runs them, is checked against what they must preserve
ORACLE = ("reference", tclang.Options(fusion="min", tile=(), reorder_reductions=False,
                                      passes=False))

@dataclass(frozen=True)
class Failure:
    backend: str
    options: tclang.Options | None
    # "mismatch", "crash", "out-of-bounds", "modified-input", "wrong-cached-kernel",
    # "grad-mismatch", "lost-interrupt"
    kind: str
    detail: str
    check: str = ""  # the extra check that failed (EXTRA_CHECKS); "" the differential run
    repro: str = ""  # a script reproducing it where the program's text alone does not

    @property
    def config(self) -> str:
        return label(self.backend, self.options)


def label(backend: str, options) -> str:
    return f"{backend} {options.describe() if options is not None else 'automatic'}"


def call_program(program, backend, options, inputs, check_bounds, twice=False):
    """The outputs as a tuple (both calls' when `twice`: the second takes the hot path)."""
    if check_bounds:
        options = dataclasses.replace(options or tclang.Options(), check_bounds=True)
    kernel = tclang.define(program.source, backend=backend, options=options)[program.entry]
    runs = [call_kernel(kernel, inputs) for _ in range(2 if twice else 1)]
    return runs if twice else runs[0]


def call_kernel(kernel, inputs) -> tuple:
    """kernel(*inputs) as a tuple of NumPy arrays. A bfloat16 program, where NumPy has no
    bfloat16 (no ml_dtypes), is called with torch tensors (viewing the same memory) and
    its results viewed back (bfloat16 ones in tclang's storage dtype)."""
    through_torch = not NUMPY_HAS_BFLOAT16 and any(
        t.dtype is DType.BFLOAT16 for t in kernel.definition.inputs + kernel.definition.outputs)
    out = kernel(*(tuple(as_torch(a) for a in inputs) if through_torch else inputs))
    out = out if isinstance(out, tuple) else (out,)
    return tuple(host_view(o, "a result", "it") for o in out) if through_torch else out


def same_values(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether two inputs hold the same values (bfloat16 ones: the same bits)."""
    if is_bfloat16(a.dtype):
        return np.array_equal(bits(a), bits(b))
    return np.array_equal(a, b, equal_nan=True)


@contextlib.contextmanager
def quiet():
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore", TCWarning)
        yield


def checked_definition(program: GeneratedProgram) -> P.Definition:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TCWarning)
        return check_source(program.source)[program.entry]


# ---- comparing ----------------------------------------------------------------------------

_EPS = {DType.FLOAT16: 2e-3, DType.BFLOAT16: 1.6e-2, DType.FLOAT32: 1.2e-7,
        DType.FLOAT64: 2.3e-16}


def tolerance(defn: P.Definition, sizes: dict[str, int]) -> float:
    """Relative to an output's largest magnitude. Arithmetic errs by the loosest type it is
    computed in (float16 computes in float32; a narrower cast or call counts) times the
    number of terms the statements reduce, with a margin for the math library's last bits;
    storing a half result rounds it once more (a flip of about one half ulp). Only where
    the program reads back a half value it rounded (a half temporary or output read again,
    a cast to half inside an expression) can a flip propagate through later reductions:
    then half's eps times the terms counts. A half reduction accumulated in half storage
    (an error of half's eps per term, as before tclang/lang/half_accumulators.py) is caught
    by the rest."""
    kinds = {t.dtype.compute for t in defn.inputs + defn.outputs + defn.temporaries}
    terms = 0
    for s in defn.statements:
        # an operation computed in a narrower type (a cast, or `exp(1.0)`: a float32 call
        # in a double program) rounds there
        kinds |= {n.dtype.compute for n in P.walk(s.rhs)
                  if isinstance(n, (P.Cast, P.Call, P.Binary, P.Unary, P.Select))}
        red = [r for r in s.domain if r.name in s.reduction_indices]
        terms += math.prod(max(1, (r.hi - r.lo).evaluate(sizes)) for r in red) if red else 1
        if recurrence_reads(s):  # a scan carries its rounding along its chains
            terms += sum(max(1, (r.hi - r.lo).evaluate(sizes)) for r in s.domain)
    stored = {t.dtype for t in defn.outputs + defn.temporaries if t.dtype.is_narrow_float}
    rounded = stored | {n.dtype for s in defn.statements for n in P.walk(s.rhs)
                        if isinstance(n, P.Cast) and n.dtype.is_narrow_float}
    half = max((_EPS[d] for d in rounded), default=_EPS[DType.FLOAT16])  # bfloat16's: 8x
    if _reads_back_half(defn):
        return 10 * half + half * terms
    eps = max((_EPS[k] for k in kinds if k in _EPS), default=_EPS[DType.FLOAT64])
    return min(0.05, eps * 64 * (4 + terms)) + (half if stored else 0.0)


def _reads_back_half(defn: P.Definition) -> bool:
    """Does a statement use a half value the program rounded: a read of a half tensor the
    program writes, a `+=` onto one written before, or a cast to half that is not simply
    the store of an assignment into a half tensor?"""
    written: set[str] = set()
    for s in defn.statements:
        half_target = defn.tensor(s.target).dtype.is_narrow_float
        if half_target and s.target in written and s.is_reduction and not s.reset:
            return True
        stored = s.rhs if half_target and not s.is_reduction else None
        for n in P.walk(s.rhs):
            if isinstance(n, P.Cast) and n.dtype.is_narrow_float and n is not stored:
                return True
            if isinstance(n, P.Read) and n.tensor in written and \
                    defn.tensor(n.tensor).dtype.is_narrow_float:
                return True
        written.add(s.target)
    return False


def compare(actual, expected, rtol: float) -> str | None:
    """None if `actual` matches `expected`, else what differs (briefly)."""
    actual, expected = np.asarray(actual), np.asarray(expected)
    if actual.shape != expected.shape or actual.dtype != expected.dtype:
        return f"got {actual.dtype}{actual.shape}, expected {expected.dtype}{expected.shape}"
    if is_bfloat16(expected.dtype):  # compared as the float32 values they hold
        actual, expected = to_numpy_float32(actual), to_numpy_float32(expected)
    if actual.size == 0:
        return None
    if expected.dtype.kind in "biu":
        bad = actual != expected
    else:
        a, e = actual.astype(np.float64), expected.astype(np.float64)
        finite = np.isfinite(e)
        scale = max(1.0, float(np.max(np.abs(e[finite]), initial=0.0)))
        close = np.abs(a - e) <= rtol * scale
        bad = ~(close | (a == e) | (np.isnan(a) & np.isnan(e)))
    if not bad.any():
        return None
    where = tuple(int(x) for x in np.argwhere(bad)[0])
    return (f"{int(bad.sum())} of {bad.size} elements differ, first at {where}: "
            f"{actual[where]!r} instead of {expected[where]!r}")


def first_line(err) -> str:
    return f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"


def describe(err) -> str:
    """The first line, the first line that says "error" (a compiler's), and where."""
    frames = getattr(err, "internal_traceback", None) or err.__traceback__  # (tc errors.py)
    frame = traceback.extract_tb(frames)[-1:]
    where = f" (at {Path(frame[0].filename).name}:{frame[0].lineno})" if frame else ""
    said = [line.strip() for line in str(err).splitlines()[1:] if "error" in line][:1]
    return first_line(err)[:300] + "".join(f" [{line[-200:]}]" for line in said) + where
