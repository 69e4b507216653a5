"""tclang's version: a ground value the cache keys, the tuning database and the CLI read
without importing the package face (`tclang/__init__.py` sits above them)."""

__version__ = "0.1.0"
