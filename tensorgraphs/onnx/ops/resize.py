"""Resize and Upsample, separably per axis: for each output position of an axis, the input positions it reads
(taps) and their weights, computed when the graph is built from ONNX's coordinate transformation, nearest mode
and interpolation (nearest, linear, cubic); the output is the weighted sum of index_selects."""

from __future__ import annotations

import math

import numpy as np

import tensorgraphs as tg
from tensorgraphs.frontend.tensor import Tensor
from tensorgraphs.onnx.lowering import OnnxNode, Value, known, lowers, tensor


def source_coordinates(mode: str, size: int, out: int, scale: float, roi: tuple[float, float]) -> np.ndarray:
    """The input coordinate each output position of an axis maps to."""
    o = np.arange(out, dtype=np.float64)
    if mode == "half_pixel":
        return (o + 0.5) / scale - 0.5
    if mode == "half_pixel_symmetric":
        adjustment = out / (scale * size)
        offset = size / 2 * (1 - adjustment)
        return offset + (o + 0.5) / scale - 0.5
    if mode == "pytorch_half_pixel":
        return (o + 0.5) / scale - 0.5 if out > 1 else np.zeros(out)
    if mode == "align_corners":  # the scaled size before rounding, as the reference does
        return o * (size - 1) / (size * scale - 1) if out > 1 else np.zeros(out)
    if mode == "asymmetric":
        return o / scale
    if mode == "tf_crop_and_resize":
        start, end = roi
        if out > 1:
            return start * (size - 1) + o * (end - start) * (size - 1) / (out - 1)
        return np.full(out, 0.5 * (start + end) * (size - 1))
    raise ValueError(mode)


def _nearest(x: np.ndarray, mode: str) -> np.ndarray:
    if mode == "floor":
        return np.floor(x)
    if mode == "ceil":
        return np.ceil(x)
    half = x - np.floor(x) == 0.5
    if mode == "round_prefer_ceil":
        return np.where(half, np.ceil(x), np.round(x))
    return np.where(half, np.floor(x), np.round(x))


def _cubic(ratio: np.ndarray, a: float) -> np.ndarray:
    """Weights of the taps at -1, 0, 1, 2 for a fractional offset `ratio` (Keys' kernel with parameter a)."""
    def kernel(d: np.ndarray) -> np.ndarray:
        d = np.abs(d)
        return np.where(d <= 1, ((a + 2) * d - (a + 3)) * d * d + 1,
                        np.where(d < 2, ((a * d - 5 * a) * d + 8 * a) * d - 4 * a, 0.0))
    return np.stack([kernel(ratio + 1), kernel(ratio), kernel(1 - ratio), kernel(2 - ratio)])


def taps(node: OnnxNode, mode: str, size: int, out: int, scale: float,
         roi: tuple[float, float]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(positions, weights) of shape (taps, out), and where the output is outside the input (extrapolated)."""
    transform = node.attr("coordinate_transformation_mode", "half_pixel")
    x = source_coordinates(transform, size, out, scale, roi)
    outside = (x < 0) | (x > size - 1) if transform == "tf_crop_and_resize" else np.zeros(out, bool)
    if mode == "nearest":
        positions = _nearest(x, node.attr("nearest_mode", "round_prefer_floor"))[None]
        weights = np.ones_like(positions)
    elif mode == "linear":
        floor = np.floor(x)
        positions = np.stack([floor, floor + 1])
        weights = np.stack([1 - (x - floor), x - floor])
    else:
        floor = np.floor(x)
        positions = floor[None] + np.arange(-1, 3)[:, None]
        weights = _cubic(x - floor, node.attr("cubic_coeff_a", -0.75))
        if node.attr("exclude_outside", 0):
            weights = np.where((positions < 0) | (positions > size - 1), 0.0, weights)
            weights = weights / weights.sum(0, keepdims=True)
    return np.clip(positions, 0, size - 1).astype(np.int64), weights, outside


def resample(node: OnnxNode, x: Tensor, mode: str, sizes: list[int], scales: list[float],
             roi: list[tuple[float, float]]) -> Tensor:
    outside_any = None
    for axis, (size, out, scale) in enumerate(zip(x.shape, sizes, scales)):
        identity = out == size and scale == 1 and node.attr("coordinate_transformation_mode") != "tf_crop_and_resize"
        if identity:
            continue
        positions, weights, outside = taps(node, mode, size, out, scale, roi[axis])
        shape = [1] * x.ndim
        shape[axis] = out
        total = None
        for position, weight in zip(positions, weights):
            picked = tg.index_select(x, axis, tensor(position))
            if mode != "nearest":
                picked = tg.mul(picked, tensor(weight.reshape(shape).astype(x.dtype.storage)))
            total = picked if total is None else tg.add(total, picked)
        x = total
        if outside.any():
            mask = outside.reshape(shape)
            outside_any = mask if outside_any is None else outside_any | mask
    if outside_any is not None:
        x = tg.where(tensor(outside_any), tg.full((), node.attr("extrapolation_value", 0.0), dtype=x.dtype), x)
    return x


@lowers("Resize")
def resize(node: OnnxNode, x: Value, roi: Value | None = None, scales: Value | None = None,
           sizes: Value | None = None) -> Tensor:
    x = tensor(x)
    if node.opset < 11:
        roi, scales, sizes = None, roi, None
    if node.attr("antialias", 0):
        node.fail("antialias is not supported")
    rank = x.ndim
    axes = node.attr("axes") or list(range(rank))
    axes = [a + rank if a < 0 else a for a in axes]
    roi_values = known(roi).tolist() if roi is not None and known(roi).size else None
    roi_pairs = [(0.0, 1.0)] * rank
    if roi_values:
        for i, a in enumerate(axes):
            roi_pairs[a] = (roi_values[i], roi_values[i + len(axes)])
    out_sizes, out_scales = list(x.shape), [1.0] * rank
    if sizes is not None and known(sizes).size:
        wanted = [int(v) for v in known(sizes)]
        policy = node.attr("keep_aspect_ratio_policy", "stretch")
        ratios = [w / x.shape[a] for w, a in zip(wanted, axes)]
        if policy != "stretch":
            ratio = min(ratios) if policy == "not_larger" else max(ratios)
            ratios = [ratio] * len(axes)
            wanted = [int(math.floor(ratio * x.shape[a] + 0.5)) for a in axes]
        for a, w, r in zip(axes, wanted, ratios):
            out_sizes[a], out_scales[a] = w, r
    else:
        for a, s in zip(axes, known(scales).tolist()):
            out_sizes[a], out_scales[a] = int(math.floor(x.shape[a] * s)), s
    mode = node.attr("mode", "nearest")
    return resample(node, x, mode, out_sizes, out_scales, roi_pairs)


@lowers("Upsample")
def upsample(node: OnnxNode, x: Value, scales: Value | None = None) -> Tensor:
    """Asymmetric coordinates, nearest by floor; scales an attribute before opset 9."""
    x = tensor(x)
    factors = node.attr("scales") if node.opset < 9 else known(scales).tolist()
    sizes = [int(math.floor(n * s)) for n, s in zip(x.shape, factors)]
    mode = "linear" if node.attr("mode", "nearest") in ("linear", "bilinear") else "nearest"
    as_resize = node.overriding(coordinate_transformation_mode="asymmetric", nearest_mode="floor")
    return resample(as_resize, x, mode, sizes, list(factors), [(0.0, 1.0)] * x.ndim)
