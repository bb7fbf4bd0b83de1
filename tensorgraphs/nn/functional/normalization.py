"""Normalization layers: the layer_norm composite, and rms_norm, group_norm, batch_norm built on primitives."""

from __future__ import annotations

import functools
import math
from typing import Sequence

import numpy as np

from tensorgraphs.errors import ArgumentError, fail
from tensorgraphs.frontend import elementwise as ew
from tensorgraphs.frontend import movement as mv
from tensorgraphs.frontend import reduce as rd
from tensorgraphs.frontend.autocast import FLOAT32, autocast_op
from tensorgraphs.frontend.checks import ints_arg
from tensorgraphs.frontend.tensor import Tensor, apply_composite
from tensorgraphs.graph import node as g
from tensorgraphs.graph.composite import Composite, register
from tensorgraphs.nn.functional.arguments import require_float, require_same_dtype


def _trailing_dims(x: Tensor, count: int) -> tuple[int, ...]:
    return tuple(range(x.ndim - count, x.ndim))


def _layer_norm_decomposition(x: Tensor, weight: Tensor, bias: Tensor, *, normalized_ndim: int, eps: float) -> Tensor:
    """(x - mean) / sqrt(biased var + eps) * weight + bias over the trailing `normalized_ndim` dims."""
    dims = _trailing_dims(x, normalized_ndim)
    centered = ew.sub(x, rd.mean(x, dims, keepdim=True))
    variance = rd.mean(ew.mul(centered, centered), dims, keepdim=True)
    return ew.add(ew.mul(ew.mul(centered, ew.rsqrt(ew.add(variance, eps))), weight), bias)


LAYER_NORM = register(Composite("layer_norm", lambda x, w, b, **_: (x.dtype, x.shape), _layer_norm_decomposition))


def _normalized_shape(op: str, x: Tensor, normalized_shape: int | Sequence[int]) -> tuple[int, ...]:
    shape = ints_arg(op, "normalized_shape", normalized_shape)
    if not shape or x.shape[x.ndim - len(shape):] != shape or len(shape) > x.ndim:
        fail(op, f"given normalized_shape={list(shape)}, expected input with shape [*, "
             f"{', '.join(map(str, shape))}], but got input of size {list(x.shape)}")
    return shape


def _check_param(op: str, name: str, param: Tensor | None, shape: tuple[int, ...]) -> None:
    if param is not None and param.shape != shape:
        fail(op, f"expected {name} of shape {shape}, got {param.shape}")


def _constant(value: float, x: Tensor, shape: tuple[int, ...]) -> Tensor:
    return Tensor(g.const(value, x.dtype, shape))


def layer_norm(input: Tensor, normalized_shape: int | Sequence[int], weight: Tensor | None = None,
               bias: Tensor | None = None, eps: float = 1e-5) -> Tensor:
    shape = _normalized_shape("layer_norm", input, normalized_shape)
    require_float("layer_norm", input=input)
    require_same_dtype("layer_norm", input=input, weight=weight, bias=bias)
    _check_param("layer_norm", "weight", weight, shape)
    _check_param("layer_norm", "bias", bias, shape)
    weight = _constant(1.0, input, shape) if weight is None else weight
    bias = _constant(0.0, input, shape) if bias is None else bias
    return apply_composite(LAYER_NORM, input, weight, bias, normalized_ndim=len(shape), eps=float(eps))


def rms_norm(input: Tensor, normalized_shape: int | Sequence[int], weight: Tensor | None = None,
             eps: float | None = None) -> Tensor:
    """x / sqrt(mean(x^2) + eps) * weight; eps defaults to the dtype's machine epsilon, as torch."""
    shape = _normalized_shape("rms_norm", input, normalized_shape)
    require_float("rms_norm", input=input)
    _check_param("rms_norm", "weight", weight, shape)
    eps = float(np.finfo(input.dtype.storage).eps) if eps is None else eps
    dims = _trailing_dims(input, len(shape))
    mean_square = rd.mean(ew.mul(input, input), dims, keepdim=True)
    out = ew.mul(input, ew.rsqrt(ew.add(mean_square, eps)))
    return out if weight is None else ew.mul(out, weight)


def _per_channel(param: Tensor, ndim: int) -> Tensor:
    """A (C,) tensor shaped to broadcast against (N, C, *spatial)."""
    return mv.reshape(param, (param.shape[0],) + (1,) * (ndim - 2))


def _affine(out: Tensor, weight: Tensor | None, bias: Tensor | None) -> Tensor:
    if weight is not None:
        out = ew.mul(out, _per_channel(weight, out.ndim))
    return out if bias is None else ew.add(out, _per_channel(bias, out.ndim))


def _check_channels(op: str, x: Tensor, **params: Tensor | None) -> int:
    if x.ndim < 2:
        fail(op, f"expected input of shape (N, C, *), got {x.shape}")
    require_float(op, input=x)
    require_same_dtype(op, input=x, **params)
    for name, param in params.items():
        _check_param(op, name, param, (x.shape[1],))
    return x.shape[1]


