"""Every error and warning tclang shows a user.

All classes live here so that every layer raises the same, documented types. Errors that
come from the source text carry a `Span`; their `str()` shows the source line with a caret
under the offending text, and a hint on what to do, in the style of Triton's compile errors.
"""

from __future__ import annotations

from typing import NamedTuple


class Span(NamedTuple):
    """A region of the source text; lines and columns are 1-based, end is exclusive.

    A named tuple rather than a dataclass: the parser makes one per token, and tuples are
    several times cheaper to build.
    """

    line: int
    column: int
    end_line: int
    end_column: int

    def merge(self, other: "Span") -> "Span":
        """The smallest span covering both (used for nodes built from several tokens)."""
        start = min((self.line, self.column), (other.line, other.column))
        end = max((self.end_line, self.end_column), (other.end_line, other.end_column))
        return Span(start[0], start[1], end[0], end[1])


def one_line_end(text: str) -> str:
    """`text` with every line ending written "\\n": "\\r\\n" (Windows) and a bare "\\r" (old
    Mac files) each end one line, as in Python's universal newlines. The parser counts
    lines in this text and errors show lines of it, so a caret is always under its token."""
    return text.replace("\r\n", "\n").replace("\r", "\n") if "\r" in text else text


def source_lines(text: str) -> list[str]:
    """The lines of a source as spans number them (1-based: `source_lines(s)[line - 1]`)."""
    return one_line_end(text).split("\n")


def render_location(source: str | None, span: Span | None) -> str:
    """The source line of `span` with a caret row underneath (empty without a source)."""
    if source is None or span is None:
        return ""
    lines = source_lines(source)
    if not 1 <= span.line <= len(lines):
        return ""
    text = lines[span.line - 1].expandtabs(1)
    start = max(span.column - 1, 0)
    if span.end_line == span.line:
        width = max(span.end_column - span.column, 1)
    else:
        width = max(len(text) - start, 1)
    caret = " " * start + "^" * width
    return f"    {text.rstrip()}\n    {caret}"


class TCError(Exception):
    """Base class of every error tclang raises on purpose.

    Raised out of the public API (`tc.define`, a kernel call, `tc.grad`, ...), its
    traceback ends at the caller's line: tclang's own frames are cut at the boundary
    (`api_boundary`), as JAX and Triton cut theirs, and kept in `internal_traceback`;
    TCLANG_TRACEBACK=full keeps them in place (for bug reports)."""

    internal_traceback = None  # the frames cut at the API boundary, if any were


class _LocatedError(TCError):
    """An error at a place in the user's source: `.line`, `.column`, `.span`, `.hint`."""

    kind = "error"

    def __init__(self, message: str, span: Span | None = None, source: str | None = None,
                 hint: str | None = None):
        self.message = message
        self.span = span
        self.source = source
        self.hint = hint
        super().__init__(message)

    @property
    def line(self) -> int | None:
        return self.span.line if self.span else None

    @property
    def column(self) -> int | None:
        return self.span.column if self.span else None

    def with_source(self, source: str) -> "_LocatedError":
        """Attach the full source text (layers below the parser do not keep it)."""
        if self.source is None:
            self.source = source
        return self

    def __str__(self) -> str:
        where = f" at line {self.line}, column {self.column}" if self.span else ""
        parts = [f"{self.kind}{where}: {self.message}"]
        shown = render_location(self.source, self.span)
        if shown:
            parts.append(shown)
        if self.hint:
            parts.append(f"hint: {self.hint}")
        return "\n".join(parts)


class TCSyntaxError(_LocatedError):
    """The source text does not follow the grammar."""

    kind = "syntax error"


class TCSemanticError(_LocatedError):
    """The source parses but breaks a rule of the language (types, names, ranges)."""

    kind = "semantic error"


class TCArgumentError(_LocatedError, ValueError):
    """Call-time arguments do not fit the definition: count, rank, size, dtype, layout.

    May carry a span when the problem is a read of the source that the concrete sizes
    would put out of bounds.
    """

    kind = "argument error"


class TCIndexError(TCError, IndexError):
    """A data-dependent index (a gather) fell outside its tensor at run time."""


class TCCompileError(TCError):
    """A backend failed to build a kernel; the message says which stage and why."""


class TCLaunchError(TCError, RuntimeError):
    """A built kernel failed on its device: the GPU refused a launch or faulted while it
    ran. The message names the generated function and the launch's grid and block."""


class TCScheduleError(_LocatedError, ValueError):
    """A manual schedule (`tclang.Options`) is invalid or would break a dependence."""

    kind = "schedule error"


class TCConfigError(TCError, ValueError):
    """A TCLANG_* environment variable holds a value tclang cannot use; the message names
    the variable, the value and what it takes (tclang/environment.py)."""


class TCWarning(UserWarning):
    """Something legal but probably not what the author meant, or a recovered fault."""


class TCGradError(_LocatedError):
    """A gradient cannot be generated: the definition (at the statement shown) uses an
    operation with no usable derivative, or wrt= names no differentiable input."""

    kind = "gradient error"


class TCZeroGradientError(TCGradError):
    """No output depends on the inputs differentiated with respect to: the gradient is
    zero everywhere. tc.grad says so rather than generate a kernel of zeros; a double
    backward through tclang.torch takes it as the zero it is (tclang/torch.py)."""
