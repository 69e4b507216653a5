"""The `tclang` command: check, explain, run, fuzz.

Errors are printed as the user would want them (file name, line, caret, hint; `error:`
before a message that names no kind of error) with exit code 1 and no traceback
(TCLANG_TRACEBACK=full prints it first, for bug reports); a bad command line gives
argparse's usage message and exit 2. Anything but a TCError is a bug: Python prints it
with its whole traceback.
"""

from __future__ import annotations

import argparse
import sys
import warnings

from tclang.boundary import full_tracebacks
from tclang.errors import TCError, TCWarning, _LocatedError


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if not hasattr(args, "run"):
        parser.print_help()
        return 2
    warnings.simplefilter("always", TCWarning)
    with warnings.catch_warnings(record=True) as caught:
        try:
            code = args.run(args)
        except TCError as err:
            if full_tracebacks():
                import traceback
                traceback.print_exception(err, file=sys.stderr)
            kind = "" if isinstance(err, _LocatedError) else "error: "  # "syntax error..."
            print(f"{getattr(args, 'file', 'tclang')}: {kind}{err}", file=sys.stderr)
            code = 1
        except KeyboardInterrupt:
            print("interrupted", file=sys.stderr)
            code = 130
    for w in caught:
        print(f"{getattr(args, 'file', 'tclang')}: warning: {w.message}", file=sys.stderr)
    return code


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tclang", description="A polyhedral JIT compiler for tensor comprehensions.")
    sub = parser.add_subparsers(title="commands")
    check = sub.add_parser("check", help="check a source file and print each definition's "
                                         "inferred signature")
    check.add_argument("file", help="a .tc source file")
    check.set_defaults(run=_check)
    from tclang.cli import commands  # the commands that need the whole compiler
    commands.add_commands(sub)
    from tclang.fuzzing import driver  # `tclang fuzz`
    driver.add_command(sub)
    return parser


def _check(args) -> int:
    from tclang.lang.frontend import check_source
    from tclang.tools.inputs import read_source
    program = check_source(read_source(args.file))
    for d in program.definitions:
        print(describe_definition(d))
    return 0


def describe_definition(d) -> str:
    """A definition as `tclang check` shows it: signature, then each statement's ranges."""
    lines = [d.signature()]
    if d.temporaries:
        temps = ", ".join(f"{t.dtype.value}({', '.join(map(str, t.shape))}) {t.name}"
                          if t.shape else f"{t.dtype.value} {t.name}" for t in d.temporaries)
        lines.append(f"  temporaries: {temps}")
    for s in d.statements:
        lines.append(f"  line {s.span.line}: {s.text}")
        free = ", ".join(f"{i} in {_range(s, i)}" for i in s.indices)
        red = ", ".join(f"{i} in {_range(s, i)}" for i in s.reduction_indices)
        parts = [f"for {free}" if free else "once"]
        if red:
            parts.append(f"reducing over {red}")
        lines.append("      " + "; ".join(parts))
    return "\n".join(lines)


def _range(s, index: str) -> str:
    """`lo:hi`; a range bounded by other indices also shows its hull (`0:i + 1 (0:N)`)."""
    r = s.range_of(index)
    for name, lo, hi in s.affine_ranges:
        if name == index:
            return f"{lo}:{hi} (within {r.lo}:{r.hi})"
    return f"{r.lo}:{r.hi}"

