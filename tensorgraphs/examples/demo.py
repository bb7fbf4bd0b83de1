"""A first look: fit a small two-layer network to a toy function with plain gradient descent.

Everything is lazy: the forward pass, the loss and the backward pass are one graph that is evaluated when
`backward()` needs values. Run with `tg demo` or `python -m tensorgraphs.examples.demo`.
"""

from __future__ import annotations

import argparse
import math

import tensorgraphs as tg
import tensorgraphs.nn.functional as F


def make_data(n: int) -> tuple[tg.Tensor, tg.Tensor]:
    x = tg.linspace(-math.pi, math.pi, n).reshape(n, 1)
    return x, tg.sin(x) * 0.5 + x * x * 0.1


def main(argv: list[str] | None = None) -> float:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--hidden", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.05)
    args = parser.parse_args(argv)

    tg.manual_seed(0)
    x, y = make_data(64)
    w1 = (tg.randn(1, args.hidden) * 1.0).requires_grad_()
    b1 = tg.zeros(args.hidden, requires_grad=True)
    w2 = (tg.randn(args.hidden, 1) / math.sqrt(args.hidden)).requires_grad_()
    b2 = tg.zeros(1, requires_grad=True)
    params = {"w1": w1, "b1": b1, "w2": w2, "b2": b2}

    loss_value = math.nan
    for step in range(args.steps + 1):
        prediction = tg.tanh(x @ w1 + b1) @ w2 + b2
        loss = ((prediction - y) ** 2).mean()
        loss.backward()
        loss_value = loss.item()
        if step % max(1, args.steps // 10) == 0:
            norms = "  ".join(f"|d{name}|={p.grad.norm().item():.4f}" for name, p in params.items())
            print(f"step {step:4d}  loss {loss_value:.6f}  {norms}")
        with tg.no_grad():
            for p in params.values():
                p.assign(p - args.lr * p.grad)
                p.grad = None
    final = F.mse_loss(tg.tanh(x @ w1 + b1) @ w2 + b2, y).item() if hasattr(F, "mse_loss") else loss_value
    print(f"final loss {final:.6f} (started at {make_baseline(y):.6f} for a constant prediction)")
    return final


def make_baseline(y: tg.Tensor) -> float:
    return ((y - y.mean()) ** 2).mean().item()


if __name__ == "__main__":
    main()
