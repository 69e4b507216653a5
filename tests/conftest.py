"""Shared test settings: no hypothesis deadlines (CI machines are slow and noisy)."""

from hypothesis import HealthCheck, settings

settings.register_profile("tclang", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("tclang")
