"""Quantization with PyTorch's names: quantized tensors (`quantize_per_tensor`, `quantize_per_channel`,
`dequantize`, `int_repr`), dynamic quantization of models (`quantize_dynamic`) and static post-training
quantization (`prepare`, calibration, `convert`)."""

from tensorgraphs.quantization.dynamic import DynamicQuantizedLinear, quantize_dynamic
from tensorgraphs.quantization.quantized_tensor import (
    QuantizedDType,
    QuantizedTensor,
    qint8,
    qint32,
    quantize_per_channel,
    quantize_per_tensor,
    quint8,
)
from tensorgraphs.quantization.static import (
    MinMaxObserver,
    StaticQuantizedConv2d,
    StaticQuantizedLinear,
    convert,
    prepare,
)

__all__ = ["DynamicQuantizedLinear", "MinMaxObserver", "QuantizedDType", "QuantizedTensor", "StaticQuantizedConv2d",
           "StaticQuantizedLinear", "convert", "prepare", "qint8", "qint32", "quantize_dynamic",
           "quantize_per_channel", "quantize_per_tensor", "quint8"]
