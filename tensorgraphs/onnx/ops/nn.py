"""Neural-network ops: convolutions and pooling in 1-3 spatial dims with ONNX's padding rules (auto_pad,
asymmetric pads, ceil_mode, count_include_pad), normalizations, Gemm/MatMul and softmaxes."""

from __future__ import annotations

import math

import numpy as np

import tensorgraphs as tg
from tensorgraphs.frontend import movement as mv
from tensorgraphs.frontend.tensor import Tensor
from tensorgraphs.nn.functional.conv import conv2d_composite, zero_dilate
from tensorgraphs.nn.functional.pooling import Combine, Parts, first_maximum, larger, pool_windows, summed
from tensorgraphs.onnx.lowering import OnnxNode, Value, evaluate, ints, lowers, tensor
from tensorgraphs.onnx.ops.shape import axis_of

Pads = list[tuple[int, int]]


class Window:
    """A node's kernel, strides, dilations and (before, after) pads per spatial dim, resolved from auto_pad."""

    def __init__(self, node: OnnxNode, spatial: tuple[int, ...], kernel: tuple[int, ...]) -> None:
        n = len(spatial)
        self.kernel = tuple(kernel)
        self.strides = tuple(node.attr("strides") or [1] * n)
        self.dilations = tuple(node.attr("dilations") or [1] * n)
        auto_pad = node.attr("auto_pad", "NOTSET")
        reach = [(k - 1) * d + 1 for k, d in zip(self.kernel, self.dilations)]
        if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            totals = [max((-(-size // s) - 1) * s + r - size, 0) for size, s, r in zip(spatial, self.strides, reach)]
            lower = auto_pad == "SAME_LOWER"
            self.pads = [((t + 1) // 2, t // 2) if lower else (t // 2, (t + 1) // 2) for t in totals]
        elif auto_pad == "VALID":
            self.pads = [(0, 0)] * n
        else:
            flat = node.attr("pads") or [0] * (2 * n)
            self.pads = list(zip(flat[:n], flat[n:]))
        ceil = bool(node.attr("ceil_mode", 0))
        self.out = []
        for size, s, r, (before, after) in zip(spatial, self.strides, reach, self.pads):
            span = size + before + after - r
            count = (-(-span // s) if ceil else span // s) + 1
            if ceil and (count - 1) * s >= size + before:
                count -= 1
            self.out.append(count)
        self.reach = reach

    def padded(self, x: Tensor, value: float, pads: bool = True) -> Tensor:
        """x padded by `pads` (unless x holds them already) and, past them, as far as the last window reaches
        (ceil_mode), with `value`."""
        first = x.ndim - len(self.kernel)
        for i, (before, after) in enumerate(self.pads if pads else [(0, 0)] * len(self.pads)):
            needed = (self.out[i] - 1) * self.strides[i] + self.reach[i]
            extra = needed - (x.shape[first + i] + before + after)
            x = mv.pad_dim(x, first + i, before, after + max(extra, 0), value)
        return x

    def reduce(self, parts: Parts, combine: Combine) -> Parts:
        """`pool_windows` over `parts` padded (`padded`)."""
        return pool_windows(parts, combine, self.kernel, self.strides, self.dilations, self.out)


def convolve(x: Tensor, w: Tensor, strides: tuple, pads: Pads, dilations: tuple, groups: int) -> Tensor:
    """N-d convolution on the conv2d composite: 1-d as a height-1 2-d, 3-d as a sum over the kernel's depth of
    2-d convolutions with the output depths folded into the batch."""
    n = w.ndim - 2
    if n == 1:
        out = convolve(tg.unsqueeze(x, 2), tg.unsqueeze(w, 2), (1, *strides), [(0, 0), *pads], (1, *dilations),
                       groups)
        return tg.squeeze(out, 2)
    if n == 2:
        return conv2d_composite("Conv", x, w, tuple(strides), tuple(pads), tuple(dilations), groups)
    x = mv.pad_dim(x, 2, *pads[0])
    depth = (x.shape[2] - (w.shape[2] - 1) * dilations[0] - 1) // strides[0] + 1
    total = None
    for k in range(w.shape[2]):
        start = k * dilations[0]
        plane = mv.slice_dim(x, 2, start, start + (depth - 1) * strides[0] + 1, strides[0])
        batch = tg.reshape(tg.permute(plane, (0, 2, 1, 3, 4)), (-1, *plane.shape[1:2], *plane.shape[3:]))
        part = convolve(batch, w[:, :, k], strides[1:], pads[1:], dilations[1:], groups)
        total = part if total is None else tg.add(total, part)
    out = tg.reshape(total, (x.shape[0], depth, *total.shape[1:]))
    return tg.permute(out, (0, 2, 1, 3, 4))


def _with_bias(out: Tensor, bias: Value | None) -> Tensor:
    if bias is None:
        return out
    return tg.add(out, tg.reshape(tensor(bias), (-1,) + (1,) * (out.ndim - 2)))


@lowers("Conv")
def conv(node: OnnxNode, x: Value, w: Value, bias: Value | None = None) -> Tensor:
    x, w = tensor(x), tensor(w)
    if not 1 <= w.ndim - 2 <= 3:
        node.fail(f"{w.ndim - 2}-d convolutions are not supported (1-d to 3-d are)")
    window = Window(node, tuple(x.shape[2:]), tuple(node.attr("kernel_shape") or w.shape[2:]))
    out = convolve(x, w, window.strides, window.pads, window.dilations, node.attr("group", 1))
    return _with_bias(out, bias)


@lowers("ConvTranspose")
def conv_transpose(node: OnnxNode, x: Value, w: Value, bias: Value | None = None) -> Tensor:
    """The convolution of the zero-dilated input with the flipped, transposed kernel; pads (or those that give
    output_shape, or auto_pad's) are taken off the full output."""
    x, w = tensor(x), tensor(w)
    n, groups = w.ndim - 2, node.attr("group", 1)
    spatial, kernel = x.shape[2:], w.shape[2:]
    strides = node.attr("strides") or [1] * n
    dilations = node.attr("dilations") or [1] * n
    extra = node.attr("output_padding") or [0] * n
    full = [s * (i - 1) + e + (k - 1) * d + 1 for s, i, e, k, d in zip(strides, spatial, extra, kernel, dilations)]
    auto_pad = node.attr("auto_pad", "NOTSET")
    target = node.attr("output_shape")
    if target is None and auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        target = [i * s for i, s in zip(spatial, strides)]
    if target is not None:
        totals = [f - t for f, t in zip(full, target[-n:])]
        upper = auto_pad == "SAME_UPPER"
        pads = [(t // 2, t - t // 2) if upper else (t - t // 2, t // 2) for t in totals]
    else:
        flat = node.attr("pads") or [0] * (2 * n)
        pads = list(zip(flat[:n], flat[n:]))
    for i, s in enumerate(strides):
        x = zero_dilate(x, 2 + i, s)
    reach = [(k - 1) * d for k, d in zip(kernel, dilations)]
    conv_pads = [(r - b, r - a + e) for r, (b, a), e in zip(reach, pads, extra)]
    c_in, c_out = w.shape[0], w.shape[1] * groups
    flipped = tg.flip(w, tuple(range(2, w.ndim)))
    grouped = tg.reshape(flipped, (groups, c_in // groups, c_out // groups, *kernel))
    kernels = tg.reshape(tg.permute(grouped, (0, 2, 1, *range(3, 3 + n))), (c_out, c_in // groups, *kernel))
    x = _crop_negative(x, conv_pads)
    conv_pads = [(max(b, 0), max(a, 0)) for b, a in conv_pads]
    return _with_bias(convolve(x, kernels, (1,) * n, conv_pads, tuple(dilations), groups), bias)


def _crop_negative(x: Tensor, pads: Pads) -> Tensor:
    first = x.ndim - len(pads)
    for i, (before, after) in enumerate(pads):
        x = mv.pad_dim(x, first + i, min(before, 0), min(after, 0))
    return x


def _pool_window(node: OnnxNode, x: Tensor) -> Window:
    return Window(node, tuple(x.shape[2:]), tuple(node.attr("kernel_shape")))


@lowers("MaxPool")
def max_pool(node: OnnxNode, x: Value) -> Tensor | tuple[Tensor, Tensor]:
    """Window maxima (pads are -inf); Indices: each maximum's flat position in the input (row- or column-major
    per storage_order), of the first maximum of its window. Under a gradient the first maximum is picked as well
    (`first_maximum`), so a window's gradient goes to it alone, as torch's does, rather than shared among ties."""
    x = tensor(x)
    window = _pool_window(node, x)
    low = -math.inf if x.dtype.is_floating_point else np.iinfo(x.dtype.storage).min
    if node.outputs < 2:
        return window.reduce((window.padded(x, low),), first_maximum if x.requires_grad else larger)[0]
    order = np.arange(math.prod(x.shape)).reshape(x.shape)
    if node.attr("storage_order", 0):
        spatial = x.shape[2:]
        inner = np.arange(math.prod(spatial)).reshape(spatial[::-1]).T
        order = np.arange(x.shape[0] * x.shape[1]).reshape(x.shape[:2] + (1,) * len(spatial)) * inner.size + inner
    return window.reduce((window.padded(x, low), window.padded(tensor(order.astype(np.int64)), -1)), first_maximum)


@lowers("AveragePool")
def average_pool(node: OnnxNode, x: Value) -> Tensor:
    x = tensor(x)
    window = _pool_window(node, x)
    (sums,) = window.reduce((window.padded(x, 0.0),), summed)
    counted = np.ones(x.shape[2:], x.dtype.storage)
    include = bool(node.attr("count_include_pad", 0))
    if include:
        counted = np.pad(counted, window.pads, constant_values=1)
    ones = window.padded(tensor(counted[None, None]), 0.0, pads=not include)
    (counts,) = evaluate(list(window.reduce((ones,), summed)))
    return tg.div(sums, tensor(counts.astype(x.dtype.storage)))


@lowers("LpPool")
def lp_pool(node: OnnxNode, x: Value) -> Tensor:
    x = tensor(x)
    p = node.attr("p", 2)
    window = _pool_window(node, x)
    powered = tg.pow(tg.abs(window.padded(x, 0.0)), p)
    return tg.pow(window.reduce((powered,), summed)[0], 1.0 / p)


@lowers("GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool")
def global_pool(node: OnnxNode, x: Value) -> Tensor:
    x = tensor(x)
    axes = tuple(range(2, x.ndim))
    if node.op_type == "GlobalAveragePool":
        return tg.mean(x, axes, keepdim=True)
    if node.op_type == "GlobalMaxPool":
        return tg.amax(x, axes, keepdim=True)
    p = node.attr("p", 2)
    return tg.pow(tg.sum(tg.pow(tg.abs(x), p), axes, keepdim=True), 1.0 / p)


def _channel(value: Value, ndim: int) -> Tensor:
    return tg.reshape(tensor(value), (-1,) + (1,) * (ndim - 2))


@lowers("BatchNormalization")
def batch_norm(node: OnnxNode, x: Value, scale: Value, bias: Value, mean: Value, var: Value) -> Tensor | tuple:
    """Inference with the running statistics; training_mode (opset 14+) normalizes with the batch's and also
    returns the updated running statistics."""
    x = tensor(x)
    eps = node.attr("epsilon", 1e-5)
    if node.attr("training_mode", 0):
        axes = (0, *range(2, x.ndim))
        batch_mean, batch_var = tg.mean(x, axes), tg.var(x, axes, correction=0)
        momentum = node.attr("momentum", 0.9)
        running_mean = tg.add(tg.mul(tensor(mean), momentum), tg.mul(batch_mean, 1 - momentum))
        running_var = tg.add(tg.mul(tensor(var), momentum), tg.mul(batch_var, 1 - momentum))
        mean, var = batch_mean, batch_var
    inv = tg.rsqrt(tg.add(_channel(var, x.ndim), eps))
    y = tg.add(tg.mul(tg.mul(tg.sub(x, _channel(mean, x.ndim)), inv), _channel(scale, x.ndim)), _channel(bias, x.ndim))
    return (y, running_mean, running_var) if node.attr("training_mode", 0) else y


def _normalize(x: Tensor, axes: tuple[int, ...], eps: float) -> tuple[Tensor, Tensor, Tensor]:
    """(x - mean) / sqrt(var + eps) over `axes` (biased variance), with the mean and the inverse deviation."""
    mean = tg.mean(x, axes, keepdim=True)
    centered = tg.sub(x, mean)
    inv = tg.rsqrt(tg.add(tg.mean(tg.mul(centered, centered), axes, keepdim=True), eps))
    return tg.mul(centered, inv), mean, inv


@lowers("InstanceNormalization")
def instance_norm(node: OnnxNode, x: Value, scale: Value, bias: Value) -> Tensor:
    x = tensor(x)
    y, _, _ = _normalize(x, tuple(range(2, x.ndim)), node.attr("epsilon", 1e-5))
    return tg.add(tg.mul(y, _channel(scale, x.ndim)), _channel(bias, x.ndim))


def _stashed(node: OnnxNode, x: Tensor) -> Tensor:
    """Half-precision inputs are normalized in float32 (stash_type 1, the default)."""
    return x.to(tg.float32) if node.attr("stash_type", 1) == 1 and x.dtype.itemsize < 4 else x


@lowers("LayerNormalization")
def layer_norm(node: OnnxNode, x: Value, scale: Value, bias: Value | None = None) -> tuple[Tensor, ...]:
    x = tensor(x)
    axis = axis_of(node.attr("axis", -1), x.ndim)
    y, mean, inv = _normalize(_stashed(node, x), tuple(range(axis, x.ndim)), node.attr("epsilon", 1e-5))
    y = tg.mul(y.to(x.dtype), tensor(scale))
    return (y if bias is None else tg.add(y, tensor(bias))), mean, inv


@lowers("RMSNormalization")
def rms_norm(node: OnnxNode, x: Value, scale: Value) -> Tensor:
    x = tensor(x)
    axis = axis_of(node.attr("axis", -1), x.ndim)
    stashed = _stashed(node, x)
    square = tg.mean(tg.mul(stashed, stashed), tuple(range(axis, x.ndim)), keepdim=True)
    y = tg.mul(stashed, tg.rsqrt(tg.add(square, node.attr("epsilon", 1e-5))))
    return tg.mul(y.to(x.dtype), tensor(scale))


@lowers("GroupNormalization")
def group_norm(node: OnnxNode, x: Value, scale: Value, bias: Value) -> Tensor:
    """Scale and bias per group before opset 21, per channel from it."""
    x = tensor(x)
    groups = node.attr("num_groups")
    grouped = tg.reshape(_stashed(node, x), (x.shape[0], groups, -1))
    y, _, _ = _normalize(grouped, (2,), node.attr("epsilon", 1e-5))
    scale, bias = tensor(scale), tensor(bias)
    if node.opset < 21:
        scale = tg.repeat_interleave(scale, x.shape[1] // groups)
        bias = tg.repeat_interleave(bias, x.shape[1] // groups)
    y = tg.reshape(y, x.shape).to(x.dtype)
    return tg.add(tg.mul(y, _channel(scale, x.ndim)), _channel(bias, x.ndim))


@lowers("LRN")
def lrn(node: OnnxNode, x: Value) -> Tensor:
    x = tensor(x)
    size = node.attr("size")
    alpha, beta, bias = node.attr("alpha", 1e-4), node.attr("beta", 0.75), node.attr("bias", 1.0)
    before, after = (size - 1) // 2, size - 1 - (size - 1) // 2
    squares = mv.pad_dim(tg.mul(x, x), 1, before, after)
    total = None
    for offset in range(size):
        part = mv.shrink_dim(squares, 1, offset, offset + x.shape[1])
        total = part if total is None else tg.add(total, part)
    return tg.div(x, tg.pow(tg.add(tg.mul(total, alpha / size), bias), beta))


@lowers("LpNormalization")
def lp_normalization(node: OnnxNode, x: Value) -> Tensor:
    x = tensor(x)
    axis = axis_of(node.attr("axis", -1), x.ndim)
    p = node.attr("p", 2)
    norm = tg.sum(tg.abs(x), axis, keepdim=True) if p == 1 else tg.sqrt(tg.sum(tg.mul(x, x), axis, keepdim=True))
    return tg.where(norm == 0, tg.zeros_like(x), tg.div(x, norm))


@lowers("MeanVarianceNormalization")
def mean_variance_normalization(node: OnnxNode, x: Value) -> Tensor:
    x = tensor(x)
    axes = tuple(axis_of(a, x.ndim) for a in node.attr("axes", [0, 2, 3]))
    mean = tg.mean(x, axes, keepdim=True)
    centered = tg.sub(x, mean)
    return tg.div(centered, tg.add(tg.sqrt(tg.mean(tg.mul(centered, centered), axes, keepdim=True)), 1e-9))


@lowers("MatMul")
def matmul(node: OnnxNode, a: Value, b: Value) -> Tensor:
    return tg.matmul(tensor(a), tensor(b))


@lowers("Gemm")
def gemm(node: OnnxNode, a: Value, b: Value, c: Value | None = None) -> Tensor:
    a, b = tensor(a), tensor(b)
    a = a.T if node.attr("transA", 0) else a
    b = b.T if node.attr("transB", 0) else b
    out = tg.matmul(a, b)
    alpha, beta = node.attr("alpha", 1.0), node.attr("beta", 1.0)
    out = out if alpha == 1.0 else tg.mul(out, alpha).to(out.dtype)
    if c is None:
        return out
    c = tensor(c)
    return tg.add(out, c if beta == 1.0 else tg.mul(c, beta).to(c.dtype))


@lowers("Softmax", "LogSoftmax")
def softmax(node: OnnxNode, x: Value) -> Tensor:
    """Before opset 13 the input is taken as 2-d, split at `axis` (default 1); from 13 along `axis` (default -1)."""
    x = tensor(x)
    function = tg.nn.functional.softmax if node.op_type == "Softmax" else tg.nn.functional.log_softmax
    if node.opset >= 13:
        return function(x, axis_of(node.attr("axis", -1), x.ndim))
    axis = axis_of(node.attr("axis", 1), x.ndim)
    flat = tg.reshape(x, (math.prod(x.shape[:axis]), math.prod(x.shape[axis:])))
    return tg.reshape(function(flat, 1), x.shape)


@lowers("Col2Im")
def col2im(node: OnnxNode, x: Value, image_shape: Value, block_shape: Value) -> Tensor:
    """Overlapping blocks summed into the image (F.fold): 2-d images with the same padding on both sides."""
    image, block = ints(image_shape), ints(block_shape)
    pads = node.attr("pads") or [0] * (2 * len(image))
    if len(image) != 2 or pads[:2] != pads[2:]:
        node.fail("Col2Im is supported for 2-d images with equal padding before and after")
    return tg.nn.functional.fold(tensor(x), image, block, dilation=node.attr("dilations") or 1,
                                 padding=pads[:2], stride=node.attr("strides") or 1)
