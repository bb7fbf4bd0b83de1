"""Dynamic quantization as torch.ao.quantization.quantize_dynamic: Linear layers become `DynamicQuantizedLinear`,
whose weights are int8 per output channel (symmetric, zero point 0) and whose activations are quantized per call
from their own range, run by the int8 GEMM in compiled programs.

Activations use the full u8 range [0, 255] where the machine has AVX-512 VNNI, and [0, 127] elsewhere
(`reduce_range`, as torch's fbgemm does on every x86 machine): without VNNI the int8 GEMM adds pairs of products in
saturating int16 (VPMADDUBSW), exact for 7-bit activations and otherwise split into two steps at twice the cost.
The choice is made when a model is quantized and kept in its layers, so a quantized model computes the same on
every machine.
"""

from __future__ import annotations

import copy
import functools
from typing import Any

import numpy as np

from tensorgraphs import dtypes
from tensorgraphs.errors import ArgumentError, DTypeError, fail
from tensorgraphs.frontend import elementwise as ew
from tensorgraphs.frontend import reduce as rd
from tensorgraphs.frontend.creation import tensor
from tensorgraphs.frontend.tensor import Tensor, cast
from tensorgraphs.kernels.gemm import int8
from tensorgraphs.nn.linear import Linear
from tensorgraphs.nn.module import Module
from tensorgraphs.quantization.linear import quantized_linear
from tensorgraphs.quantization.quantized_tensor import QuantizedTensor, qint8, quantize_per_channel, to_quantized_dtype

_EPS = float(np.finfo(np.float32).eps)


def per_channel_symmetric(weight: Tensor) -> QuantizedTensor:
    """`weight` (out, in) quantized to qint8 per output channel as torch's per-channel symmetric MinMax observer
    does: scale max|w| / 127.5 (at least float32's eps), zero point 0."""
    w = cast(weight.detach(), dtypes.float32)
    span = ew.maximum(ew.neg(ew.minimum(rd.amin(w, 1), 0.0)), ew.maximum(rd.amax(w, 1), 0.0))
    scales = ew.maximum(ew.div(span, (qint8.qmax - qint8.qmin) / 2), _EPS)
    return quantize_per_channel(w, cast(scales, dtypes.float64), [0] * w.shape[0], 0, qint8)


class DynamicQuantizedLinear(Module):
    """A Linear layer with int8 weights per output channel and activations quantized per call."""

    activation_qparams: tuple[float, int] | None = None  # (scale, zero point) of static quantization

    def __init__(self, in_features: int, out_features: int, weight: QuantizedTensor, bias: Tensor | None,
                 reduce_range: bool | None = None) -> None:
        """`reduce_range`: activations quantized to [0, 127] rather than [0, 255]; by default where this machine
        lacks AVX-512 VNNI (`default_reduce_range`)."""
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.reduce_range = default_reduce_range() if reduce_range is None else reduce_range
        self.quant_max = 127 if self.reduce_range else 255
        packed, colsum = int8.pack_weights(weight.int_repr().numpy())
        self.register_buffer("packed_weight", tensor(packed))
        self.register_buffer("weight_colsum", tensor(colsum))
        self.register_buffer("weight_scale", cast(weight.q_per_channel_scales(), dtypes.float32))
        self.register_buffer("bias", None if bias is None else cast(bias.detach(), dtypes.float32))
        self._weight = weight

    @classmethod
    def from_float(cls, linear: Linear, reduce_range: bool | None = None) -> DynamicQuantizedLinear:
        return cls(linear.in_features, linear.out_features, per_channel_symmetric(linear.weight), linear.bias,
                   reduce_range)

    def weight(self) -> QuantizedTensor:
        """The quantized weights (torch's `weight()`)."""
        return self._weight

    def forward(self, input: Tensor) -> Tensor:
        if input.shape[-1:] != (self.in_features,):
            fail("DynamicQuantizedLinear", f"input {input.shape} does not end in in_features={self.in_features}")
        return quantized_linear(cast(input, dtypes.float32), self.packed_weight, self.weight_colsum,
                                self.weight_scale, self.bias, quant_max=self.quant_max,
                                qparams=self.activation_qparams)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, dtype=tg.qint8, "
                f"qscheme=per_channel_affine, reduce_range={self.reduce_range}")


def default_reduce_range() -> bool:
    """Whether dynamically quantized activations take 7 bits by default: where the int8 GEMM runs them twice as fast
    as 8-bit ones (no AVX-512 VNNI: `kernels.gemm.int8.vnni`)."""
    return not int8.vnni()


MAPPING: dict[type, Any] = {Linear: DynamicQuantizedLinear}
"""Float module type -> its dynamically quantized replacement (a class with `from_float`)."""


def quantize_dynamic(model: Module, qconfig_spec: Any = None, dtype: Any = qint8, mapping: dict | None = None,
                     inplace: bool = False, *, reduce_range: bool | None = None) -> Module:
    """torch.ao.quantization.quantize_dynamic: `model` (a copy, unless `inplace`) with every submodule whose type is
    in `qconfig_spec` (a set of types; default: Linear) replaced by its quantized version from `mapping`.
    `reduce_range` (activations in [0, 127]) is passed to each `from_float` unless None (its default:
    `default_reduce_range`)."""
    if to_quantized_dtype("quantize_dynamic", dtype) is not qint8:
        fail("quantize_dynamic", f"only tg.qint8 weights are supported, got {dtype!r}", kind=DTypeError)
    mapping = MAPPING if mapping is None else mapping
    types = set(mapping) if qconfig_spec is None else set(qconfig_spec)
    unknown = [t for t in types if t not in mapping]
    if unknown:
        fail("quantize_dynamic", f"no quantized version of {', '.join(t.__name__ for t in unknown)} "
             f"(supported: {', '.join(t.__name__ for t in mapping)})", kind=ArgumentError)
    options = {} if reduce_range is None else {"reduce_range": reduce_range}
    return swap_modules(model, {t: functools.partial(mapping[t].from_float, **options) for t in types}, inplace)


def swap_modules(model: Module, replace: dict[type, Any], inplace: bool) -> Module:
    """`model` (a copy, unless `inplace`) with every submodule whose type is a key of `replace` replaced by what that
    key's function makes of it, in place in its parent (a Sequential keeps its order)."""
    model = model if inplace else copy.deepcopy(model)
    if type(model) in replace:
        return replace[type(model)](model)
    for name, child in list(model._modules.items()):
        if child is not None:
            model._modules[name] = swap_modules(child, replace, inplace=True)
    return model
