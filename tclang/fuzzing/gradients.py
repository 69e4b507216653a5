"""Gradients of generated programs: `tc.grad` against central differences, and
`tclang.torch` through `torch.autograd.gradcheck` and `gradgradcheck`.

Each program is made float64 first (its float types, and where that alone does not
check, its float literals: tests/e2e/test_autodiff.py does the same); a program without
a gradient (tc.grad raises TCGradError: integer outputs from floats, floor, `*=` onto
part of a value, ...) is counted, not failed. For each input x that the gradient covers, the directional
derivative of F(x) = <w, f(x)> (w random) along a random v by central differences must
equal <grad_x F, v>.

Generated programs are full of kinks and jumps (fmax, abs, `?:` on data, max=!), where
no finite difference agrees with any derivative. A disagreement is therefore reported
only where the central differences with steps h and h/2 agree with each other (f is
smooth enough around x for them to mean something) and both disagree with the
derivative; otherwise the point is counted as not smooth. PyTorch's own checks are
adjudicated the same way: their failure is reported when the directional check at the
same point confirms it (`gradgradcheck` through the first derivative's differences).
"""

from __future__ import annotations

import re
import warnings

import numpy as np
from tclang.fuzzing import running
from tclang.fuzzing.running import ORACLE, Failure, compare, describe, quiet, tolerance

STEP = 1e-6
RTOL = 1e-5  # central differences in float64 err by ~h^2 |f'''|: far below this


def float64_source(source: str) -> str | None:
    """The program in float64 (its float types, then its literals if needed), or None."""
    import tclang
    plain = re.sub(r"\b(float32|float|half|float16|bfloat16|bf16)\b", "double", source)
    for text in (plain, re.sub(r"(?<![\w.])(\d+\.\d*(?:e[+-]?\d+)?)", r"double(\1)", plain)):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", tclang.TCWarning)
                tclang.define(text, backend="reference")
            return text
        except tclang.TCError:
            continue
    return None


def close(a: float, b: float, atol: float) -> bool:
    return abs(a - b) <= atol + RTOL * max(abs(a), abs(b))


def directional(objective, xs: list, i: int, v, analytic: float, noise: float):
    """None when <grad, v> (`analytic`) matches the central differences of `objective`
    along v in argument i, "not smooth" when the differences do not settle, else what
    differs. `noise`: the objective's rounding error (the differences' is noise / h)."""
    def differences(h: float) -> float:
        plus, minus = list(xs), list(xs)
        plus[i], minus[i] = xs[i] + h * v, xs[i] - h * v
        return (objective(plus) - objective(minus)) / (2 * h)
    # the step scaled to the values: relative to the largest of x and of v
    step = STEP * max(1.0, float(np.max(np.abs(np.asarray(xs[i], np.float64)), initial=0))) \
        / max(1.0, float(np.max(np.abs(np.asarray(v, np.float64)), initial=0)))
    coarse = differences(step)
    atol = 4 * noise / step
    if not np.isfinite(analytic) and not np.isfinite(coarse):
        return None
    if close(coarse, analytic, atol):
        return None
    fine = differences(step / 2)
    if not close(coarse, fine, 2 * atol) or not np.isfinite(coarse):
        return "not smooth"
    return f"<grad, v> = {analytic!r}, central differences give {coarse!r} and {fine!r}"


def _noise(defn, sizes, outputs, seeds) -> float:
    """A bound on the rounding error of <w, f(x)> (the float64 tolerance of the
    differential runner times the sum of |w| |f|)."""
    total = sum(float(np.sum(np.abs(w) * np.abs(np.asarray(o, np.float64))))
                for w, o in zip(seeds, outputs))
    return tolerance(defn, sizes) * max(total, 1e-300)


def _not_affine_under_guard() -> str:
    """A regular expression for generator._read's condition that is not affine, right
    inside a guard's `?`."""
    from tclang.fuzzing.generator import CONDITIONS_NOT_AFFINE
    forms = [re.escape(c).replace(r"\{i\}", r"\w+").replace(r"\{j\}", r"\w+")
             for c in CONDITIONS_NOT_AFFINE]
    return r"\? \(\((" + "|".join(forms) + r")\) \?"


_NOT_AFFINE_UNDER_GUARD = _not_affine_under_guard()


