"""`tclang fuzz`'s programs: the generic generator's, with a share of reduction programs,
and the extra checks each program draws (generator.Features), all from its own seed.

Program k of seed S is `fuzz_program(random.Random(f"{S}:{k}"))` whatever --jobs is.
The generic program is drawn first, exactly as `generate` draws it; everything else
comes from a second generator seeded by the first, so that `generate`'s programs (the
CI's, the hypothesis strategy's) stay what they were.
"""

from __future__ import annotations

import random
from dataclasses import replace

from tclang.fuzzing.generator import GeneratedProgram, generate

SHARES = {
    "reduction": 0.2,  # a guarded, masked or triangular reduction program instead
    "recurrence": 0.1,  # a recurrence (a scan, a substitution, a cell) instead
    "module": 0.15,  # one definition of a module of several, in random layouts
    "gradcheck": 0.15,  # tclang.torch with torch.autograd.gradcheck
    "gradgradcheck": 0.5,  # of those: gradgradcheck too
    "tuner_options": 0.5,  # the manual options from the tuner's search space
    "interrupt": 0.05,  # an interrupted compile
    "grad": 1.0,  # tc.grad against central differences (every differentiable program)
}
INTERRUPT_WITHIN = 0.8  # seconds: the delay of the Ctrl-C is uniform below this
# (a forked child's compile of a generated program takes 0.1-1 s: its helper processes
# start anew)


def fuzz_program(rng: random.Random, shares: dict | None = None) -> GeneratedProgram:
    """The generic program, or a reduction or recurrence program, with the extra checks
    drawn."""
    from tclang.fuzzing.modules import module_plan
    from tclang.fuzzing.recurrences import recurrence_program
    from tclang.fuzzing.reductions import reduction_program
    shares = {**SHARES, **(shares or {})}
    program = generate(rng)
    extra = random.Random(rng.getrandbits(64))
    if extra.random() < shares["reduction"]:
        for _ in range(20):
            reduction = reduction_program(extra)
            if reduction is not None:
                program = reduction
                break
    if extra.random() < shares["recurrence"]:
        for _ in range(20):
            recurrence = recurrence_program(extra)
            if recurrence is not None:
                program = recurrence
                break
    module = extra.random() < shares["module"]
    gradcheck = extra.random() < shares["gradcheck"]
    gradgrad = gradcheck and extra.random() < shares["gradgradcheck"]
    tuner = extra.random() < shares["tuner_options"]
    interrupt = extra.uniform(0.0, INTERRUPT_WITHIN) \
        if extra.random() < shares["interrupt"] else None
    grad = extra.random() < shares["grad"]
    features = replace(program.features, grad=grad, gradcheck=gradcheck,
                       gradgradcheck=gradgrad, tuner_options=tuner, interrupt=interrupt)
    program = replace(program, features=features)
    if module:
        others = random.Random(extra.getrandbits(64))
        plan = module_plan(extra, program, lambda: generate(others))
        program = replace(program, features=replace(features, module=plan))
    return program
