"""Python called from inside isl (polyhedral/isl_callbacks.py, issue 31 item 5): nothing
raises inside isl, and Ctrl-C waits until isl has returned."""

from __future__ import annotations

import ast
import re
import signal
import threading
from pathlib import Path

import islpy as isl
import pytest

from polyhedral import isl_callbacks
from polyhedral.isl_callbacks import Callbacks, descendants, maps, pieces, pw_affs, sets

ROOT = Path(__file__).resolve().parents[2]

#: islpy's own helpers (islpy/_monkeypatch.py) that call a foreach_* method
ISLPY_HELPERS = {"get_constraints", "get_basic_sets", "get_basic_maps", "get_pieces",
                 "get_terms", "get_aggregate_domain"}


def callback_methods() -> set[str]:
    """Names of islpy's methods with a callable parameter, from its type stubs. `map` and
    `sort` (isl lists') are left out: Python's lists and iterables share the names."""
    stub = Path(isl.__file__).with_name("_isl.pyi").read_text()
    names = set(re.findall(r"def (\w+)\([^)]*Callable", stub))
    assert {"foreach_set", "set_before_each_for", "map_schedule_node_bottom_up"} <= names
    return (names - {"map", "sort"}) | ISLPY_HELPERS


def test_only_isl_callbacks_hands_isl_a_callback():
    """Before: 21 calls in 10 modules of polyhedral/ (foreach_set, foreach_piece, the AST
    builder's before_each_for, ...), any of which a Ctrl-C could land in."""
    names = callback_methods()
    found = []
    for package in ("polyhedral", "tclang", "backends"):
        for path in sorted((ROOT / package).rglob("*.py")):
            if path.name == "isl_callbacks.py":
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Attribute) and node.attr in names:
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.attr}")
    assert not found, "\n".join(found)


def test_lists_read_in_isls_order():
    union = isl.UnionSet("{ A[i] : 0 <= i < 4; B[i, j] : 0 <= i, j < 2; C[] }")
    listed = []
    union.foreach_set(listed.append)
    assert [s.get_tuple_name() for s in sets(union)] == [s.get_tuple_name() for s in listed]
    umap = isl.UnionMap("{ A[i] -> B[i, 0]; B[i, j] -> C[] }")
    assert sorted(m.get_tuple_name(isl.dim_type.in_) for m in maps(umap)) == ["A", "B"]
    upa = isl.UnionPwAff("{ A[i] -> [(2i)]; B[i, j] -> [(i + j)] }")
    assert len(pw_affs(upa)) == 2
    pa = isl.PwAff("[N] -> { [i] -> [(i)] : i < N; [i] -> [(N)] : i >= N }")
    assert len(pieces(pa)) == 2


def test_descendants_visit_parents_first():
    schedule = isl.Schedule.read_from_str(isl.DEFAULT_CONTEXT, """{
        domain: "{ A[i] : 0 <= i < 4; B[i] : 0 <= i < 4 }",
        child: { sequence: [
            { filter: "{ A[i] }", child: { schedule: "[{ A[i] -> [(i)] }]" } },
            { filter: "{ B[i] }", child: { schedule: "[{ B[i] -> [(i)] }]" } } ] } }""")
    expected = []
    schedule.get_root().foreach_descendant_top_down(
        lambda node: expected.append(node.get_type()) or True)
    assert [node.get_type() for node in descendants(schedule.get_root())] == expected
    assert len(expected) == 8  # domain, sequence, and a filter, band and leaf each


def _interrupting(times: list):
    """A callback that sends this process SIGINT on its first call, as Ctrl-C would."""
    def callback(domain, aff):
        if not times:
            signal.raise_signal(signal.SIGINT)
        times.append(aff)
    return callback


def test_ctrl_c_inside_a_callback_waits_for_isl():
    pa = isl.PwAff("[N] -> { [i] -> [(i)] : i < N; [i] -> [(N)] : i >= N }")
    calls: list = []
    with pytest.raises(KeyboardInterrupt):
        with Callbacks() as region:
            pa.foreach_piece(region.guard(_interrupting(calls)))
    assert len(calls) == 2  # isl went on to its last piece; nothing failed inside isl
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_users_sigint_handler_runs_once_isl_returned():
    seen = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: seen.append(signum))
    try:
        pa = isl.PwAff("{ [i] -> [(i)] }")
        calls: list = []
        with Callbacks() as region:
            pa.foreach_piece(region.guard(_interrupting(calls)))
            assert seen == []
        assert seen == [signal.SIGINT] and len(calls) == 1
    finally:
        signal.signal(signal.SIGINT, previous)


def test_an_exception_in_a_callback_is_raised_after_isl_returned():
    """islpy would print it and make it an isl.Error ("call to ... failed")."""
    def broken(domain, aff):
        raise ZeroDivisionError("in the callback")

    pa = isl.PwAff("{ [i] -> [(i)] }")
    with pytest.raises(ZeroDivisionError, match="in the callback"):
        with Callbacks() as region:
            pa.foreach_piece(region.guard(broken))


def test_regions_nest_and_other_threads_leave_the_handler_alone():
    with Callbacks():
        outer = signal.getsignal(signal.SIGINT)
        with Callbacks():
            assert signal.getsignal(signal.SIGINT) is outer
        assert signal.getsignal(signal.SIGINT) is outer
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    seen = []

    def in_a_thread():
        with Callbacks():
            seen.append(signal.getsignal(signal.SIGINT))
    worker = threading.Thread(target=in_a_thread)
    worker.start()
    worker.join()
    assert seen == [signal.default_int_handler]


def test_map_bottom_up_raises_what_visit_raised():
    domain = isl.UnionSet("{ A[i] : 0 <= i < 4 }")
    schedule = isl.Schedule.from_domain(domain)

    def visit(node):
        raise KeyError("visit")

    with pytest.raises(KeyError, match="visit"):
        isl_callbacks.map_bottom_up(schedule, visit)


def test_a_child_forked_by_another_thread_during_a_region_gets_ctrl_c_back():
    """Another thread forks while the main thread is in a region (isl building an AST, say):
    the child's main thread is the forking one, and the region that swapped the handler
    never ends there. Before: the child kept the region's recorder as its SIGINT handler,
    so every Ctrl-C in the child was recorded and dropped, and every later region saw an
    "outer" one and deferred to it."""
    import os
    import time
    results = {}

    def fork():
        pid = os.fork()
        if pid == 0:
            code = 3
            try:
                code = 1 if signal.getsignal(signal.SIGINT) is not signal.default_int_handler \
                    else 2
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(1)  # the handler runs here: KeyboardInterrupt, or nothing
            except KeyboardInterrupt:
                code = 0 if code == 2 else code
            finally:
                os._exit(code)
        results["status"] = os.waitpid(pid, 0)[1]

    with Callbacks():
        worker = threading.Thread(target=fork)
        worker.start()
        worker.join()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert os.waitstatus_to_exitcode(results["status"]) == 0, \
        "the child's Ctrl-C handler was the parent's region recorder (1) or it was lost (2)"
