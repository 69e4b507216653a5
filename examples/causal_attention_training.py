"""Train a causal self-attention layer whose masked attention is one tclang definition,
beside its PyTorch twin (torch.nn.functional.scaled_dot_product_attention with is_causal=True).

The mask is a range, `where j in 0:i + 1`: the loops walk the triangle only, and
tc.grad differentiates it (its backward sums run under `j < i + 1`, which the guarded-sum
pass turns into loop bounds again). PyTorch's autograd calls the generated backward
through tclang.torch. Both layers start from the same weights and see the same batches:
their gradients and losses must agree. Needs PyTorch (pip install 'tclang[torch]').
"""

from __future__ import annotations

import time

import torch

import tclang.torch as tct

ATTENTION = """
def causal_attention(float(T, D) Q, float(T, D) K, float(T, E) V) -> (O) {
    S(i, j) +=! Q(i, d) * K(j, d) * r where r = 0.125
    Mx(i) max=! S(i, j) where j in 0:i + 1
    P(i, j) = exp(S(i, j) - Mx(i)) where j in 0:i + 1
    Z(i) +=! P(i, j) where j in 0:i + 1
    O(i, e) +=! P(i, j) * V(j, e) / Z(i) where j in 0:i + 1
}
"""


class TclangAttention(torch.nn.Module):
    """The projections in PyTorch, the masked attention one tclang definition."""

    def __init__(self, twin: "TorchAttention"):
        super().__init__()
        for name, p in twin.named_parameters():
            self.register_parameter(name, torch.nn.Parameter(p.detach().clone()))
        self.attention = tct.function(ATTENTION, "causal_attention")

    def forward(self, x):
        return self.attention(x @ self.Wq.T, x @ self.Wk.T, x @ self.Wv.T)


class TorchAttention(torch.nn.Module):
    def __init__(self, channels: int, width: int):
        super().__init__()
        self.Wq, self.Wk, self.Wv = (torch.nn.Parameter(torch.randn(width, channels) / 8)
                                     for _ in range(3))

    def forward(self, x):
        q, k, v = x @ self.Wq.T, x @ self.Wk.T, x @ self.Wv.T
        return torch.nn.functional.scaled_dot_product_attention(
            q[None], k[None], v[None], is_causal=True, scale=0.125)[0]


def train(model, batches, steps: int, lr: float) -> list[float]:
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    for step in range(steps):
        x, y = batches[step % len(batches)]
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def _step_seconds(model, x, y, repeat: int = 5) -> float:
    """The best of `repeat` forward-and-backward steps (no optimizer)."""
    best = float("inf")
    for _ in range(repeat + 1):
        start = time.perf_counter()
        torch.nn.functional.mse_loss(model(x), y).backward()
        best = min(best, time.perf_counter() - start)
    return best


def main(steps: int = 30, tokens: int = 97, channels: int = 32, width: int = 32) -> None:
    # PyTorch's OpenMP workers and tclang's thread pool, each waiting for work after its
    # operation, starve each other on a small machine (a 97x32 matmul took 0.5 s beside
    # tclang's kernels on 2 loaded cores): PyTorch's operations run on one thread here
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        _run(steps, tokens, channels, width)
    finally:
        torch.set_num_threads(threads)


def _run(steps: int, tokens: int, channels: int, width: int) -> None:
    torch.manual_seed(0)
    twin = TorchAttention(channels, width)
    ours = TclangAttention(twin)
    target = TorchAttention(channels, width)
    batches = []
    for _ in range(4):
        x = torch.randn(tokens, channels)
        batches.append((x, target(x).detach()))
    x, y = batches[0]
    for model in (ours, twin):
        model.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
    for name, p in twin.named_parameters():
        torch.testing.assert_close(getattr(ours, name).grad, p.grad, rtol=1e-4, atol=1e-6)
    print("gradients of Wq, Wk, Wv: match PyTorch")
    ours_losses = train(ours, batches, steps, lr=0.5)
    twin_losses = train(twin, batches, steps, lr=0.5)
    worst = max(abs(a - b) / b for a, b in zip(ours_losses, twin_losses))
    assert ours_losses[-1] < ours_losses[0], "the loss did not fall"
    assert worst < 1e-3, f"the losses part ways (relative difference {worst:.1e})"
    print(f"loss {ours_losses[0]:.5f} -> {ours_losses[-1]:.5f} in {steps} steps; every step "
          f"matches PyTorch (largest relative difference {worst:.1e})")
    mine, theirs = _step_seconds(ours, x, y), _step_seconds(twin, x, y)
    print(f"one training step ({tokens} tokens, {channels} channels, PyTorch on one "
          f"thread): tclang attention {mine * 1e3:.2f} ms, PyTorch {theirs * 1e3:.2f} ms")


if __name__ == "__main__":
    main()
