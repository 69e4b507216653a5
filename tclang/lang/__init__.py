"""The language: source text -> syntax -> checked program, and the rewrites of a
checked definition. It imports nothing of the driver, the runtime, polyhedral/
or backends/ (tests/test_import_rules.py)."""
