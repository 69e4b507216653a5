"""Train a small MLP whose layers are tclang operators, beside its pure-PyTorch twin.

The layers are comprehensions; PyTorch's autograd calls their generated backward
(tc.grad) through tclang.torch. Both models start from the same weights and see the same
batches, so their losses must fall together. Needs PyTorch (pip install 'tclang[torch]').
"""

from __future__ import annotations

import torch

import tclang.torch as tct

LAYERS = """
def hidden(float(B, I) X, float(H, I) W, float(H) b) -> (Y) {
    Y(n, h) +=! X(n, i) * W(h, i)
    Y(n, h)  = fmax(Y(n, h) + b(h), 0)
}
def linear(float(B, H) X, float(O, H) W, float(O) b) -> (Z) {
    Z(n, o) +=! X(n, h) * W(o, h)
    Z(n, o)  = Z(n, o) + b(o)
}
"""


class TclangMLP(torch.nn.Module):
    def __init__(self, twin: "TorchMLP"):
        super().__init__()
        self.hidden = tct.Module(LAYERS, "hidden", W=twin.hidden.weight.detach().clone(),
                                 b=twin.hidden.bias.detach().clone())
        self.out = tct.Module(LAYERS, "linear", W=twin.out.weight.detach().clone(),
                              b=twin.out.bias.detach().clone())

    def forward(self, x):
        return self.out(self.hidden(x))


class TorchMLP(torch.nn.Module):
    def __init__(self, inputs: int, width: int, outputs: int):
        super().__init__()
        self.hidden = torch.nn.Linear(inputs, width)
        self.out = torch.nn.Linear(width, outputs)

    def forward(self, x):
        return self.out(torch.relu(self.hidden(x)))


def train(model, batches, steps: int, lr: float) -> list[float]:
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    losses = []
    for step in range(steps):
        x, y = batches[step % len(batches)]
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def main(steps: int = 200) -> None:
    torch.manual_seed(0)
    inputs, width, outputs = 16, 64, 4
    truth = torch.randn(inputs, outputs)
    batches = []
    for _ in range(8):
        x = torch.randn(32, inputs)
        batches.append((x, torch.tanh(x @ truth / 4)))
    twin = TorchMLP(inputs, width, outputs)
    ours = TclangMLP(twin)
    ours_losses = train(ours, batches, steps, lr=0.05)
    twin_losses = train(twin, batches, steps, lr=0.05)
    for step in range(0, steps, steps // 8):
        print(f"step {step:4d}: loss {ours_losses[step]:.5f} (tclang)  "
              f"{twin_losses[step]:.5f} (PyTorch)")
    first, last = ours_losses[0], ours_losses[-1]
    assert last < 0.5 * first, "the loss did not fall"
    worst = max(abs(a - b) / b for a, b in zip(ours_losses, twin_losses))
    assert worst < 1e-3, f"the losses part ways (relative difference {worst:.1e})"
    print(f"loss {first:.4f} -> {last:.4f} in {steps} steps; every step matches PyTorch "
          f"(largest relative difference {worst:.1e})")


if __name__ == "__main__":
    main()