def group_norm(input: Tensor, num_groups: int, weight: Tensor | None = None, bias: Tensor | None = None,
               eps: float = 1e-5) -> Tensor:
    """Layer norm over each group of C / num_groups channels (and all spatial positions), then a per-channel affine."""
    channels = _check_channels("group_norm", input, weight=weight, bias=bias)
    if num_groups <= 0 or channels % num_groups:
        fail("group_norm", f"expected number of channels in input to be divisible by num_groups, but got input of "
             f"shape {input.shape} and num_groups={num_groups}")
    grouped = mv.reshape(input, (input.shape[0], num_groups, -1))
    normalized = layer_norm(grouped, grouped.shape[-1], eps=eps)
    return _affine(mv.reshape(normalized, input.shape), weight, bias)


def batch_norm(input: Tensor, running_mean: Tensor | None, running_var: Tensor | None, weight: Tensor | None = None,
               bias: Tensor | None = None, training: bool = False, momentum: float = 0.1, eps: float = 1e-5) -> Tensor:
    """Normalize each channel by batch statistics (training) or the running ones; training updates the running
    statistics in place (`assign`) with the unbiased batch variance, as torch."""
    _check_channels("batch_norm", input, weight=weight, bias=bias, running_mean=running_mean, running_var=running_var)
    stat_dims = (0,) + tuple(range(2, input.ndim))
    if training:
        count = math.prod(input.shape[d] for d in stat_dims)
        if count <= 1:
            fail("batch_norm", f"expected more than 1 value per channel when training, got input size {input.shape}",
                 kind=ArgumentError)
        mean = rd.mean(input, stat_dims)
        variance = rd.var(input, stat_dims, correction=0)
        _update_running(running_mean, mean, momentum)
        _update_running(running_var, ew.mul(variance, count / (count - 1)), momentum)
    elif running_mean is None or running_var is None:
        fail("batch_norm", "running_mean and running_var must be given when training=False", kind=ArgumentError)
    else:
        mean, variance = running_mean, running_var
    scale = ew.rsqrt(ew.add(_per_channel(variance, input.ndim), eps))
    out = ew.mul(ew.sub(input, _per_channel(mean, input.ndim)), scale)
    return _affine(out, weight, bias)


def _update_running(running: Tensor | None, batch_stat: Tensor, momentum: float) -> None:
    if running is not None:
        running.assign(ew.add(ew.mul(running, 1.0 - momentum), ew.mul(batch_stat.detach(), momentum)))


def instance_norm(input: Tensor, running_mean: Tensor | None = None, running_var: Tensor | None = None,
                  weight: Tensor | None = None, bias: Tensor | None = None, use_input_stats: bool = True,
                  momentum: float = 0.1, eps: float = 1e-5) -> Tensor:
    """Normalize each channel of each sample over its spatial positions, then a per-channel affine. Running
    statistics, when given, move towards the batch mean of the per-sample statistics (unbiased variance), as
    torch; use_input_stats=False normalizes by them instead."""
    op = "instance_norm"
    if not use_input_stats:
        return batch_norm(input, running_mean, running_var, weight, bias, False, momentum, eps)
    _check_channels(op, input, weight=weight, bias=bias, running_mean=running_mean, running_var=running_var)
    spatial = tuple(range(2, input.ndim))
    count = math.prod(input.shape[d] for d in spatial)
    if input.ndim < 3 or count <= 1:
        fail(op, f"expected more than 1 spatial element when training, got input size {input.shape}",
             kind=ArgumentError)
    mean = rd.mean(input, spatial, keepdim=True)
    variance = rd.var(input, spatial, keepdim=True, correction=0)
    per_sample = input.shape[:2]
    _update_running(running_mean, rd.mean(mv.reshape(mean, per_sample), 0), momentum)
    _update_running(running_var, rd.mean(mv.reshape(ew.mul(variance, count / (count - 1)), per_sample), 0), momentum)
    return _affine(ew.mul(ew.sub(input, mean), ew.rsqrt(ew.add(variance, eps))), weight, bias)


@autocast_op(FLOAT32)
def local_response_norm(input: Tensor, size: int, alpha: float = 1e-4, beta: float = 0.75, k: float = 1.0) -> Tensor:
    """x / (k + alpha * mean of x^2 over the `size` neighbouring channels)^beta, the window zero-padded at the
    channel ends and always divided by `size`, as torch."""
    size = ints_arg("local_response_norm", "size", size)[0]
    if input.ndim < 3:
        fail("local_response_norm", f"expected 3D or higher dimensionality input, got {input.shape}")
    if input.numel() == 0:
        return input
    channels = input.shape[1]
    padded = mv.pad_dim(ew.mul(input, input), 1, size // 2, (size - 1) // 2)
    window_sum = functools.reduce(ew.add, (mv.narrow(padded, 1, i, channels) for i in range(size)))
    return ew.div(input, ew.pow(ew.add(ew.mul(ew.div(window_sum, size), alpha), k), beta))
