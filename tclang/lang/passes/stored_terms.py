"""A row reduction's costly term stored once for its consumers (CPU, specialized).

Softmax as written computes `exp(X(n, d) - m(n))` twice: in the sum `s(n) +=! exp(...)`
and again in `Y(n, d) = exp(...) / s(n)`. The exponentials cost more than the memory
traffic on a CPU (4096 x 1024 float32 on the 2-core AVX-512 test machine: 3.6 ms with two
exp passes, 2.6 ms with one, 0.9 ms for the same loops with a subtraction in place of exp).
Libraries write exp into the output and rescale the row while it is in L1. Here the term
goes into a new temporary `T(n, d) = exp(...)` computed before the reduction, which then
sums `T(n, d)`; common subexpressions across statements (common.py) make the consumer read
T too. Row fusion and contraction (polyhedral/row_fusion.py, contraction.py) then keep T as
one row on the thread's stack: a store and a load in L1 per element instead of an exp.

Only where that is what happens: the term calls a costly builtin (not one of the cheap
ones below), a later statement computes the same term at the same points (else nothing is
saved), the sizes are known and one row of T (the reduction indices' extents) fits in
`slice_bytes` (else T would be a full array in memory, and the store would cost what the
exp saves). The caller (polyhedral/pipeline.py) compiles without the rewrite where T was
not contracted after all. Storing a float32 or float64 value and reading it back is exact:
the program computes bit for bit what it did.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Mapping

from tclang.dtypes import DType
from tclang.lang import program as P
from tclang.lang.passes.common import computed_in, share_across_statements
from tclang.lang.passes.rewrite import fresh_tensor_name, postorder
from tclang.lang.program_text import expression_text
from tclang.lang.sizes import known_value

#: builtins a few instructions long: recomputing them is cheaper than a store and a load
CHEAP_CALLS = frozenset("abs fabs min max fmin fmax floor round trunc copysign fdim fma "
                        "sqrt rsqrt fdivide".split())
_STORABLE = (DType.FLOAT32, DType.FLOAT64)
STORED_TERMS = "terms of row reductions stored for their consumers"  # as explain names it


def store_reduction_terms(defn: P.Definition, sizes: Mapping[str, int] | None,
                          slice_bytes: int):
    """(`defn` with each qualifying reduction's term stored, the notes, the names of the new
    temporaries)."""
    if sizes is None:
        return defn, [], ()
    notes, names = [], []
    k = 0
    while k < len(defn.statements):
        stored = _store_one(defn, k, sizes, slice_bytes)
        if stored is not None:
            defn, name = stored
            names.append(name)
            s = defn.statements[k + 1]
            notes.append(f"{s.target}: {expression_text(defn.statements[k].rhs)}  ->  "
                         f"stored in {name} for a later statement")
            k += 1
        k += 1
    return defn, notes, tuple(names)


def _store_one(defn: P.Definition, k: int, sizes, slice_bytes: int):
    """(definition, temporary's name) with statement k's term stored, or None."""
    s = defn.statements[k]
    term = s.rhs
    if not (s.is_reduction and s.reset and s.reduction_indices and s.condition is None
            and not s.exists and term.dtype in _STORABLE and _costly(term)):
        return None
    if any(str(r.lo) != "0" for r in s.domain) or len(set(s.all_indices)) != len(s.domain):
        return None
    row = 1
    for index in s.reduction_indices:
        extent = known_value(s.range_of(index).extent, sizes)
        if extent is None:  # a generic size (a partly generic compile): not known to fit
            return None
        row *= max(1, extent)
    if row * term.dtype.numpy.itemsize > slice_bytes:
        return None
    if not computed_in(term, [x.rhs for x in defn.statements[k + 1:]]):
        return None  # no consumer computes it: the pass over the program below finds none
    name = fresh_tensor_name(defn, f"{s.target}_term")
    span = s.span
    store = P.Statement(s.position, name, s.all_indices, "=", False, term, (), s.domain, (),
                        span, text=f"{name}({', '.join(s.all_indices)}) = "
                                   f"{expression_text(term)}")
    tensor = P.Tensor(name, term.dtype, tuple(r.hi for r in s.domain), "temporary", span)
    statements = defn.statements[:k] + (store,) + defn.statements[k:]
    statements = tuple(replace(x, position=j) for j, x in enumerate(statements))
    trial = replace(defn, statements=statements, temporaries=defn.temporaries + (tensor,))
    shared, _ = share_across_statements(trial)
    readers = [x for x in shared.statements if any(r.tensor == name for r in x.reads())]
    if len(readers) < 2:  # the reduction and at least one consumer
        return None
    return shared, name


def _costly(e: P.Expr) -> bool:
    return any(type(x) is P.Call and x.name not in CHEAP_CALLS for x in postorder([e]))
