"""Benchmark: rewrite the forward+backward graph of a 12-layer transformer to a fixpoint.

    .venv/bin/python bench/rewrite.py [--layers 12] [--d-model 768]

Builds the graph with the Tensor API (matmul, softmax from exp/sum, layer norm,
gelu; gradients with `tg.grad` w.r.t. every weight), realizes nothing, then times
the active rule sets on all roots. Ends with `rewrite: N nodes in S s (R nodes/s)`.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import tensorgraphs as tg  # noqa: E402
from tensorgraphs.graph.node import toposort  # noqa: E402
from tensorgraphs.rewrite import optimize  # noqa: E402


def layer_norm(x: tg.Tensor, weight: tg.Tensor, bias: tg.Tensor) -> tg.Tensor:
    centered = x - x.mean(-1, keepdim=True)
    variance = (centered * centered).mean(-1, keepdim=True)
    return centered * (variance + 1e-5).rsqrt() * weight + bias


def softmax(x: tg.Tensor) -> tg.Tensor:
    e = (x - x.amax(-1, keepdim=True)).exp()
    return e / e.sum(-1, keepdim=True)


def gelu(x: tg.Tensor) -> tg.Tensor:
    return 0.5 * x * (1 + tg.erf(x / math.sqrt(2.0)))


def block(x: tg.Tensor, w: dict[str, tg.Tensor], heads: int) -> tg.Tensor:
    seq, d_model = x.shape
    head_dim = d_model // heads
    h = layer_norm(x, w["ln1_w"], w["ln1_b"])
    q, k, v = ((h @ w[name]).reshape(seq, heads, head_dim).transpose(0, 1) for name in ("wq", "wk", "wv"))
    attention = softmax(q @ k.transpose(-1, -2) * (1.0 / math.sqrt(head_dim))) @ v
    x = x + attention.transpose(0, 1).reshape(seq, d_model) @ w["wo"]
    h = layer_norm(x, w["ln2_w"], w["ln2_b"])
    return x + gelu(h @ w["w1"] + w["b1"]) @ w["w2"] + w["b2"]


def transformer_graph(layers: int, d_model: int, seq: int = 16, heads: int = 12) -> list:
    """Roots of the loss and of its gradient w.r.t. every weight."""
    rng = np.random.default_rng(0)
    param = lambda *shape: tg.tensor(rng.standard_normal(shape, dtype=np.float32) * 0.02, requires_grad=True)
    weights = [{"ln1_w": param(d_model), "ln1_b": param(d_model), "wq": param(d_model, d_model),
                "wk": param(d_model, d_model), "wv": param(d_model, d_model), "wo": param(d_model, d_model),
                "ln2_w": param(d_model), "ln2_b": param(d_model), "w1": param(d_model, 4 * d_model),
                "b1": param(4 * d_model), "w2": param(4 * d_model, d_model), "b2": param(d_model)}
               for _ in range(layers)]
    x = tg.tensor(rng.standard_normal((seq, d_model), dtype=np.float32))
    for w in weights:
        x = block(x, w, heads)
    loss = (x * x).mean()
    every_weight = [t for w in weights for t in w.values()]
    return [loss.node] + [g.node for g in tg.grad(loss, every_weight)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--d-model", type=int, default=768)
    parser.add_argument("--decomposed", action="store_true", help="expand every composite into primitives first")
    args = parser.parse_args()
    roots = transformer_graph(args.layers, args.d_model)
    if args.decomposed:
        roots = optimize(roots, ["decompose"])
    nodes = len(toposort(roots))
    start = time.perf_counter()
    rewritten = optimize(roots)
    seconds = time.perf_counter() - start
    print(f"graph: {nodes} nodes before, {len(toposort(rewritten))} after")
    print(f"rewrite: {nodes} nodes in {seconds:.3f} s ({nodes / seconds:.0f} nodes/s)")


if __name__ == "__main__":
    main()
