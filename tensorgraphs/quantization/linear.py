"""The quantized linear layer: float32 activations quantized to u8 per batch, int8 weights per output channel.

`quantized_linear` is a composite: compiled programs run it by the int8 GEMM (`schedule.quantized`), whose
contract (gemm_int8.h) its decomposition states in primitives, step for step, so the two agree bit for bit.
Weights are kept as the kernel reads them (`kernels.gemm.int8.pack_weights`): packed once, when a model is
quantized (`quantization.dynamic`), never per call.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tensorgraphs import dtypes
from tensorgraphs.frontend import elementwise as ew
from tensorgraphs.frontend import linalg
from tensorgraphs.frontend import movement as mv
from tensorgraphs.frontend import reduce as rd
from tensorgraphs.frontend.creation import full
from tensorgraphs.frontend.tensor import Tensor, apply_composite, cast
from tensorgraphs.graph.composite import Composite, register
from tensorgraphs.quantization.quantized_tensor import QUANTIZE, quint8

ACTIVATIONS = ("none", "relu")
"""The activations the layer applies after its bias (the kernel's `gemm.ACTIVATIONS` that the decomposition
spells out)."""


def _infer(x: Tensor, packed: Tensor, colsum: Tensor, w_scale: Tensor, *bias: Tensor, quant_max: int,
           activation: str, qparams: tuple[float, int] | None) -> tuple:
    return dtypes.float32, x.shape[:-1] + colsum.shape


def _unpacked(packed: Tensor, n: int, k: int) -> Tensor:
    """The (n, k) weights `pack_weights` packed, by views."""
    panels, groups, width, four = packed.shape
    rows = mv.reshape(mv.permute(packed, (0, 2, 1, 3)), (panels * width, groups * four))
    return mv.narrow(mv.narrow(rows, 0, 0, n), 1, 0, k)


def _decomposition(x: Tensor, packed: Tensor, colsum: Tensor, w_scale: Tensor, *bias: Tensor, quant_max: int,
                   activation: str, qparams: tuple[float, int] | None) -> Tensor:
    """What tg_qlinear_f32 computes (gemm_int8.h), in its order."""
    if qparams is None:
        scale, zero_point = dynamic_qparams(x, quant_max)
    else:
        scale, zero_point = (full((), value, dtype=dtypes.float32) for value in qparams)
    q = apply_composite(QUANTIZE, x, scale, zero_point, dtype=quint8.name)
    q = ew.minimum(q, quant_max) if quant_max < quint8.qmax else q
    shifted = ew.sub(cast(q, dtypes.int32), cast(zero_point, dtypes.int32))
    weights = cast(_unpacked(packed, colsum.shape[0], x.shape[-1]), dtypes.int32)
    sums = linalg.matmul(shifted, mv.mT(weights))
    y = ew.mul(cast(sums, dtypes.float32), ew.mul(scale, w_scale))
    y = ew.add(y, bias[0]) if bias else y
    return ew.where(ew.logical_or(ew.lt(y, 0.0), ew.eq(y, 0.0)), 0.0, y) if activation == "relu" else y


QUANTIZED_LINEAR = register(Composite("quantized_linear", infer=_infer, decompose=_decomposition))
"""quantized_linear(x, packed, colsum, w_scale, bias?; quant_max, activation, qparams): x (..., k) float32 quantized
to [0, quant_max] with qparams (scale, zero point) or, when None, from its own range (`dynamic_qparams`), times the
packed int8 weights (n output channels, their row sums `colsum`), dequantized by scale * w_scale, plus bias,
activated."""


def dynamic_qparams(x: Tensor, quant_max: int) -> tuple[Tensor, Tensor]:
    """The dynamic quantization parameters of x as torch chooses them (in float32, where torch uses double), as 0-d
    tensors: the range [min(x, 0), max(x, 0)] over [0, quant_max] (scale 0.1 for an all-zero x), the zero point where
    0.0 lands, rounded and clamped."""
    with_zero = mv.pad_dim(mv.flatten(x), 0, 0, 1)  # the range holds 0.0, and an empty x has one
    low, high = rd.amin(with_zero), rd.amax(with_zero)
    scale = ew.div(ew.sub(high, low), float(quant_max))
    scale = ew.where(ew.eq(scale, 0.0), 0.1, scale)
    zero_point = ew.clamp(ew.round(ew.div(ew.neg(low), scale)), 0.0, float(quant_max))
    return scale, zero_point


def quantized_linear(x: Tensor, packed: Tensor, colsum: Tensor, w_scale: Tensor, bias: Tensor | None = None, *,
                     quant_max: int = 255, activation: str = "none",
                     qparams: tuple[float, int] | None = None) -> Tensor:
    """x @ W.T + bias with x quantized with `qparams` (scale, zero point: static quantization) or, when None, per
    call from its range (dynamic quantization), and W int8 weights packed by `kernels.gemm.int8.pack_weights`
    (`packed`, row sums `colsum`) with float32 scales per output channel."""
    sources: list[Any] = [x.detach(), packed, colsum, w_scale]
    sources += [] if bias is None else [cast(bias.detach(), dtypes.float32)]
    qparams = None if qparams is None else (float(np.float32(qparams[0])), int(qparams[1]))
    return apply_composite(QUANTIZED_LINEAR, *sources, quant_max=quant_max, activation=activation, qparams=qparams)


def _matmul_integer_infer(a: Tensor, packed: Tensor, colsum: Tensor, *, zero_point: int) -> tuple:
    return dtypes.int32, a.shape[:-1] + colsum.shape


def _matmul_integer_decomposition(a: Tensor, packed: Tensor, colsum: Tensor, *, zero_point: int) -> Tensor:
    weights = cast(_unpacked(packed, colsum.shape[0], a.shape[-1]), dtypes.int32)
    return linalg.matmul(ew.sub(cast(a, dtypes.int32), zero_point), mv.mT(weights))


MATMUL_INTEGER = register(Composite("matmul_integer", infer=_matmul_integer_infer,
                                    decompose=_matmul_integer_decomposition))
"""matmul_integer(a, packed, colsum; zero_point): (a - zero_point) @ W.T in int32, a (..., k) uint8 or int8 and W
the packed int8 weights (ONNX's MatMulInteger with a constant B)."""


def matmul_integer(a: Tensor, packed: Tensor, colsum: Tensor, zero_point: int = 0) -> Tensor:
    """(a - zero_point) @ W.T in int32 for u8 or s8 activations and int8 weights packed by
    `kernels.gemm.int8.pack_weights`."""
    return apply_composite(MATMUL_INTEGER, a.detach(), packed, colsum, zero_point=int(zero_point))
