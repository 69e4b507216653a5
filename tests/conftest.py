"""Shared test settings.

- TCLANG_VERIFY=1: every schedule's legality is re-checked with isl during the tests.
- TCLANG_CACHE_DIR: a fresh directory for the session, so no kernel compiled earlier (or
  by another checkout) is reused and the user's own cache is never touched.
- TCLANG_CACHE_KEY_FILE: a fresh key outside that directory, so no test reads or creates
  the user's own cache key.
- No hypothesis deadlines: CI machines are slow and noisy.
"""

import os
import tempfile

from hypothesis import HealthCheck, settings

os.environ.setdefault("TCLANG_VERIFY", "1")
_cache = tempfile.TemporaryDirectory(prefix="tclang-test-cache-")
os.environ["TCLANG_CACHE_DIR"] = _cache.name
_key = tempfile.TemporaryDirectory(prefix="tclang-test-key-")
os.environ["TCLANG_CACHE_KEY_FILE"] = os.path.join(_key.name, "cache.key")

settings.register_profile("tclang", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("tclang")
