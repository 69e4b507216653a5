"""Recurrences (scans), each in one definition: a statement reads its own output at an
earlier point. A cumulative sum, a running max, per-row scans (rows in parallel) and a
triangular solve (forward substitution, L x = b: as a scan, and as one sum per point that
reads the points before it), checked and timed against NumPy, and the solve's gradient
(tc.grad: a reverse scan with a sum inside) against its closed form."""

import numpy as np

import tclang as tc
from _check import check, timed

SOURCE = """
def cumsum(float(N) X) -> (O) {
    O(i) = (i == 0) ? X(0) : O(i - 1) + X(i)
}
def running_max(float(N) X) -> (O) {
    O(i) = (i == 0) ? X(0) : fmax(O(i - 1), X(i))
}
def row_cumsum(float(R, N) X) -> (O) {
    O(r, i) = (i == 0) ? X(r, 0) : O(r, i - 1) + X(r, i)
}
def forward_substitution(float(N, N) L, float(N) b) -> (x) {
    # P(i, j) = b(i) - sum over k < j of L(i, k) x(k), and x(k) = P(k, k) / L(k, k)
    P(i, j) = (j == 0) ? b(i) : P(i, j - 1) - L(i, j - 1) * P(j - 1, j - 1) / L(j - 1, j - 1)
        where j in 0:i + 1
    x(i) = P(i, i) / L(i, i)
}
def forward_substitution_sum(float(N, N) L, float(N) b) -> (x) {
    # a sum per point that reads the points of x before it (each is done before the next)
    x(i) +=! (k == i) ? b(i) / L(i, i) : -L(i, k) / L(i, i) * x(k) where k in 0:i + 1
}
"""


def _forward_substitution(L, b):
    x = np.zeros_like(b)
    for i in range(len(b)):
        x[i] = (b[i] - L[i, :i] @ x[:i]) / L[i, i]
    return x


def main(n: int = 100_003, rows: int = 256, cols: int = 1001, m: int = 301) -> None:
    rng = np.random.default_rng(0)
    mod = tc.define(SOURCE)
    X = rng.random(n, np.float32)
    check("cumulative sum", mod.cumsum(X), np.cumsum(X), rtol=1e-3)
    check("running max", mod.running_max(X), np.maximum.accumulate(X))
    R = rng.random((rows, cols), np.float32)
    check("per-row cumulative sum", mod.row_cumsum(R), np.cumsum(R, axis=1), rtol=1e-3)
    L = (np.tril(rng.standard_normal((m, m))) / m + np.eye(m)).astype(np.float32)
    b = rng.standard_normal(m).astype(np.float32)
    solved = _forward_substitution(L.astype(np.float64), b.astype(np.float64))
    check("forward substitution", mod.forward_substitution(L, b), solved, rtol=1e-3)
    check("forward substitution as a sum", mod.forward_substitution_sum(L, b), solved,
          rtol=1e-3)
    # d(w . x)/db = L^-T w and d/dL = -(L^-T w) x^T on the lower triangle (what x reads)
    grad = tc.grad(mod.forward_substitution_sum)
    w = rng.standard_normal(m).astype(np.float32)
    dL, db = grad(L, b, w)
    closed_db = np.linalg.solve(L.T.astype(np.float64), w)
    check("its gradient (tc.grad)", db, closed_db, rtol=1e-3)
    check("its gradient to L", dL, -np.tril(np.outer(closed_db, solved)), rtol=1e-3)
    for name, ours, theirs, args in [
            (f"cumulative sum of {n}", mod.cumsum, np.cumsum, (X,)),
            (f"running max of {n}", mod.running_max, np.maximum.accumulate, (X,)),
            (f"per-row cumulative sum {rows}x{cols}", mod.row_cumsum,
             lambda a: np.cumsum(a, axis=1), (R,)),
            (f"forward substitution {m}x{m} (NumPy: np.linalg.solve)",
             mod.forward_substitution, np.linalg.solve, (L, b)),
            (f"forward substitution as a sum {m}x{m} (NumPy: np.linalg.solve)",
             mod.forward_substitution_sum, np.linalg.solve, (L, b)),
            (f"its gradient {m}x{m} (NumPy: solve with L^T and an outer product)",
             lambda *a: grad(*a, w),
             lambda L, b: np.outer(np.linalg.solve(L.T, w), np.linalg.solve(L, b)),
             (L, b))]:
        print(f"{name}: tclang {timed(ours, *args) * 1e3:.3f} ms, "
              f"NumPy {timed(theirs, *args) * 1e3:.3f} ms")


if __name__ == "__main__":
    main()
