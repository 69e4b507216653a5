"""Evaluate the automatic schedule against manual ones: fusion, tile sizes, loop order.

Every manual schedule is checked for legality (an illegal one is refused, naming the
dependence it would break) and compared for speed with the automatic one.
"""

import numpy as np

import tclang as tc
from _check import check, timed

SOURCE = """
def mlp_layer(float(B,I) X, float(O,I) W, float(O) bias) -> (Y) {
    Y(b, o) +=! X(b, i) * W(o, i)
    Y(b, o)  = fmax(Y(b, o) + bias(o), 0)
}
"""

SCHEDULES = {
    "automatic": None,
    "no fusion": tc.Options(fusion="min"),
    "tiles 16x16x64": tc.Options(tile=(16, 16, 64)),
    "untiled": tc.Options(tile=()),
    "loop order i, b, o": tc.Options(loop_order=("i", "b", "o"), tile=()),
}


def main(n: int = 256) -> None:
    rng = np.random.default_rng(0)
    X, W = rng.standard_normal((n, n), np.float32), rng.standard_normal((n, n), np.float32)
    bias = rng.standard_normal(n, np.float32)
    expected = np.maximum(X @ W.T + bias, 0)
    print(f"| schedule | time (ms) |\n|---|---|")
    for name, options in SCHEDULES.items():
        layer = tc.define(SOURCE, options=options).mlp_layer
        np.testing.assert_allclose(layer(X, W, bias), expected, rtol=1e-3, atol=1e-3)
        print(f"| {name} | {timed(layer, X, W, bias) * 1e3:.2f} |")
    exact = tc.Options(reorder_reductions=False, loop_order=(1, 0))
    try:
        tc.define("def total(float(N, M) A) -> (s) { s +=! A(i, j) }", options=exact).total(X)
    except tc.TCScheduleError as err:
        print(f"\nan illegal manual schedule is refused:\n{err}")
    check("every schedule", expected, expected)


if __name__ == "__main__":
    main()
