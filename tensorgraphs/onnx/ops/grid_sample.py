"""GridSample in 2 or 3 spatial dims: each output position reads the input at a grid coordinate (normalized to
[-1, 1]), by nearest, linear or cubic interpolation, with zeros, border or reflection padding; as ONNX's
reference does, coordinates outside the borders are clamped or reflected first, then each tap again."""

from __future__ import annotations

import itertools
import math

import tensorgraphs as tg
from tensorgraphs.frontend.tensor import Tensor
from tensorgraphs.onnx.lowering import OnnxNode, Value, lowers, tensor

Tap = tuple[Tensor, Tensor, Tensor]  # index (int64), weight, whether it reads the input (bool)


def _reflect(x: Tensor, low: float, high: float) -> Tensor:
    """x folded back into [low, high] by reflecting at the nearer border, as often as needed."""
    span = high - low
    below, above = x < low, x > high
    distance = tg.where(below, tg.sub(low, x), tg.where(above, tg.sub(x, high), tg.zeros_like(x)))
    folds = tg.trunc(tg.div(distance, span))
    rest = tg.sub(distance, tg.mul(folds, span))
    even = tg.remainder(folds, 2) == 0
    from_low = tg.where(even, tg.add(rest, low), tg.sub(high, rest))
    from_high = tg.where(even, tg.sub(high, rest), tg.add(rest, low))
    return tg.where(below, from_low, tg.where(above, from_high, x))


def _fetch(index: Tensor, size: int, padding: str, low: float, high: float) -> tuple[Tensor, Tensor]:
    """(a valid index, whether the tap reads the input) for integer tap positions `index` (as floats)."""
    if padding == "zeros":
        inside = tg.logical_and(index >= 0, index <= size - 1)
        return tg.clamp(index, 0, size - 1).to(tg.int64), inside
    if padding == "border":
        return tg.clamp(index, 0, size - 1).to(tg.int64), tg.ones(index.shape, dtype=tg.bool)
    return tg.clamp(tg.trunc(_reflect(index, low, high)), 0, size - 1).to(tg.int64), tg.ones(index.shape,
                                                                                             dtype=tg.bool)


def _taps(x: Tensor, size: int, mode: str, padding: str, align: bool) -> list[Tap]:
    """The taps of one spatial dim for denormalized coordinates `x`."""
    low, high = (0.0, size - 1.0) if align else (-0.5, size - 0.5)
    if mode == "nearest":
        x = tg.round(x)
    outside = tg.logical_or(x < low, x > high)
    if padding == "border":
        x = tg.where(outside, tg.clamp(x, 0, size - 1), x)
    elif padding == "reflection":
        x = tg.where(outside, _reflect(x, low, high), x)
    if mode == "nearest":
        index, inside = _fetch(tg.trunc(x), size, padding, low, high)
        return [(index, tg.ones_like(x), inside)]
    first = tg.floor(x)
    ratio = tg.sub(x, first)
    if mode == "linear":
        offsets, weights = (0, 1), (tg.sub(1.0, ratio), ratio)
    else:
        offsets = (-1, 0, 1, 2)
        weights = tuple(_cubic_weights(ratio))
    taps = []
    for offset, weight in zip(offsets, weights):
        index, inside = _fetch(tg.add(first, float(offset)), size, padding, low, high)
        taps.append((index, weight, inside))
    return taps


def _cubic_weights(ratio: Tensor) -> list[Tensor]:
    a = -0.75

    def kernel(d: Tensor) -> Tensor:
        d = tg.abs(d)
        near = tg.add(tg.mul(tg.sub(tg.mul(d, a + 2), a + 3), tg.mul(d, d)), 1.0)
        far = tg.sub(tg.mul(tg.add(tg.mul(tg.sub(tg.mul(d, a), 5 * a), d), 8 * a), d), 4 * a)
        return tg.where(d <= 1, near, tg.where(d < 2, far, tg.zeros_like(d)))

    return [kernel(tg.add(ratio, 1.0)), kernel(ratio), kernel(tg.sub(1.0, ratio)), kernel(tg.sub(2.0, ratio))]


@lowers("GridSample")
def grid_sample(node: OnnxNode, x: Value, grid: Value) -> Tensor:
    x, grid = tensor(x), tensor(grid)
    mode = {"bilinear": "linear", "bicubic": "cubic"}.get(node.attr("mode", "linear"), node.attr("mode", "linear"))
    padding, align = node.attr("padding_mode", "zeros"), bool(node.attr("align_corners", 0))
    n, c, spatial = x.shape[0], x.shape[1], tuple(x.shape[2:])
    out = tuple(grid.shape[1:-1])
    dims = len(spatial)
    taps_per_dim = []
    for d, size in enumerate(spatial):
        g = tg.reshape(grid[..., dims - 1 - d], (n, -1))
        coordinate = tg.mul(tg.add(g, 1.0), (size - 1) / 2) if align else tg.div(tg.sub(tg.mul(tg.add(g, 1.0),
                                                                                                 size), 1.0), 2)
        taps_per_dim.append(_taps(coordinate, size, mode, padding, align))
    strides = [math.prod(spatial[d + 1:]) for d in range(dims)]
    flat = tg.reshape(x, (n, c, -1))
    total = None
    for combination in itertools.product(*taps_per_dim):
        index = sum((tg.mul(t[0], s) for t, s in zip(combination, strides)), tg.zeros((n, 1), dtype=tg.int64))
        weight = combination[0][1]
        inside = combination[0][2]
        for t in combination[1:]:
            weight, inside = tg.mul(weight, t[1]), tg.logical_and(inside, t[2])
        picked = tg.gather(flat, 2, tg.broadcast_to(tg.unsqueeze(index, 1), (n, c, index.shape[-1])))
        term = tg.mul(picked, tg.unsqueeze(tg.where(inside, weight, tg.zeros_like(weight)).to(x.dtype), 1))
        total = term if total is None else tg.add(total, term)
    return tg.reshape(total, (n, c, *out))

