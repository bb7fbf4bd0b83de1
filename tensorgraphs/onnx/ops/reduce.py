"""Reductions over axes (an attribute or, from opset 13 for ReduceSum and 18 for the others, an input), with
keepdims, noop_with_empty_axes, and ONNX's values for empty sets (0 for sums, 1 for products, -inf/+inf for
max/min)."""

from __future__ import annotations

import math
from typing import Callable

import numpy as np

import tensorgraphs as tg
from tensorgraphs.frontend.tensor import Tensor
from tensorgraphs.onnx.lowering import OnnxNode, Value, ints, lowers, tensor
from tensorgraphs.onnx.ops.shape import axis_of

Reducer = Callable[[Tensor, tuple[int, ...]], Tensor]


def _sum(x: Tensor, axes: tuple[int, ...]) -> Tensor:
    return tg.sum(x, axes, keepdim=True).to(x.dtype)


REDUCTIONS: dict[str, tuple[Reducer, float]] = {
    "ReduceSum": (_sum, 0.0),
    "ReduceMean": (lambda x, a: tg.mean(x, a, keepdim=True) if x.dtype.is_floating_point
                   else tg.div(_sum(x, a), math.prod(x.shape[i] for i in a), rounding_mode="trunc"), math.nan),
    "ReduceMax": (lambda x, a: tg.amax(x, a, keepdim=True), -math.inf),
    "ReduceMin": (lambda x, a: tg.amin(x, a, keepdim=True), math.inf),
    "ReduceProd": (lambda x, a: _product(x, a), 1.0),
    "ReduceL1": (lambda x, a: _sum(tg.abs(x), a), 0.0),
    "ReduceL2": (lambda x, a: tg.sqrt(_sum(tg.mul(x, x), a).to(tg.float64)).to(x.dtype)
                 if not x.dtype.is_floating_point else tg.sqrt(_sum(tg.mul(x, x), a)), 0.0),
    "ReduceSumSquare": (lambda x, a: _sum(tg.mul(x, x), a), 0.0),
    "ReduceLogSum": (lambda x, a: tg.log(_sum(x, a)), -math.inf),
    "ReduceLogSumExp": (lambda x, a: tg.logsumexp(x, a, keepdim=True), -math.inf),
}


def _product(x: Tensor, axes: tuple[int, ...]) -> Tensor:
    for axis in axes:
        x = tg.prod(x, axis, keepdim=True)
    return x


@lowers(*REDUCTIONS)
def reduce(node: OnnxNode, x: Value, axes: Value | None = None) -> Tensor:
    x = tensor(x)
    since = 13 if node.op_type == "ReduceSum" else 18
    chosen = node.attr("axes") if node.opset < since else ints(axes)
    if not chosen and node.attr("noop_with_empty_axes", 0):
        return x
    dims = tuple(sorted({axis_of(a, x.ndim) for a in chosen})) if chosen else tuple(range(x.ndim))
    reducer, empty = REDUCTIONS[node.op_type]
    if any(x.shape[d] == 0 for d in dims):
        shape = tuple(1 if i in dims else s for i, s in enumerate(x.shape))
        out = tensor(np.full(shape, _empty_value(empty, x), x.dtype.storage))
    else:
        out = reducer(x, dims)
    if not node.attr("keepdims", 1):
        out = tg.reshape(out, tuple(s for i, s in enumerate(out.shape) if i not in dims))
    return out


def _empty_value(value: float, x: Tensor) -> float | int | bool:
    if x.dtype.is_floating_point or math.isnan(value):
        return value
    if x.dtype.is_bool:
        return value > 0
    info = np.iinfo(x.dtype.storage)
    return info.min if value < 0 else info.max if math.isinf(value) else int(value)