def grad_forms(source: str, entry: str) -> list[str]:
    """The forms of `where` clause and guard the definition has, as the summary counts
    them under "grad of ...": what the gradient checks reach (issue 35 item 5)."""
    from tclang.lang import program as P
    from tclang.lang.frontend import check_source
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        defn = check_source(source)[entry]
    clauses = " ".join(m.group(1) for m in re.finditer(r"\bwhere\b([^;}\n]*)", source))
    forms = {
        "a where-local": re.search(r"(?<![=!<>])=(?!=)", clauses) is not None,
        "a where range": re.search(r"\bin\b", clauses) is not None,
        "a range bounded by an index": any(s.affine_ranges for s in defn.statements),
        "where exists": any(s.exists for s in defn.statements),
        "a guarded read": any(isinstance(x, P.Read) and x.guard is not None
                              for s in defn.statements for x in P.walk(s.rhs)),
        "a condition not affine under a guard": re.search(_NOT_AFFINE_UNDER_GUARD, source)
        is not None,
    }
    return [f"grad of {name}" for name, found in forms.items() if found]


def check_grad(program, seed: int = 0):
    """(failures, notes) of `tc.grad` against central differences (module docstring),
    and of `tc.grad` in the program's own types where they are not all double
    (`native_grad`)."""
    native = native_grad(program, seed)
    if native is not None:
        return [native], ["grad"]
    failures, notes = _check_float64_grad(program, seed)
    if notes and notes[0].startswith("grad") and ":" not in notes[0]:
        notes = notes + grad_forms(program.source, program.entry)
    return failures, notes


def tclang_fault(err) -> bool:
    """Whether a TCGradError says tc.grad's own text does not check ("please report it"):
    tclang's bug, not a program without a gradient."""
    return "please report" in str(err)


# half, bfloat16, or float and double together: where tc.grad has to round or widen
_NATIVE = re.compile(r"\b(half|float16|bfloat16|bf16)\b")


def native_grad(program, seed: int = 0):
    """A Failure if `tc.grad` of the program in its own types fails where its float64
    form has a gradient, or gives a gradient of another type than its input; else None.
    The float64 check cannot see this: a half input's backward failed its own type check
    ("would narrow it"), for any program. Only programs with a narrow float type or with
    float and double together (the others are the float64 form's case)."""
    import tclang
    from tclang.tools.inputs import random_inputs
    src = program.source
    if not _NATIVE.search(src) and not (re.search(r"\bdouble\b", src) and
                                        re.search(r"\bfloat(32)?\b", src)):
        return None
    with quiet():
        kernel = tclang.define(src)[program.entry]
        try:
            g = tclang.grad(kernel)
        except tclang.TCGradError as err:
            if not tclang_fault(err):
                return None  # (its float64 form says whether that is right)
            return Failure("grad", None, "crash", f"tc.grad in the program's own types: "
                           f"{describe(err)}", check="grad", repro=_grad_repro(src, program))
        except Exception as err:  # noqa: BLE001 - a crash or a type check of its own text
            return Failure("grad", None, "crash", f"tc.grad in the program's own types: "
                           f"{_which_text(kernel)}{describe(err)}", check="grad",
                           repro=_grad_repro(src, program))
        rng = np.random.default_rng(seed)
        inputs = _callable(list(random_inputs(kernel.definition, program.sizes, rng)))
        try:
            outs, saved = g.forward(*inputs)
        except (tclang.TCIndexError, tclang.TCArgumentError):
            return None
        try:
            names = [t.name for t in kernel.definition.outputs]
            seeds = tuple(_ones_like(outs[names.index(n)]) for n in g.output_names)
            grads = g.backward(tuple(inputs), saved, seeds)
        except Exception as err:  # noqa: BLE001
            return Failure("grad", None, "crash", f"the backward in the program's own "
                           f"types: {describe(err)}", check="grad",
                           repro=_grad_repro(src, program))
    from tclang.dtypes import from_numpy
    from tclang.runtime.host_tensors import host_view
    params = {t.name: t for t in kernel.definition.inputs}
    for x, gx in zip(g.wrt, grads):
        array = gx if isinstance(gx, np.ndarray) else host_view(gx, "a result", "it")
        want, got = params[x].dtype, from_numpy(array.dtype)
        if got is not want:
            return Failure("grad", None, "grad-mismatch", f"d/d{x} is {got}, but {x} is "
                           f"{want.value}", check="grad", repro=_grad_repro(src, program))
    return None


