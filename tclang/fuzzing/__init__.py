"""Attacking the compiler so that it can be trusted (issue 6, and issue 31's reach).

- `generator`: random VALID programs (valid by construction, checked by the front end),
  with small concrete sizes that keep every read in bounds;
- `reductions`: guarded, masked and triangular reductions at extents near 32 and 1024;
- `features`: `tclang fuzz`'s programs: the generator's and the reduction programs, each
  with the extra checks it draws from its seed;
- `differential`: run one program under every backend and schedule, compare each with the
  reference interpreter, shrink a failing program and save it as a regression test; then
  the extra checks:
- `modules` (several definitions in random layouts through a shared disk cache),
  `gradients` (tc.grad against central differences, tclang.torch's gradcheck and
  gradgradcheck), `interrupts` (Ctrl-C during a compile);
- `driver`: the loop behind `tclang fuzz` (N programs or T seconds, in worker processes
  so that a crash of generated code is reported, not fatal).
"""
