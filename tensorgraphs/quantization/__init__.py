"""Quantization with PyTorch's names: quantized tensors (`quantize_per_tensor`, `quantize_per_channel`,
`dequantize`, `int_repr`) and dynamic quantization of models (`quantize_dynamic`)."""

from tensorgraphs.quantization.dynamic import DynamicQuantizedLinear, quantize_dynamic
from tensorgraphs.quantization.tensor import (
    QuantizedDType,
    QuantizedTensor,
    qint8,
    qint32,
    quantize_per_channel,
    quantize_per_tensor,
    quint8,
)

__all__ = ["DynamicQuantizedLinear", "QuantizedDType", "QuantizedTensor", "qint8", "qint32", "quantize_dynamic",
           "quantize_per_channel", "quantize_per_tensor", "quint8"]