def _callable(inputs: list) -> list:
    """The inputs as the kernel takes them: torch tensors (the same memory) for a
    bfloat16 program where NumPy has no bfloat16 (differential._call does the same)."""
    from tclang.bfloat16 import NUMPY_HAS_BFLOAT16, is_bfloat16
    from tclang.runtime.host_tensors import as_torch
    if NUMPY_HAS_BFLOAT16 or not any(is_bfloat16(np.asarray(a).dtype) for a in inputs):
        return inputs
    return [as_torch(a) for a in inputs]


def _ones_like(x):
    return x.new_ones(x.shape) if hasattr(x, "new_ones") else np.ones_like(x)


def _check_float64_grad(program, seed: int = 0):
    import tclang
    from tclang.tools.inputs import random_inputs
    source = float64_source(program.source)
    if source is None:
        return [], ["grad: no float64 form"]
    with quiet():
        kernel = tclang.define(source, options=tclang.Options(check_bounds=True))[program.entry]
        try:
            g = tclang.grad(kernel)
        except tclang.TCGradError as err:
            if tclang_fault(err):
                return [Failure("grad", None, "crash", f"tc.grad: {describe(err)}",
                                check="grad", repro=_grad_repro(source, program))], ["grad"]
            return [], ["grad: not differentiable"]
        except Exception as err:  # noqa: BLE001 - anything else from tc.grad is a bug
            return [Failure("grad", None, "crash", f"tc.grad: {_which_text(kernel)}"
                            f"{describe(err)}", check="grad",
                            repro=_grad_repro(source, program))], ["grad"]
        rng = np.random.default_rng(seed)
        inputs = list(random_inputs(kernel.definition, program.sizes, rng))
        try:
            kernel(*inputs)
        except (tclang.TCIndexError, tclang.TCArgumentError):
            return [], ["grad: inputs out of range"]
        try:
            problems = _grad_problems(kernel, g, inputs, program.sizes, rng)
        except tclang.TCIndexError as err:
            return [Failure("grad", None, "out-of-bounds", describe(err), check="grad")], \
                ["grad"]
        except Exception as err:  # noqa: BLE001 - the backward failing to compile or run
            return [Failure("grad", None, "crash", describe(err), check="grad",
                            repro=_grad_repro(source, program))], ["grad"]
    failures = [Failure("grad", None, "grad-mismatch", f"d/d{x}: {what}", check="grad",
                        repro=_grad_repro(source, program))
                for x, what in problems if what != "not smooth"]
    if failures:  # the differences follow the compiled forward: is it right?
        wrong = _forward_problem(source, program, kernel, inputs)
        if wrong:
            failures = [Failure("grad", None, "mismatch", f"the float64 form's forward "
                                f"(what the differences are taken of): {wrong}",
                                check="grad", repro=_grad_repro(source, program))]
    smooth = all(what != "not smooth" for _, what in problems)
    return failures, ["grad" if smooth else "grad (a point not smooth)"]


def _forward_problem(source: str, program, kernel, inputs) -> str | None:
    """What differs between the float64 form's compiled forward and the oracle's, if
    anything: a gradient that disagrees with differences of a wrong forward is the
    forward's bug."""
    from dataclasses import replace

    with quiet():
        got = kernel(*inputs)
        got = got if isinstance(got, tuple) else (got,)
        want = running.call_program(replace(program, source=source), *ORACLE, inputs, True)
    rtol = tolerance(kernel.definition, program.sizes)
    for k, (a, e) in enumerate(zip(got, want)):
        problem = compare(a, e, rtol)
        if problem:
            return f"output {k}: {problem}"
    return None


def _which_text(kernel) -> str:
    """Which of tc.grad's two texts does not check ("the training forward it generates
    does not check: ", or the backward), for a failure of tc.grad; "" if both do."""
    from tclang.autodiff import build
    from tclang.lang.frontend import check_source
    try:
        plan = build(kernel.definition, None)
    except Exception:  # noqa: BLE001 - the failure came from building it: said as it is
        return ""
    for what, text in (("the training forward", plan.forward), ("the backward", plan.backward)):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                check_source(text)
        except Exception:  # noqa: BLE001
            return f"{what} it generates does not check: "
    return ""


