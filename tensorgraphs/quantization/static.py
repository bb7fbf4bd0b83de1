"""Static post-training quantization of Linear layers, in torch.ao's steps: `prepare` puts an observer on each
layer's input, running the prepared model on calibration data records the activations' range, and `convert`
makes each layer a `StaticQuantizedLinear` whose activations are quantized with the scale and zero point that range
gives (fixed, so the int8 GEMM skips its range pass), weights int8 per output channel.

Unlike torch's static modules, a converted layer takes and returns float32 (torch passes quantized tensors between
layers and needs QuantStub/DeQuantStub around them); the arithmetic inside is the same.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tensorgraphs.errors import ArgumentError, fail
from tensorgraphs.frontend import reduce as rd
from tensorgraphs.frontend.tensor import Tensor
from tensorgraphs.nn.linear import Linear
from tensorgraphs.nn.module import Module
from tensorgraphs.quantization.dynamic import DynamicQuantizedLinear, per_channel_symmetric, swap_modules
from tensorgraphs.quantization.quantized_tensor import quint8


class MinMaxObserver(Module):
    """torch.ao.quantization.MinMaxObserver for quint8, per tensor, affine: the running min and max of every tensor
    it sees (it returns them unchanged), and the quantization parameters covering that range."""

    def __init__(self, quant_min: int = quint8.qmin, quant_max: int = quint8.qmax) -> None:
        super().__init__()
        self.quant_min, self.quant_max = quant_min, quant_max
        self.min_val, self.max_val = np.float32(np.inf), np.float32(-np.inf)

    def forward(self, x: Tensor) -> Tensor:
        if x.numel():
            low, high = (np.float32(reduce(x.detach()).item()) for reduce in (rd.amin, rd.amax))
            self.min_val, self.max_val = min(self.min_val, low), max(self.max_val, high)
        return x

    def calculate_qparams(self) -> tuple[float, int]:
        """(scale, zero point) as torch computes them in float32: the range widened to hold 0, over the integer
        range; the zero point where 0.0 lands, rounded half to even and clamped."""
        if self.min_val > self.max_val:
            fail("convert", "an observer saw no data: run the prepared model on calibration data first",
                 kind=ArgumentError)
        f32 = np.float32
        low, high = min(self.min_val, f32(0)), max(self.max_val, f32(0))
        scale = max((high - low) / f32(self.quant_max - self.quant_min), np.finfo(np.float32).eps)
        zero_point = self.quant_min - int(np.rint(low / scale))
        return float(scale), min(max(zero_point, self.quant_min), self.quant_max)


class ObservedLinear(Module):
    """A float Linear layer whose inputs an observer records (what `prepare` makes of a Linear)."""

    def __init__(self, linear: Linear) -> None:
        super().__init__()
        self.linear, self.activation_post_process = linear, MinMaxObserver()

    def forward(self, input: Tensor) -> Tensor:
        return self.linear(self.activation_post_process(input))


class StaticQuantizedLinear(DynamicQuantizedLinear):
    """A Linear layer with int8 weights per output channel and activations quantized with calibrated, fixed
    parameters."""

    def __init__(self, linear: Linear, activation_qparams: tuple[float, int]) -> None:
        super().__init__(linear.in_features, linear.out_features, per_channel_symmetric(linear.weight), linear.bias)
        self.activation_qparams = activation_qparams

    @classmethod
    def from_observed(cls, observed: ObservedLinear) -> StaticQuantizedLinear:
        return cls(observed.linear, observed.activation_post_process.calculate_qparams())

    def extra_repr(self) -> str:
        scale, zero_point = self.activation_qparams or (None, None)
        return f"{super().extra_repr()}, scale={scale}, zero_point={zero_point}"


def prepare(model: Module, qconfig_spec: Any = None, inplace: bool = False) -> Module:
    """torch.ao.quantization.prepare for Linear layers: `model` (a copy, unless `inplace`) with an observer on every
    Linear's input. Run it on calibration data, then `convert` it."""
    if qconfig_spec is not None and set(qconfig_spec) - {Linear}:
        fail("prepare", "static quantization supports Linear layers only", kind=ArgumentError)
    return swap_modules(model, {Linear: ObservedLinear}, inplace)


def convert(model: Module, inplace: bool = False) -> Module:
    """torch.ao.quantization.convert: every observed layer of a prepared, calibrated model made quantized."""
    return swap_modules(model, {ObservedLinear: StaticQuantizedLinear.from_observed}, inplace)
