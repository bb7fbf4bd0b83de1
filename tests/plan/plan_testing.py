"""Shared by the planner tests (not a test module): fixed roofline peaks and a small pre-norm transformer."""

from __future__ import annotations

import numpy as np

import tensorgraphs as tg
import tensorgraphs.nn.functional as F
from tensorgraphs.frontend.tensor import Tensor
from tensorgraphs.kerneldb import DevicePeaks

PEAKS = DevicePeaks(bandwidth=1e10, flops=1e11, overhead=1e-6)
FP = "test-device"


def parameters(layers: int, width: int, seed: int = 0, dtype=tg.float32) -> list[list[Tensor]]:
    """Per layer: w_qkv, w_out, w_up, w_down, norm gain, norm bias (distinct values in every layer)."""
    rng = np.random.default_rng(seed)
    shapes = [(width, 3 * width), (width, width), (width, 4 * width), (4 * width, width), (width,), (width,)]
    return [[tg.tensor(rng.standard_normal(s) * 0.1, dtype=dtype, requires_grad=True) for s in shapes]
            for _ in range(layers)]


def forward(x: Tensor, params: list[list[Tensor]], heads: int = 2) -> Tensor:
    batch, tokens, width = x.shape
    for w_qkv, w_out, w_up, w_down, gain, bias in params:
        h = F.layer_norm(x, (width,), gain, bias)
        qkv = (h @ w_qkv).reshape(batch, tokens, 3, heads, width // heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(x.shape)
        x = x + attended @ w_out
        x = x + F.gelu(F.layer_norm(x, (width,), gain, bias) @ w_up) @ w_down
    return x


def training_step_roots(layers: int, width: int = 16, tokens: int = 8, dtype=tg.float32) -> list:
    """Loss and every parameter gradient of one step: the graph a compiled training step realizes."""
    params = parameters(layers, width, dtype=dtype)
    x = tg.tensor(np.random.default_rng(1).standard_normal((2, tokens, width)), dtype=dtype)
    loss = -F.log_softmax(forward(x, params), -1).mean()
    grads = tg.grad(loss, [p for layer in params for p in layer])
    return [loss.node, *(g.node for g in grads)]
