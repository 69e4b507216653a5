"""Dead code elimination: a temporary that no output depends on is not computed.

A tensor is live if it is an output or a statement writing a live tensor reads it
(`exists` clauses included); the statements writing anything else, and those
temporaries, go. Outputs are always computed, whatever reads them. A removed statement's
reads are not bounds-checked any more: they never happen.
"""

from __future__ import annotations

from dataclasses import replace

from tclang.lang import program as P


def eliminate_dead_code(defn: P.Definition):
    """`defn` without the statements and temporaries no output depends on."""
    writing: dict[str, list[P.Statement]] = {}
    for s in defn.statements:
        writing.setdefault(s.target, []).append(s)
    live = {t.name for t in defn.outputs}
    pending = list(live)  # each live tensor's writers read live tensors: once per tensor
    while pending:
        for s in writing.get(pending.pop(), ()):
            for read in [*s.reads(), *s.exists]:
                if read.tensor not in live:
                    live.add(read.tensor)
                    pending.append(read.tensor)
    dead = [t for t in defn.temporaries if t.name not in live]
    if not dead:
        return defn, []
    notes = []
    for t in dead:
        count = sum(s.target == t.name for s in defn.statements)
        notes.append(f"{t.name}: no output depends on it; {count} statement"
                     f"{'s' if count != 1 else ''} removed")
    kept = [s for s in defn.statements if s.target in live]
    statements = tuple(replace(s, position=k) for k, s in enumerate(kept))
    temporaries = tuple(t for t in defn.temporaries if t.name in live)
    return replace(defn, statements=statements, temporaries=temporaries), notes
