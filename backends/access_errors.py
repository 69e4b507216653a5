"""The error record every backend fills when an access falls outside its array.

A gather's data-dependent subscript is always checked; in bounds-checked mode
(`Options(check_bounds=True)` or TCLANG_CHECK_BOUNDS=1) every read and write is. The
first failing access (threads race for the record with a compare-and-swap on `code`)
writes: code, tensor, the dimension and value that failed, the statement, then the
number of subscripts and the subscripts themselves. The access never happens.
"""

from __future__ import annotations

from tclang.errors import TCIndexError

MAX_SUBSCRIPTS = 8
ERR_FIELDS = 6 + MAX_SUBSCRIPTS  # code, tensor, dim, value, statement, n, subscripts...


def raise_access_error(record, buffer_names, shapes, statements) -> None:
    """Turn a filled record into the TCIndexError the user sees."""
    _, tensor, dim, value, statement, n = (int(x) for x in record[:6])
    subscripts = [int(x) for x in record[6:6 + min(n, MAX_SUBSCRIPTS)]]
    name = buffer_names[tensor]
    _, text, line = statements[statement]
    element = f"{name}[{', '.join(map(str, subscripts))}]" if subscripts else name
    raise TCIndexError(f"index {value} is out of bounds for dimension {dim} of {name} "
                       f"(shape {tuple(shapes[tensor])}): element {element} in `{text}` "
                       f"(line {line}); nothing outside the array was accessed")
