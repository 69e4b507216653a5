"""The generated backward against its forward (and PyTorch's autograd where installed).

    python benchmarks/autodiff.py [--rounds 9] [--quick]

For matmul, the MLP layer and conv2d 3x3, times in interleaved rounds (medians; a rest
after every sample, as benchmarks/run.py explains): the forward kernel, the backward
kernel (all input gradients; outputs preallocated for both), and with PyTorch installed
torch's forward and its autograd backward on the same data. The backward does about twice
the forward's arithmetic; the issue's bar is backward <= 2.5x forward. A measurement, not
a test.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import tclang as tc  # noqa: E402

try:
    import torch
except ImportError:
    torch = None

CASES = {
    "matmul": ("def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }",
               "mm", lambda q, r: (r.standard_normal((q, q), np.float32),
                                   r.standard_normal((q, q), np.float32)),
               lambda A, B: A @ B),
    "MLP layer": ("""def mlp(float(B,I) X, float(O,I) W, float(O) b) -> (Y) {
        Y(n, o) +=! X(n, i) * W(o, i)
        Y(n, o)  = fmax(Y(n, o) + b(o), 0)
    }""", "mlp", lambda q, r: (r.standard_normal((q, q), np.float32),
                               r.standard_normal((q, q), np.float32),
                               r.standard_normal((q,), np.float32)),
        lambda X, W, b: torch.relu(X @ W.T + b)),
    "conv2d 3x3": ("""def conv(float(N,C,H,W) I, float(M,C,KH,KW) W1) -> (O) {
        O(n, m, h, w) +=! I(n, c, h + kh, w + kw) * W1(m, c, kh, kw)
    }""", "conv", lambda q, r: (r.standard_normal((8, 32, q // 16 + 2, q // 16 + 2),
                                                  np.float32),
                                r.standard_normal((32, 32, 3, 3), np.float32)),
        lambda I, W: torch.nn.functional.conv2d(I, W)),
}


def sample(fn, gap: float) -> float:
    start = time.perf_counter()
    fn()
    elapsed = time.perf_counter() - start
    time.sleep(gap)
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--size", type=int, default=512)
    parser.add_argument("--gap", type=float, default=0.3)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    print(f"| operator (q={args.size}) | forward ms | backward ms | backward / forward "
          f"| torch fwd ms | torch bwd ms | torch bwd / fwd | tclang bwd / torch bwd |")
    print("|---|---|---|---|---|---|---|---|")
    for name, (source, entry, make, torch_fn) in CASES.items():
        kernel = tc.define(source)[entry]
        g = tc.grad(kernel)
        inputs = make(args.size, rng)
        outputs, saved = g.forward(*inputs)
        seeds = tuple(rng.standard_normal(np.shape(o)).astype(np.float32) for o in outputs)
        values = [saved[s.name] for s in g.plan.saved]
        out = kernel(*inputs)
        grads = g.backward(inputs, saved, seeds)  # compiles; its results are out= below
        grads = tuple(np.empty_like(x) for x in grads)
        back = g._backward
        runs = {"fwd": lambda: kernel(*inputs, out=out),
                "bwd": lambda: back(*inputs, *values, *seeds, out=grads)}
        if torch is not None:
            tins = [torch.from_numpy(x).requires_grad_() for x in inputs]
            tseed = torch.from_numpy(seeds[0])
            graph = torch_fn(*tins)  # the recorded forward; its backward is timed alone
            plain = [t.detach() for t in tins]
            runs["tfwd"] = lambda: torch_fn(*plain)
            runs["tbwd"] = lambda: graph.backward(tseed, retain_graph=True)
        times = {k: [] for k in runs}
        for _ in range(args.rounds):
            for k, fn in runs.items():
                times[k].append(sample(fn, args.gap))
        med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
        row = f"| {name} | {med['fwd']:.2f} | {med['bwd']:.2f} | {med['bwd'] / med['fwd']:.2f}x"
        if torch is not None:
            tb = med["tbwd"]
            row += (f" | {med['tfwd']:.2f} | {tb:.2f} | {tb / med['tfwd']:.2f}x "
                    f"| {med['bwd'] / tb:.2f}x |")
        else:
            row += " | - | - | - | - |"
        print(row, flush=True)


if __name__ == "__main__":
    main()