def _grad_problems(kernel, g, inputs, sizes, rng) -> list[tuple[str, str]]:
    defn = kernel.definition
    names = [t.name for t in defn.outputs]
    outs, saved = g.forward(*inputs)
    # the elements finite at x: an element a scatter by max=! never updates keeps the
    # identity, -inf, and would make <w, f> NaN at every step; such elements are left
    # out of the objective (their weight 0 in the seed too)
    finite = [np.isfinite(np.asarray(outs[names.index(n)], np.float64))
              for n in g.output_names]
    # each output's gradient in the output's type (a float32 output stays one in the
    # float64 form where only literals compute it)
    seeds = tuple(np.where(m, rng.standard_normal(m.shape), 0.0).astype(
        np.asarray(outs[names.index(n)]).dtype) for m, n in zip(finite, g.output_names))
    grads = g.backward(tuple(inputs), saved, seeds)

    def objective(xs) -> float:
        o = kernel(*xs)
        o = o if isinstance(o, tuple) else (o,)
        return sum(float(np.sum(w * np.where(m, np.asarray(o[names.index(n)], np.float64),
                                             0.0)))
                   for w, m, n in zip(seeds, finite, g.output_names))
    noise = _noise(defn, sizes, [np.where(m, np.asarray(outs[names.index(n)], np.float64), 0.0)
                                 for m, n in zip(finite, g.output_names)], seeds)
    params = [t.name for t in defn.inputs]
    problems = []
    for x, gx in zip(g.wrt, grads):
        i = params.index(x)
        v = rng.standard_normal(np.shape(inputs[i]))
        analytic = float(np.sum(np.asarray(gx, np.float64) * v))
        what = directional(objective, inputs, i, v, analytic, noise)
        if what is not None:
            problems.append((x, what))
    return problems


def _grad_repro(source: str, program) -> str:
    return "\n".join([
        "# tc.grad against central differences (tclang/fuzzing/gradients.py)",
        "import numpy as np, tclang as tc",
        "from tclang.tools.inputs import random_inputs",
        f"kernel = tc.define({source!r})[{program.entry!r}]",
        "g = tc.grad(kernel)",
        "print(g.source)",
        f"inputs = random_inputs(kernel.definition, {program.sizes!r}, "
        f"np.random.default_rng(0))", ""])


# ---- tclang.torch ---------------------------------------------------------------------------

def torch_available() -> bool:
    """Whether PyTorch is installed (importing it and tclang.torch, once a process)."""
    try:
        import torch  # noqa: F401

        import tclang.torch  # noqa: F401
        return True
    except ImportError:
        return False


def check_torch(program, which: str = "gradcheck", seed: int = 0):
    """(failures, notes): `torch.autograd.gradcheck` or `gradgradcheck` (`which`) on the
    float64 program through `tclang.torch.function`; skipped without PyTorch or a
    gradient. A check that fails is confirmed by the directional check at its point."""
    if not torch_available():
        return [], [f"{which}: torch not installed"]
    import torch
    from torch.autograd.gradcheck import GradcheckError

    import tclang
    import tclang.torch as tct
    from tclang.tools.inputs import random_inputs
    source = float64_source(program.source)
    if source is None:
        return [], [f"{which}: no float64 form"]
    with quiet():
        try:
            fn = tct.function(source, program.entry)
            fn.gradient
        except tclang.TCGradError:
            return [], [f"{which}: not differentiable"]
        except Exception as err:  # noqa: BLE001
            kernel = tclang.define(source)[program.entry]
            return [Failure("torch", None, "crash", f"{_which_text(kernel)}"
                            f"{describe(err)}", check=which)], [which]
        rng = np.random.default_rng(seed)
        arrays = random_inputs(fn.definition, program.sizes, rng)
        wrt = set(fn.gradient.wrt)
        xs = tuple(torch.from_numpy(np.array(a, copy=True)).requires_grad_(t.name in wrt)
                   for a, t in zip(arrays, fn.definition.inputs))
        try:
            fn(*(x.detach() for x in xs))
        except (tclang.TCIndexError, tclang.TCArgumentError):
            return [], [f"{which}: inputs out of range"]
        check = getattr(torch.autograd, which)
        try:
            check(_float_outputs(fn), xs, eps=STEP, atol=1e-5, rtol=1e-3, fast_mode=True)
            return [], [which] + [f"{which} of {form[len('grad of '):]}" for form in
                                  grad_forms(program.source, program.entry)]
        except GradcheckError as err:
            said = str(err).splitlines()[0][:200]
        except Exception as err:  # noqa: BLE001 - an error from the backward itself
            return [Failure("torch", None, "crash", f"{which}: {describe(err)}",
                            check=which)], [which]
        what = _confirm(fn, xs, rng, second=which == "gradgradcheck")
    if what is None:  # the directional check agrees: PyTorch's tolerances, not a bug
        return [], [which, f"{which}: failed, not confirmed"]
    if what == "not smooth":
        return [], [which, f"{which}: failed at a point not smooth"]
    return [Failure("torch", None, "grad-mismatch", f"{which}: {said}; confirmed: {what}",
                    check=which, repro=_torch_repro(source, program, which))], [which]


