"""Static post-training quantization of Linear and Conv2d layers, in torch.ao's steps: `prepare` puts an observer
on each layer's input, running the prepared model on calibration data records the activations' range, and
`convert` makes each layer a `StaticQuantizedLinear` or `StaticQuantizedConv2d` whose activations are quantized
with the scale and zero point that range gives (fixed, so the int8 GEMM skips its range pass), weights int8 per
output channel. A convolution runs on the int8 GEMM as the product of its im2col patches and its weights.

Observers cover [0, 127] rather than [0, 255] where the machine lacks AVX-512 VNNI (`reduce_range`, as torch's
fbgemm and x86 default qconfigs do): the int8 GEMM's faster step is exact for 7-bit activations there
(`quantization.dynamic`).

Unlike torch's static modules, a converted layer takes and returns float32 (torch passes quantized tensors between
layers and needs QuantStub/DeQuantStub around them); the arithmetic inside is the same.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from tensorgraphs.errors import ArgumentError, UnsupportedError, fail
from tensorgraphs.frontend import movement as mv
from tensorgraphs.frontend import reduce as rd
from tensorgraphs.frontend.tensor import Tensor
from tensorgraphs.nn import functional as F
from tensorgraphs.nn.conv import Conv2d
from tensorgraphs.nn.linear import Linear
from tensorgraphs.nn.module import Module
from tensorgraphs.quantization.dynamic import (
    DynamicQuantizedLinear,
    default_reduce_range,
    per_channel_symmetric,
    swap_modules,
)
from tensorgraphs.quantization.quantized_tensor import quint8


class MinMaxObserver(Module):
    """torch.ao.quantization.MinMaxObserver for quint8, per tensor, affine: the running min and max of every tensor
    it sees (it returns them unchanged), and the quantization parameters covering that range; `reduce_range` halves
    the integer range ([0, 127]), as torch's."""

    def __init__(self, quant_min: int = quint8.qmin, quant_max: int = quint8.qmax, reduce_range: bool = False) -> None:
        super().__init__()
        halve = 2 if reduce_range else 1
        self.quant_min, self.quant_max, self.reduce_range = quant_min // halve, quant_max // halve, reduce_range
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


class Observed(Module):
    """A float layer whose inputs an observer records (what `prepare` makes of a Linear or Conv2d)."""

    def __init__(self, layer: Module, reduce_range: bool = False) -> None:
        super().__init__()
        self.layer, self.activation_post_process = layer, MinMaxObserver(reduce_range=reduce_range)

    def forward(self, input: Tensor) -> Tensor:
        return self.layer(self.activation_post_process(input))


class StaticQuantizedLinear(DynamicQuantizedLinear):
    """A Linear layer with int8 weights per output channel and activations quantized with calibrated, fixed
    parameters."""

    def __init__(self, in_features: int, out_features: int, weight: Tensor, bias: Tensor | None,
                 activation_qparams: tuple[float, int], reduce_range: bool = False) -> None:
        """`activation_qparams` over [0, 127] if `reduce_range`, else [0, 255] (the observer's range)."""
        super().__init__(in_features, out_features, per_channel_symmetric(weight), bias, reduce_range=reduce_range)
        self.activation_qparams = activation_qparams

    @classmethod
    def from_observed(cls, linear: Linear, activation_qparams: tuple[float, int],
                      reduce_range: bool = False) -> StaticQuantizedLinear:
        return cls(linear.in_features, linear.out_features, linear.weight, linear.bias, activation_qparams,
                   reduce_range)

    def extra_repr(self) -> str:
        scale, zero_point = self.activation_qparams or (None, None)
        return f"{super().extra_repr()}, scale={scale}, zero_point={zero_point}"


class StaticQuantizedConv2d(StaticQuantizedLinear):
    """A Conv2d layer (groups 1, zero padding) as a quantized product of its im2col patches: int8 weights per output
    channel, activations quantized with calibrated, fixed parameters."""

    kernel_size: tuple[int, ...]
    stride: tuple[int, ...]
    padding: tuple[int, ...]
    dilation: tuple[int, ...]

    @classmethod
    def from_observed(cls, conv: Conv2d, activation_qparams: tuple[float, int],
                      reduce_range: bool = False) -> StaticQuantizedConv2d:
        if conv.groups != 1 or conv.padding_mode != "zeros" or isinstance(conv.padding, str):
            fail("convert", "static quantization supports Conv2d with groups=1 and numeric zero padding only",
                 kind=UnsupportedError)
        patch = conv.in_channels * math.prod(conv.kernel_size)
        weight = mv.reshape(conv.weight.detach(), (conv.out_channels, patch))
        layer = cls(patch, conv.out_channels, weight, conv.bias, activation_qparams, reduce_range)
        layer.kernel_size, layer.stride, layer.padding, layer.dilation = (conv.kernel_size, conv.stride,
                                                                           conv.padding, conv.dilation)
        return layer

    def forward(self, input: Tensor) -> Tensor:
        patches = F.unfold(input, self.kernel_size, self.dilation, self.padding, self.stride)  # (N, C*kh*kw, L)
        out = mv.transpose(super().forward(mv.transpose(patches, -1, -2)), -1, -2)  # (N, Cout, L)
        size = [(n + 2 * p - d * (k - 1) - 1) // s + 1 for n, p, d, k, s in
                zip(input.shape[-2:], self.padding, self.dilation, self.kernel_size, self.stride)]
        return mv.reshape(out, out.shape[:-1] + tuple(size))


QUANTIZED_STATIC: dict[type, type[StaticQuantizedLinear]] = {Linear: StaticQuantizedLinear,
                                                              Conv2d: StaticQuantizedConv2d}
"""Float layer type -> its statically quantized replacement."""


def _quantized(observed: Observed) -> Module:
    observer = observed.activation_post_process
    return QUANTIZED_STATIC[type(observed.layer)].from_observed(observed.layer, observer.calculate_qparams(),
                                                                observer.reduce_range)


def prepare(model: Module, qconfig_spec: Any = None, inplace: bool = False, *,
            reduce_range: bool | None = None) -> Module:
    """torch.ao.quantization.prepare for Linear and Conv2d layers (those in `qconfig_spec`, a set of types; default
    both): `model` (a copy, unless `inplace`) with an observer on each such layer's input, over [0, 127] if
    `reduce_range` (default: `default_reduce_range`). Run it on calibration data, then `convert` it."""
    types = set(QUANTIZED_STATIC) if qconfig_spec is None else set(qconfig_spec)
    if types - set(QUANTIZED_STATIC):
        fail("prepare", "static quantization supports Linear and Conv2d layers only", kind=ArgumentError)
    reduce_range = default_reduce_range() if reduce_range is None else reduce_range
    return swap_modules(model, dict.fromkeys(types, lambda layer: Observed(layer, reduce_range)), inplace)


def convert(model: Module, inplace: bool = False) -> Module:
    """torch.ao.quantization.convert: every observed layer of a prepared, calibrated model made quantized."""
    return swap_modules(model, {Observed: _quantized}, inplace)
