"""Shared by the planner tests (not a test module): fixed roofline peaks, a fixed measurement of kernel schedules,
measurements of candidates written into the database, a held-out script and a small pre-norm transformer."""

from __future__ import annotations

import textwrap
from typing import Callable

import numpy as np

import tensorgraphs as tg
import tensorgraphs.nn.functional as F
from tensorgraphs.codegen.loop_ir import ScheduleOptions
from tensorgraphs.frontend.tensor import Tensor
from tensorgraphs.kerneldb import DevicePeaks
from tensorgraphs.plan.choices import code_hash, collecting, compiled_planner, kernel_id
from tensorgraphs.plan.consumers import Use, alone
from tensorgraphs.plan.signature import Signature

PEAKS = DevicePeaks(bandwidth=1e10, flops=1e11, overhead=1e-6)
FP = "test-device"
FAST = {"unroll": 4, "vector_bits": 128, "lanes": 8}
"""What the fixed measurement of schedules rewards: each of these saves 10% of the time."""


LAYER_NORM_SCRIPT = textwrap.dedent("""
    import numpy as np
    import tensorgraphs as tg
    import tensorgraphs.nn.functional as F

    x = tg.tensor(np.random.default_rng(0).standard_normal((64, 512)), dtype=tg.float32)

    @tg.compile
    def normalized(x):
        return F.layer_norm(x, (512,)) * 2.0

    print("result", float(normalized(x).sum()))
""")
"""A held-out script for `tg tune` / `tg explain`: one compiled function of generated kernels only."""


def fixed_seconds(options: ScheduleOptions) -> float:
    return 1.0 - sum(0.1 for name, value in FAST.items() if getattr(options, name) == value)


def uses_of(fn: Callable[..., Tensor], *arguments: Tensor) -> list[Use]:
    """The composite uses (with the elementwise passes that follow each) the program of `tg.compile(fn)` called on
    `arguments` plans: its graph as the scheduler sees it, rewritten."""
    with collecting() as found:
        tg.compile(fn)(*arguments)
    return [use for uses in found.values() for use in uses]


def record_candidates(used: Use | Signature, seconds: dict[str, float]) -> None:
    """Store a measured time for each candidate of a use (a signature: used alone) in the compiled path's
    database."""
    planner = compiled_planner()
    sig = (used if isinstance(used, Use) else alone(used)).measured_as
    for candidate, value in seconds.items():
        planner.cost_model.db.record(planner.cost_model.fingerprint, kernel_id(sig, candidate), code_hash(),
                                     sig.dtype_key, sig.shape_key, sig.flops, sig.bytes, [value])


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
