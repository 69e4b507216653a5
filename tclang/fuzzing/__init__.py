"""Attacking the compiler so that it can be trusted (issue 6).

- `generator`: random VALID programs (valid by construction, checked by the front end),
  with small concrete sizes that keep every read in bounds;
- `differential`: run one program under every backend and schedule, compare each with the
  reference interpreter, shrink a failing program and save it as a regression test;
- `driver`: the loop behind `tclang fuzz` (N programs or T seconds, in a worker process
  so that a crash of generated code is reported, not fatal).
"""
