"""The isl context a compilation uses: one per thread, reused.

islpy never gives a context's memory back: each `isl.Context()` a compilation made stayed
allocated after every object of it was gone (about 10 KB of native memory per compiled
kernel: 27 -> 176 MB over the 5,000 kernels of the soak test, tests/e2e/test_memory.py;
with one context reused, none of that grows). The cause is islpy's leak of a wrapper per
argument an isl function takes (tclang/driver/middle_end.py): each holds a count on the context. isl contexts are not thread-safe, hence one per
thread (a forked child inherits its parent's, used by its one thread only).

What a compilation sets on the context is set again by the next one that needs it
(scheduler options, operation limits, the AST builder's min/max detection); the options
one stage sets for itself only (the GPU mapping's tile options) and the operation count
are put back to isl's defaults each time the context is handed out.
"""

from __future__ import annotations

import threading

import islpy as isl

_local = threading.local()


def compilation_context() -> isl.Context:
    """This thread's isl context, with the options a compilation may have changed reset."""
    ctx = getattr(_local, "ctx", None)
    if ctx is None:
        ctx = _local.ctx = isl.Context()
        _local.defaults = (ctx.get_tile_scale_tile_loops(), ctx.get_tile_shift_point_loops(),
                           ctx.get_ast_build_detect_min_max())
    scale, shift, min_max = _local.defaults
    ctx.set_tile_scale_tile_loops(scale)
    ctx.set_tile_shift_point_loops(shift)
    ctx.set_ast_build_detect_min_max(min_max)
    ctx.set_max_operations(0)
    ctx.reset_operations()
    return ctx
