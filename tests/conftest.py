"""Shared test settings.

- TCLANG_VERIFY=1: every schedule's legality is re-checked with isl during the tests.
- No hypothesis deadlines: CI machines are slow and noisy.
"""

import os

from hypothesis import HealthCheck, settings

os.environ.setdefault("TCLANG_VERIFY", "1")

settings.register_profile("tclang", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("tclang")
