"""Signal processing: DFT as matmuls with the (known) cosine and sine matrices, and the window functions."""

from __future__ import annotations

import math

import numpy as np

import tensorgraphs as tg
from tensorgraphs.frontend import movement as mv
from tensorgraphs.frontend.tensor import Tensor
from tensorgraphs.onnx.dtypes import numpy_dtype
from tensorgraphs.onnx.lowering import OnnxNode, Value, lowers, scalar, tensor


@lowers("DFT")
def dft(node: OnnxNode, x: Value, length: Value | None = None, axis: Value | None = None) -> Tensor:
    """x (..., 1 or 2): real, or complex as (real, imaginary) pairs -> (..., 2), computed in float64; the signal
    along `axis` is cut or zero-padded to dft_length; inverse divides by it; onesided keeps the first
    length // 2 + 1 outputs, or, inverse, takes them as input and gives the real signal (..., 1)."""
    x = tensor(x)
    rank = x.ndim - 1
    dim = node.attr("axis", 1) if node.opset < 20 else int(scalar(axis, -2))
    dim = dim + x.ndim if dim < 0 else dim
    inverse, onesided = node.attr("inverse", 0), node.attr("onesided", 0)
    signal = tg.movedim(x.to(tg.float64), dim, rank - 1)  # (..., n, 1 or 2)
    if inverse and onesided:
        size = 2 * (signal.shape[-2] - 1) if length is None else int(scalar(length))
        signal = _hermitian(signal, size)
    size = signal.shape[-2] if length is None else int(scalar(length))
    if size >= signal.shape[-2]:
        signal = mv.pad_dim(signal, rank - 1, 0, size - signal.shape[-2])
    else:
        signal = mv.shrink_dim(signal, rank - 1, 0, size)
    real = signal[..., 0]
    imag = signal[..., 1] if signal.shape[-1] == 2 else None
    outputs = size // 2 + 1 if onesided and not inverse else size
    angle = 2 * math.pi * np.outer(np.arange(size), np.arange(outputs)) / size
    cos, sin = tensor(np.cos(angle)), tensor((1.0 if inverse else -1.0) * np.sin(angle))
    out_real, out_imag = tg.matmul(real, cos), tg.matmul(real, sin)
    if imag is not None:
        out_real = tg.sub(out_real, tg.matmul(imag, sin))
        out_imag = tg.add(out_imag, tg.matmul(imag, cos))
    out = tg.unsqueeze(out_real, -1) if inverse and onesided else tg.stack([out_real, out_imag], dim=-1)
    out = tg.div(out, size) if inverse else out
    return tg.movedim(out, rank - 1, dim).to(x.dtype)


def _hermitian(half: Tensor, size: int) -> Tensor:
    """The full spectrum (..., size, 2) of a real signal from its first size // 2 + 1 values: X[k] = conj(X[n-k])."""
    if half.shape[-1] == 1:
        half = mv.pad_dim(half, -1, 0, 1)
    mirrored = tg.flip(mv.shrink_dim(half, -2, 1, size - half.shape[-2] + 1), -2)
    conjugate = tg.mul(mirrored, tensor(np.asarray([1.0, -1.0])))
    return tg.cat([half, conjugate], dim=-2)


WINDOWS = {
    "HannWindow": lambda t: 0.5 - 0.5 * np.cos(t),
    "HammingWindow": lambda t: 25 / 46 - (1 - 25 / 46) * np.cos(t),
    "BlackmanWindow": lambda t: 0.42 - 0.5 * np.cos(t) + 0.08 * np.cos(2 * t),
}


@lowers(*WINDOWS)
def window(node: OnnxNode, size: Value) -> np.ndarray:
    n = int(scalar(size))
    period = n if node.attr("periodic", 1) else n - 1
    values = WINDOWS[node.op_type](2 * math.pi * np.arange(n) / period)
    return values.astype(numpy_dtype(node.attr("output_datatype", 1)))