def _confirm(fn, xs, rng, second: bool) -> str | None:
    """The directional check at the point a PyTorch check failed at: of <w, f(x)> (first
    derivatives), or of <u, grad_x <w, f(x)>> (second derivatives, by differences of the
    first derivatives)."""
    import torch
    diff = [k for k, x in enumerate(xs) if x.requires_grad]
    outs = _as_tuple(fn(*xs))
    float_outs = [o for o in outs if o.dtype.is_floating_point]
    seeds = [torch.from_numpy(rng.standard_normal(tuple(o.shape))) for o in float_outs]
    us = [torch.from_numpy(rng.standard_normal(tuple(xs[k].shape))) for k in diff]

    def first(args, create_graph=False):
        args = [a.detach().requires_grad_(k in diff) for k, a in enumerate(args)]
        o = [_finite(x) for x in _as_tuple(fn(*args)) if x.dtype.is_floating_point]
        total = sum((w * x).sum() for w, x in zip(seeds, o))
        grads = torch.autograd.grad(total, [args[k] for k in diff], allow_unused=True,
                                    create_graph=create_graph)
        grads = [torch.zeros_like(args[k]) if gk is None else gk for k, gk in zip(diff, grads)]
        return total, grads, args

    def objective(args) -> float:
        with torch.enable_grad():
            total, grads, _ = first([torch.as_tensor(a) for a in args])
        if not second:
            return float(total)
        return float(sum((u * gk).sum() for u, gk in zip(us, grads)))

    base = [x.detach() for x in xs]
    if second:
        total, grads, args = first(base, create_graph=True)
        inner = sum((u * gk).sum() for u, gk in zip(us, grads))
        if inner.requires_grad:
            analytic = torch.autograd.grad(inner, [args[k] for k in diff], allow_unused=True)
        else:  # the backward recorded nothing: its own derivative is taken as zero
            analytic = [None] * len(diff)
    else:
        total, analytic, args = first(base)
    scale = 1e-14 * (1 + abs(float(objective(base)))) * 64
    for k, a in zip(diff, analytic):
        v = torch.from_numpy(rng.standard_normal(tuple(xs[k].shape)))
        value = 0.0 if a is None else float((a * v).sum())
        what = directional(objective, base, k, v, value, scale)
        if what is not None:
            return what
    return None


def _float_outputs(fn):
    """fn with its floating-point outputs only, their non-finite elements 0 (_finite):
    gradcheck takes differences of every output, and a bool one has none (PyTorch:
    "Subtraction ... with two bool tensors is not supported"; seed 36, program 40)."""
    def call(*args):
        kept = tuple(_finite(o) for o in _as_tuple(fn(*args)) if o.dtype.is_floating_point)
        return kept[0] if len(kept) == 1 else kept
    return call


def _finite(o):
    """o with its non-finite elements 0: an element a scatter by max=! never updates
    keeps the identity, -inf, and every difference of it is NaN (it has no gradient: its
    seed is 0 then)."""
    import torch
    return torch.where(torch.isfinite(o.detach()), o, torch.zeros_like(o))


def _as_tuple(x) -> tuple:
    return x if isinstance(x, tuple) else (x,)


def _torch_repro(source: str, program, name: str) -> str:
    return "\n".join([
        f"# torch.autograd.{name} through tclang.torch (tclang/fuzzing/gradients.py)",
        "import numpy as np, torch, tclang.torch as tct",
        "from tclang.tools.inputs import random_inputs",
        f"fn = tct.function({source!r}, {program.entry!r})",
        f"arrays = random_inputs(fn.definition, {program.sizes!r}, np.random.default_rng(0))",
        "xs = tuple(torch.from_numpy(a).requires_grad_(t.name in fn.gradient.wrt)",
        "           for a, t in zip(arrays, fn.definition.inputs))",
        f"torch.autograd.{name}(fn, xs, fast_mode=True)", ""])
