"""The TCLANG_* environment variables tclang reads, parsed and checked in one place.

An unset or empty variable means its default. Any other value must be one the variable
takes, or it is refused with a `TCConfigError` that names the variable, the value and
what it takes: a typo never quietly leaves a setting at its default. (Once,
`TCLANG_DISK_CACHE=no` left the disk cache on, since only 0, off and false turned it off;
`TCLANG_MAX_LLVM_IR_MB=nan` turned the limit off, no size being larger than nan; and
`TCLANG_NUM_THREADS=four` was ignored.)

Read where used, not once at import: tests and long-running programs change them. A
lookup is a dictionary read and a few string operations, cheap on any path that reads one.
"""

from __future__ import annotations

import contextlib

import math
import os

from tclang.errors import TCConfigError

ON = ("1", "true", "yes", "on")
OFF = ("0", "false", "no", "off")


def switch(name: str, default: bool) -> bool:
    """An on/off variable: 1, true, yes or on; 0, false, no or off (any case)."""
    raw = os.environ.get(name, "")
    text = raw.strip().lower()
    if not text:
        return default
    if text in ON:
        return True
    if text in OFF:
        return False
    raise TCConfigError(f"{name} must be one of {', '.join(ON)} (on) or {', '.join(OFF)} "
                        f"(off), not {raw!r}; unset, it is {'on' if default else 'off'}")


def whole_number(name: str, default: int | None) -> int | None:
    """A whole number of at least 1."""
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    try:
        value = int(text)
    except ValueError:  # not digits (or more than Python converts)
        value = 0
    if value < 1:
        raise _not(name, text, "a whole number of at least 1", default)
    return value


def positive_number(name: str, default: float) -> float:
    """A finite number above 0 (nan and inf are refused: every comparison with nan is
    false, so a limit of nan would limit nothing)."""
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise _not(name, text, "a finite number above 0", default)
    return value


def choice(name: str, choices: tuple[str, ...]) -> str | None:
    """One of `choices` (any case), or None when unset."""
    raw = os.environ.get(name, "")
    text = raw.strip().lower()
    if not text:
        return None
    if text not in choices:
        raise TCConfigError(f"{name} must be one of {', '.join(choices)}, not {raw!r}; unset "
                            "it for the default")
    return text


def _not(name: str, text: str, what: str, default) -> TCConfigError:
    shown = "" if default is None else f" ({default:g})" if isinstance(default, float) \
        else f" ({default})"
    unset = "unset it for the default" + shown
    return TCConfigError(f"{name} must be {what}, not {text!r}; {unset}")


@contextlib.contextmanager
def set_for_a_while(**values: str):
    """TCLANG_* variables set to `values` inside the block and put back after (unset where
    they were unset): a cold compile, a fuzzed module's own caches. Saving a value is not
    reading it, so nothing here interprets one."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
