"""Linear quantization: DequantizeLinear, QuantizeLinear (round half to even, saturate to the integer type),
per tensor, per axis or per block, and the integer and quantized-linear matmul/conv built on them."""

from __future__ import annotations

import numpy as np

import tensorgraphs as tg
from tensorgraphs.frontend.tensor import Tensor
from tensorgraphs.kernels.gemm import int8
from tensorgraphs.onnx.dtypes import tg_dtype
from tensorgraphs.onnx.lowering import OnnxNode, Value, lowers, tensor
from tensorgraphs.onnx.ops.nn import conv
from tensorgraphs.onnx.ops.shape import axis_of
from tensorgraphs.quantization.linear import matmul_integer as integer_product


def _along(node: OnnxNode, parameter: Tensor, x: Tensor) -> Tensor:
    """A scale or zero point broadcast to x: a scalar, one value per index of `axis`, or one per block of
    block_size indices of `axis` (a tensor of x's rank)."""
    if parameter.ndim == 0 or parameter.numel() == 1 and parameter.ndim <= 1:
        return tg.reshape(parameter, ())
    axis = axis_of(node.attr("axis", 1), x.ndim)
    block = node.attr("block_size", 0)
    if block:
        return tg.narrow(tg.repeat_interleave(parameter, block, dim=axis), axis, 0, x.shape[axis])
    return tg.reshape(parameter, (-1,) + (1,) * (x.ndim - axis - 1))


def dequantize(node: OnnxNode, x: Tensor, scale: Tensor, zero: Tensor | None) -> Tensor:
    shifted = x.to(scale.dtype) if zero is None else tg.sub(x.to(tg.float32), _along(node, zero, x).to(tg.float32))
    return tg.mul(shifted.to(scale.dtype), _along(node, scale, x))


def quantize(node: OnnxNode, x: Tensor, scale: Tensor, zero: Tensor | None, dtype: tg.dtypes.DType) -> Tensor:
    scaled = tg.round(tg.div(x.to(tg.float32), _along(node, scale, x).to(tg.float32)))
    if zero is not None:
        scaled = tg.add(scaled, _along(node, zero, x).to(tg.float32))
    info = np.iinfo(dtype.storage)
    return tg.clamp(scaled, float(info.min), float(info.max)).to(dtype)


@lowers("DequantizeLinear")
def dequantize_linear(node: OnnxNode, x: Value, scale: Value, zero: Value | None = None) -> Tensor:
    out = dequantize(node, tensor(x), tensor(scale), None if zero is None else tensor(zero))
    target = node.attr("output_dtype", 0)
    return out.to(tg_dtype(target, node.describe())) if target else out


@lowers("QuantizeLinear")
def quantize_linear(node: OnnxNode, x: Value, scale: Value, zero: Value | None = None) -> Tensor:
    target = node.attr("output_dtype", 0)
    dtype = tg_dtype(target, node.describe()) if target else tg.uint8 if zero is None else tensor(zero).dtype
    return quantize(node, tensor(x), tensor(scale), None if zero is None else tensor(zero), dtype)


def _minus(x: Value, zero: Value | None) -> Tensor:
    x = tensor(x).to(tg.int32)
    return x if zero is None else tg.sub(x, tensor(zero).to(tg.int32))


def _packed_product(a: Value, b: Value, a_zero: Value | None, b_zero: Value | None) -> Tensor | None:
    """The product by the int8 GEMM (`quantization.linear.matmul_integer`, weights packed here, once) when B is a
    constant int8 matrix with zero points 0 and A's zero point is one number."""
    if not (isinstance(b, np.ndarray) and b.dtype == np.int8 and b.ndim == 2 and tensor(a).ndim >= 1):
        return None
    if (b_zero is not None and np.any(np.asarray(b_zero) != 0)) or (a_zero is not None and np.size(a_zero) != 1):
        return None
    packed, colsum = int8.pack_weights(np.ascontiguousarray(b.T))
    zero_point = 0 if a_zero is None else int(np.asarray(a_zero).reshape(()))
    return integer_product(tensor(a), tg.tensor(packed), tg.tensor(colsum), zero_point)


@lowers("MatMulInteger")
def matmul_integer(node: OnnxNode, a: Value, b: Value, a_zero: Value | None = None,
                   b_zero: Value | None = None) -> Tensor:
    """int32 products of the zero-point-shifted operands (a's zero point per row, b's per column)."""
    if (packed := _packed_product(a, b, a_zero, b_zero)) is not None:
        return packed
    a_zero = None if a_zero is None or tensor(a_zero).ndim == 0 else tg.unsqueeze(tensor(a_zero), -1)
    return tg.matmul(_minus(a, a_zero), _minus(b, b_zero))


@lowers("QLinearMatMul")
def qlinear_matmul(node: OnnxNode, a: Value, a_scale: Value, a_zero: Value, b: Value, b_scale: Value,
                   b_zero: Value, y_scale: Value, y_zero: Value) -> Tensor:
    a, b, y_zero = tensor(a), tensor(b), tensor(y_zero)
    per_row = _along_axis(node, -2)
    a_real = dequantize(per_row, a, tensor(a_scale).to(tg.float32), tensor(a_zero))
    b_real = dequantize(_along_axis(node, -1), b, tensor(b_scale).to(tg.float32), tensor(b_zero))
    return quantize(per_row, tg.matmul(a_real, b_real), tensor(y_scale).to(tg.float32), y_zero, y_zero.dtype)


def _along_axis(node: OnnxNode, axis: int) -> OnnxNode:
    """The quantized-linear ops' parameters: per tensor or per index of `axis` (they have no axis attribute)."""
    return node.overriding(axis=axis, block_size=0)


@lowers("ConvInteger")
def conv_integer(node: OnnxNode, x: Value, w: Value, x_zero: Value | None = None,
                 w_zero: Value | None = None) -> Tensor:
    """The convolution of the shifted operands, in float64 (exact for these sizes), as int32."""
    x_shifted = _minus(x, x_zero).to(tg.float64)
    w = tensor(w)
    w_zero = None if w_zero is None else tg.reshape(tensor(w_zero), (-1,) + (1,) * (w.ndim - 1))
    w_shifted = _minus(w, w_zero).to(tg.float64)
    return conv(node, x_shifted, w_shifted).to(tg.int32)


@lowers("QLinearConv")
def qlinear_conv(node: OnnxNode, x: Value, x_scale: Value, x_zero: Value, w: Value, w_scale: Value, w_zero: Value,
                 y_scale: Value, y_zero: Value, bias: Value | None = None) -> Tensor:
    x, w, y_zero = tensor(x), tensor(w), tensor(y_zero)
    x_real = dequantize(_along_axis(node, 1), x, tensor(x_scale).to(tg.float32), tensor(x_zero))
    w_real = dequantize(_along_axis(node, 0), w, tensor(w_scale).to(tg.float32), tensor(w_zero))
    out = conv(node, x_real, w_real)
    if bias is not None:
        scale = tg.mul(_along(_along_axis(node, 0), tensor(x_scale).to(tg.float32), w),
                       _along(_along_axis(node, 0), tensor(w_scale).to(tg.float32), w))
        out = tg.add(out, tg.reshape(tg.mul(tensor(bias).to(tg.float32), tg.reshape(scale, (-1,))),
                                     (-1,) + (1,) * (out.ndim - 2)))
    return quantize(_along_axis(node, 1), out, tensor(y_scale).to(tg.float32), y_zero, y_zero.dtype)
