"""One check shared by the gradient tests: tc.grad's gradient of <w, f(x)> along a random
direction equals the central difference of f there, for every input, in float64."""

from __future__ import annotations

import numpy as np


def assert_gradients_match(kernel, g, inputs: list, rng, eps: float = 1e-6) -> None:
    """`inputs` are float64 arrays, perturbed in place and restored."""
    weights = rng.uniform(-1, 1, kernel(*inputs).shape)
    grads = g(*inputs, weights)
    grads = grads if isinstance(grads, tuple) else (grads,)
    for x, dx in zip(inputs, grads):
        direction = rng.uniform(-1, 1, x.shape)
        x += eps * direction
        up = float(np.sum(kernel(*inputs) * weights))
        x -= 2 * eps * direction
        down = float(np.sum(kernel(*inputs) * weights))
        x += eps * direction
        numeric = (up - down) / (2 * eps)
        assert abs(numeric - float(np.sum(dx * direction))) <= 1e-6 + 1e-6 * abs(numeric)
