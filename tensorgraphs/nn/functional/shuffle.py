"""Rearrangements between channels and space: pixel_shuffle, pixel_unshuffle, channel_shuffle (views only)."""

from __future__ import annotations

from tensorgraphs.errors import ArgumentError, fail
from tensorgraphs.frontend import movement as mv
from tensorgraphs.frontend.checks import int_arg
from tensorgraphs.frontend.tensor import Tensor


def _factor(op: str, name: str, value: int, input: Tensor, min_ndim: int) -> int:
    factor = int_arg(op, name, value)
    if factor <= 0:
        fail(op, f"{name} must be greater than 0, but got {factor}", kind=ArgumentError)
    if input.ndim < min_ndim:
        fail(op, f"expected an input of at least {min_ndim} dims, got shape {input.shape}")
    return factor


def pixel_shuffle(input: Tensor, upscale_factor: int) -> Tensor:
    """(*, C * r * r, H, W) -> (*, C, H * r, W * r)."""
    r = _factor("pixel_shuffle", "upscale_factor", upscale_factor, input, 3)
    *batch, channels, height, width = input.shape
    if channels % (r * r):
        fail("pixel_shuffle", f"the channels ({channels}) must be divisible by the square of upscale_factor ({r})")
    x = mv.reshape(input, (*batch, channels // (r * r), r, r, height, width))
    n = len(batch)
    x = mv.permute(x, (*range(n), n, n + 3, n + 1, n + 4, n + 2))
    return mv.reshape(x, (*batch, channels // (r * r), height * r, width * r))


def pixel_unshuffle(input: Tensor, downscale_factor: int) -> Tensor:
    """(*, C, H * r, W * r) -> (*, C * r * r, H, W)."""
    r = _factor("pixel_unshuffle", "downscale_factor", downscale_factor, input, 3)
    *batch, channels, height, width = input.shape
    if height % r or width % r:
        fail("pixel_unshuffle", f"the height ({height}) and width ({width}) must be divisible by downscale_factor "
             f"({r})")
    x = mv.reshape(input, (*batch, channels, height // r, r, width // r, r))
    n = len(batch)
    x = mv.permute(x, (*range(n), n, n + 2, n + 4, n + 1, n + 3))
    return mv.reshape(x, (*batch, channels * r * r, height // r, width // r))


def channel_shuffle(input: Tensor, groups: int) -> Tensor:
    """(N, g * k, *) -> the channels read group-major become read member-major: (N, k * g, *)."""
    g = _factor("channel_shuffle", "groups", groups, input, 3)
    batch, channels, *spatial = input.shape
    if channels % g:
        fail("channel_shuffle", f"the number of channels ({channels}) must be divisible by groups ({g})")
    x = mv.reshape(input, (batch, g, channels // g, *spatial))
    return mv.reshape(mv.transpose(x, 1, 2), input.shape)


native_channel_shuffle = channel_shuffle  # torch's name for the kernel behind channel_shuffle: the same result
