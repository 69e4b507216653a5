"""The front end in one function: source text -> checked `Program`.

This is what `tclang.define` calls. Only `TCError` subclasses leave it: an unexpected
internal exception is reported as a `TCCompileError` naming the stage, so users never see
a traceback from Lark or from the checker's own code.
"""

from __future__ import annotations

import gc
from dataclasses import replace

from tclang.lang.checker import check_module
from tclang.errors import TCCompileError, TCError, _LocatedError
from tclang.lang.parser import parse, recursion_room
from tclang.lang.program import Program
from tclang.lang.ranges import infer_shapes


def check_source(source: str) -> Program:
    """Parse, check and infer ranges for every definition of `source`."""
    collecting = gc.isenabled()
    gc.disable()  # the stages build many small acyclic objects: cycle scans only cost time
    try:
        module = parse(source)
        with recursion_room():  # the checker recurses per level
            program = check_module(module)
            return replace(program,
                           definitions=tuple(infer_shapes(d) for d in program.definitions))
    except _LocatedError as err:
        raise err.with_source(source) from None
    except TCError:
        raise
    except RecursionError:
        raise TCCompileError("the source nests expressions too deeply to analyse; split "
                             "long expressions with where-locals (`where x = ...`)") from None
    except Exception as err:  # a bug of tclang's own: say so instead of a raw traceback
        raise TCCompileError(f"internal error in the front end ({type(err).__name__}: {err}); "
                             "please report it with the source that caused it") from err
    finally:
        if collecting:
            gc.enable()
