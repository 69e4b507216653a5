"""Shared test settings.

- TCLANG_VERIFY=1: every schedule's legality is re-checked with isl during the tests.
- TCLANG_CACHE_DIR: a fresh directory for the session, so no kernel compiled earlier (or
  by another checkout) is reused and the user's own cache is never touched.
- TCLANG_CACHE_KEY_FILE: a fresh key outside that directory, so no test reads or creates
  the user's own cache key.
- No hypothesis deadlines: CI machines are slow and noisy.
- Tests marked `slow` (soak tests) are skipped unless a -m expression is given, e.g.
  `pytest -m slow`.
- Ctrl-C is Python's KeyboardInterrupt even where the suite was started with SIGINT
  ignored (`nohup ... &` from a script: the shell ignores it in background jobs), as it is
  in any interactive run: the Ctrl-C tests check that tclang leaves that handler alone.
"""

import os
import signal
import tempfile

import pytest
from hypothesis import HealthCheck, settings

os.environ.setdefault("TCLANG_VERIFY", "1")
_cache = tempfile.TemporaryDirectory(prefix="tclang-test-cache-")
os.environ["TCLANG_CACHE_DIR"] = _cache.name
_key = tempfile.TemporaryDirectory(prefix="tclang-test-key-")
os.environ["TCLANG_CACHE_KEY_FILE"] = os.path.join(_key.name, "cache.key")

if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

settings.register_profile("tclang", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("tclang")


@pytest.fixture
def chunk_threads():
    """A function giving what ran parallel loops since this fixture was made, from the
    native pool's counters: "pool" (a loop was handed to the thread pool), "caller" and
    "helper" (the kinds of thread that ran a chunk of one)."""
    from backends.llvm import threads
    before = threads.statistics()

    def kinds() -> set[str]:
        now = threads.statistics()
        ran = {kind for kind in ("caller", "helper")
               if now[f"{kind}_chunks"] > before[f"{kind}_chunks"]}
        return ran | ({"pool"} if now["loops"] > before["loops"] else set())

    return kinds


def pytest_collection_modifyitems(config, items):
    """Skip `slow` tests in the default run; any -m expression decides for itself."""
    if config.getoption("markexpr"):
        return
    skip = pytest.mark.skip(reason="slow: run with -m slow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def fresh_middle_end():
    """The middle end's helper process (tclang/driver/middle_end.py) is forked by tc.define
    (or a compile) and kept: stop it before and after, so that a test's patches of the
    polyhedral layer reach the process that compiles and leave with it."""
    from tclang.driver import middle_end
    middle_end.stop()
    yield middle_end
    middle_end.stop()
