"""Pooling: reductions over windows (`pool_windows`, shared with the ONNX pools), and adaptive pooling by gather."""

from __future__ import annotations

import functools
import math
from typing import Any, Callable, Sequence

import numpy as np

from tensorgraphs import dtypes
from tensorgraphs.backends.numpy_backend import REFERENCE
from tensorgraphs.errors import ArgumentError, UnsupportedError, fail
from tensorgraphs.frontend import elementwise as ew
from tensorgraphs.frontend import movement as mv
from tensorgraphs.frontend import reduce as rd
from tensorgraphs.frontend.checks import int_arg, ints_arg
from tensorgraphs.frontend.tensor import Tensor, apply_composite, expand_to
from tensorgraphs.graph import node as g
from tensorgraphs.graph.composite import Composite, register
from tensorgraphs.nn.functional.arguments import require_float, tuple_of
from tensorgraphs.nn.functional.conv import long_window, pad_spatial

IntPair = int | Sequence[int]


def _pool_output_size(size: int, kernel: int, stride: int, pad: int, dilation: int, ceil_mode: bool) -> int:
    """torch's pooling_output_shape: with ceil_mode the last window must still start inside the input or left pad."""
    reach = dilation * (kernel - 1) + 1
    out = (size + 2 * pad - reach + (stride - 1 if ceil_mode else 0)) // stride + 1
    if ceil_mode and (out - 1) * stride >= size + pad:
        out -= 1
    return out


class PoolGeometry:
    """Checked pooling arguments and the padding (with ceil_mode's extra, or a crop) that makes the window views
    cover exactly the output positions."""

    def __init__(self, op: str, x: Tensor, kernel_size: IntPair, stride: IntPair | None, padding: IntPair,
                 dilation: IntPair, ceil_mode: bool) -> None:
        if x.ndim not in (3, 4):
            fail(op, f"expected 3D or 4D (batch mode) input, got input of size {x.shape}")
        require_float(op, input=x)
        self.kernel = tuple_of(op, "kernel_size", kernel_size, 2)
        self.stride = self.kernel if stride is None or stride == [] else tuple_of(op, "stride", stride, 2)
        self.padding = tuple_of(op, "padding", padding, 2, minimum=0)
        self.dilation = tuple_of(op, "dilation", dilation, 2)
        for k, p, d in zip(self.kernel, self.padding, self.dilation):
            if p > (d * (k - 1) + 1) // 2:
                fail(op, f"pad should be at most half of effective kernel size, but got pad={p}, kernel_size={k} "
                     f"and dilation={d}", kind=ArgumentError)
        sizes = x.shape[-2:]
        self.out = tuple(_pool_output_size(n, k, s, p, d, ceil_mode)
                         for n, k, s, p, d in zip(sizes, self.kernel, self.stride, self.padding, self.dilation))
        if any(o <= 0 for o in self.out):
            fail(op, f"given input size {x.shape}, calculated output size {self.out} is too small")
        needed = [(o - 1) * s + d * (k - 1) + 1
                  for o, k, s, d in zip(self.out, self.kernel, self.stride, self.dilation)]
        self.extra = tuple(need - (n + 2 * p) for need, n, p in zip(needed, sizes, self.padding))

    def pad(self, x: Tensor, value: float) -> Tensor:
        return pad_spatial(x, tuple((p, p) for p in self.padding), value)

    def fitted(self, padded: Tensor, pad_value: float) -> Tensor:
        """Padded (..., H + 2p, W + 2p) with ceil_mode's extra (`pad_value` too) or cropped to what the windows
        cover."""
        return pad_spatial(padded, tuple((0, e) for e in self.extra), pad_value)

    def reduce(self, parts: Parts, combine: Combine) -> Parts:
        """`pool_windows` over `parts` padded already (a maximum's values with -inf, its positions with -1, a sum's
        values with 0), each fitted with the same value."""
        low = 0.0 if combine is summed else -math.inf
        fitted = tuple(self.fitted(part, -1 if part.dtype.is_integer else low) for part in parts)
        return pool_windows(fitted, combine, self.kernel, self.stride, self.dilation, self.out)


def _positions(x: Tensor) -> Tensor:
    """int64 (H, W) tensor holding each position's flat index h * W + w."""
    h, w = x.shape[-2:]
    return mv.reshape(Tensor(g.iota(h * w, dtypes.int64)), (h, w))


def max_pool2d(input: Tensor, kernel_size: IntPair, stride: IntPair | None = None, padding: IntPair = 0,
               dilation: IntPair = 1, ceil_mode: bool = False, return_indices: bool = False) -> Tensor | tuple:
    return _max_pool("max_pool2d", input, kernel_size, stride, padding, dilation, ceil_mode, return_indices)


def _max_pool(op: str, input: Tensor, kernel_size: IntPair, stride: IntPair | None, padding: IntPair,
              dilation: IntPair, ceil_mode: bool, return_indices: bool) -> Tensor | tuple:
    """Window maxima (padding is -inf, NaN propagates), picked by `first_maximum` where a gradient or the indices
    are wanted, so that, as in torch, the gradient goes to the first maximum of a window rather than being shared
    among ties (`larger` otherwise: the same values); return_indices also gives each maximum's flat position
    h * W + w in the input."""
    geometry = PoolGeometry(op, input, kernel_size, stride, padding, dilation, ceil_mode)
    parts = (geometry.pad(input, -math.inf),)
    if return_indices:
        parts += (expand_to(geometry.pad(_positions(input), -1), parts[0].shape),)
    parts = geometry.reduce(parts, first_maximum if return_indices or input.requires_grad else larger)
    return parts if return_indices else parts[0]


Parts = tuple[Tensor, ...]
"""What a window reduction carries per position: its value, and for a maximum with indices the input position."""
Combine = Callable[[Parts, Parts], Parts]
"""Combines the reductions of two runs of taps, the earlier run first."""


def first_maximum(earlier: Parts, later: Parts) -> Parts:
    """The larger of two maxima (with their positions, if carried), the earlier one on ties; NaN counts as the
    largest and the earlier NaN wins, as argmax picks the first maximum."""
    a, b = earlier[0], later[0]
    later_wins = ew.logical_or(ew.gt(b, a), ew.logical_and(ew.isnan(b), ew.logical_not(ew.isnan(a))))
    return tuple(ew.where(later_wins, y, x) for x, y in zip(earlier, later))


def larger(earlier: Parts, later: Parts) -> Parts:
    """The larger of two maxima without positions (NaN propagates): one operation per tap, where no gradient must
    pick the first of tied maxima."""
    return (ew.maximum(earlier[0], later[0]),)


def summed(earlier: Parts, later: Parts) -> Parts:
    return tuple(ew.add(x, y) for x, y in zip(earlier, later))


STORED_COMBINES = {"larger": larger, "summed": summed}
"""The combines of one value whose results a separable window stores, by name (a composite's parameter)."""


def _shifted(parts: Parts, dim: int, start: int, length: int) -> Parts:
    return tuple(mv.shrink_dim(t, dim, start, start + length) for t in parts)


def _reduce_windows_along(parts: Parts, combine: Combine, dim: int, kernel: int, stride: int, dilation: int,
                          out: int) -> Parts:
    """The windows along `dim` reduced: spans of 1, 2, 4, ... taps at every position, each two halves combined,
    then each window as the spans of `kernel`'s binary digits in tap order, at every `stride`-th position."""
    size = parts[0].shape[dim]
    spans = {1: parts}
    width = 1
    while 2 * width <= kernel:
        reach = size - (2 * width - 1) * dilation
        half = spans[width]
        spans[2 * width] = combine(_shifted(half, dim, 0, reach), _shifted(half, dim, width * dilation, reach))
        width *= 2
    positions = (out - 1) * stride + 1
    result, start = None, 0
    for width in sorted((w for w in spans if kernel & w), reverse=True):
        part = _shifted(spans[width], dim, start * dilation, positions)
        result = part if result is None else combine(result, part)
        start += width
    return tuple(mv.slice_dim(t, dim, 0, positions, stride) for t in result)


def pool_windows(parts: Parts, combine: Combine, kernel: Sequence[int], stride: Sequence[int],
                 dilation: Sequence[int], out: Sequence[int]) -> Parts:
    """The windows over the trailing len(kernel) dims of `parts` (padded as far as the last window reaches)
    reduced by `combine`, one dim after another (a box window is separable), the last dim first: with
    `first_maximum`, the first maximum in the window's row-major order wins, as argmax over the window would pick.
    Along a dim, the strided views its taps see are combined in tap order; a long window (`long_window`) by
    doubling instead. A `separable` window's `larger` or `summed` (whose order is free) goes the first dim first
    instead, each dim's results but the last's stored (`STORED_WINDOWS`: computed once each, a plane or a row at a
    time in the kernel reading them, `lower.Lowering._staged_block`): the columns' loads are contiguous and only
    the last dim loads at its stride, from an array in L1. `first_maximum`'s row results get their buffers from the
    scheduler (each tap costs several operations: `lower.WINDOW_RECOMPUTE_LETS`)."""
    first = parts[0].ndim - len(kernel)
    along = _reduce_windows_along if long_window(kernel) else _combine_taps_along
    name = next((name for name, stored_combine in STORED_COMBINES.items() if stored_combine is combine), None)
    stored = along is _combine_taps_along and name is not None and separable(kernel, stride, dilation)
    dims = list(reversed(range(len(kernel))))
    if stored:  # a plain maximum or sum in any order: down the columns first, each load contiguous
        dims.reverse()
    for i in dims:
        window = dict(dim=first + i, kernel=kernel[i], stride=stride[i], dilation=dilation[i], out=out[i])
        if stored and i != dims[-1]:
            parts = (apply_composite(STORED_WINDOWS, parts[0], combine=name, **window),)
        else:
            parts = along(parts, combine, **window)
    return parts


def _combine_taps_along(parts: Parts, combine: Combine, dim: int, kernel: int, stride: int, dilation: int,
                        out: int) -> Parts:
    """The windows along `dim` as the chain of the strided views of their taps, combined in tap order."""
    count = (out - 1) * stride + 1
    taps = [tuple(mv.slice_dim(t, dim, j * dilation, j * dilation + count, stride) for t in parts)
            for j in range(kernel)]
    return functools.reduce(combine, taps)


SEPARABLE_MIN_TAPS = 9
"""Windows of at least this many taps over two or more dims (3 x 3) are `separable` where they overlap."""


def separable(kernel: Sequence[int], stride: Sequence[int], dilation: Sequence[int]) -> bool:
    """Whether a window is reduced one dim at a time, each dim's results stored for the next (`pool_windows`):
    windows of at least SEPARABLE_MIN_TAPS over two or more dims that overlap along a dim before the last, so that
    several windows share each stored result. A 3 x 3 window at stride 1 then loads 3 + 3 taps per output instead
    of 9 (bench/NOTES.md)."""
    reach = [d * (k - 1) + 1 for k, d in zip(kernel, dilation)]
    return (sum(k > 1 for k in kernel) > 1 and math.prod(kernel) >= SEPARABLE_MIN_TAPS
            and any(s < r for s, r in zip(stride[:-1], reach[:-1])))


def _along_infer(x: Tensor, *, combine: str, dim: int, kernel: int, stride: int, dilation: int,
                out: int) -> tuple:
    return x.dtype, x.shape[:dim] + (out,) + x.shape[dim + 1 :]


def _along_decomposition(x: Tensor, *, combine: str, dim: int, kernel: int, stride: int, dilation: int,
                        out: int) -> Tensor:
    return _combine_taps_along((x,), STORED_COMBINES[combine], dim, kernel, stride, dilation, out)[0]


STORED_WINDOWS = register(Composite("pool_windows_along", _along_infer, _along_decomposition, stored=True))
"""The windows along one dim combined (`_combine_taps_along` by a STORED_COMBINES name), stored: a separable
window's partial results, computed once each (staged in the kernel of the windows of the next dim, which read
them, where that kernel walks them a plane or a row at a time; else in a buffer)."""


def avg_pool2d(input: Tensor, kernel_size: IntPair, stride: IntPair | None = None, padding: IntPair = 0,
               ceil_mode: bool = False, count_include_pad: bool = True, divisor_override: int | None = None) -> Tensor:
    return _avg_pool("avg_pool2d", input, kernel_size, stride, padding, ceil_mode, count_include_pad,
                     divisor_override)


def _avg_pool(op: str, input: Tensor, kernel_size: IntPair, stride: IntPair | None, padding: IntPair,
              ceil_mode: bool, count_include_pad: bool, divisor_override: int | None) -> Tensor:
    """Window sums over the zero-padded input divided by the window size: the whole window within the padded
    input (count_include_pad) or only its input elements (counted once, while tracing: constants), or
    divisor_override."""
    geometry = PoolGeometry(op, input, kernel_size, stride, padding, 1, ceil_mode)
    (sums,) = geometry.reduce((geometry.pad(input, 0.0),), summed)
    if divisor_override is not None:
        if divisor_override == 0:
            fail(op, "divisor must be not zero", kind=ArgumentError)
        return ew.div(sums, divisor_override)
    ones = Tensor(g.const(1.0, input.dtype, input.shape[-2:]))
    counted = geometry.pad(ones, 1.0 if count_include_pad else 0.0)
    (counts,) = geometry.reduce((counted,), summed)
    (values,) = REFERENCE.evaluate([counts.node])
    return ew.div(sums, Tensor.from_numpy(np.asarray(values), input.dtype))


def _as_rows(op: str, input: Tensor, **sizes: IntPair | None) -> tuple[Tensor, dict[str, tuple[int, int] | None]]:
    """A 1-d pooling as a 2-d one over rows of height 1: (N, C, L) -> (N, C, 1, L) and each size k -> (1, k)
    (padding p -> (0, p)); None stays None."""
    if input.ndim not in (2, 3):
        fail(op, f"expected 2D or 3D (batch mode) input, got input of size {input.shape}")
    rows: dict[str, tuple[int, int] | None] = {}
    for name, value in sizes.items():
        values = None if value is None else ints_arg(op, name, value)
        if values is not None and len(values) != 1:
            fail(op, f"{name} must be an int or a tuple of one int, got {value!r}", kind=ArgumentError)
        rows[name] = None if values is None else (0 if name == "padding" else 1, values[0])
    return mv.unsqueeze(input, -2), rows


def max_pool1d(input: Tensor, kernel_size: IntPair, stride: IntPair | None = None, padding: IntPair = 0,
               dilation: IntPair = 1, ceil_mode: bool = False, return_indices: bool = False) -> Tensor | tuple:
    """max_pool2d over rows of height 1; the indices are positions along L."""
    stride = None if stride == [] else stride
    x, a = _as_rows("max_pool1d", input, kernel_size=kernel_size, stride=stride, padding=padding, dilation=dilation)
    out = _max_pool("max_pool1d", x, a["kernel_size"], a["stride"], a["padding"], a["dilation"], ceil_mode,
                    return_indices)
    return tuple(mv.squeeze(t, -2) for t in out) if return_indices else mv.squeeze(out, -2)


def avg_pool1d(input: Tensor, kernel_size: IntPair, stride: IntPair | None = None, padding: IntPair = 0,
               ceil_mode: bool = False, count_include_pad: bool = True) -> Tensor:
    stride = None if stride == [] else stride
    x, a = _as_rows("avg_pool1d", input, kernel_size=kernel_size, stride=stride, padding=padding)
    out = _avg_pool("avg_pool1d", x, a["kernel_size"], a["stride"], a["padding"], ceil_mode, count_include_pad, None)
    return mv.squeeze(out, -2)


def _lp_pool(input: Tensor, norm_type: float, window: int, average: Callable[[Tensor], Tensor],
             maximum: Callable[[Tensor], Tensor]) -> Tensor:
    """The p-norm of each window, (window * mean of x^p)^(1/p), as torch; p = +-inf is the max/min of |x|."""
    if norm_type == math.inf:
        return maximum(ew.abs(input))
    if norm_type == -math.inf:
        return ew.neg(maximum(ew.neg(ew.abs(input))))
    return ew.pow(ew.mul(average(ew.pow(input, norm_type)), window), 1.0 / norm_type)


def lp_pool1d(input: Tensor, norm_type: float, kernel_size: IntPair, stride: IntPair | None = None,
              ceil_mode: bool = False) -> Tensor:
    (window,) = ints_arg("lp_pool1d", "kernel_size", kernel_size)
    return _lp_pool(input, norm_type, window, lambda x: avg_pool1d(x, kernel_size, stride, 0, ceil_mode),
                    lambda x: max_pool1d(x, kernel_size, stride, 0, 1, ceil_mode))


def lp_pool2d(input: Tensor, norm_type: float, kernel_size: IntPair, stride: IntPair | None = None,
              ceil_mode: bool = False) -> Tensor:
    window = math.prod(tuple_of("lp_pool2d", "kernel_size", kernel_size, 2))
    return _lp_pool(input, norm_type, window, lambda x: avg_pool2d(x, kernel_size, stride, 0, ceil_mode),
                    lambda x: max_pool2d(x, kernel_size, stride, 0, 1, ceil_mode))


def _adaptive_windows(x: Tensor, dim: int, out_size: int) -> tuple[Tensor, Tensor, np.ndarray]:
    """torch's adaptive windows [floor(i * n / out), ceil((i + 1) * n / out)) along `dim`, gathered as
    (out_size, longest window); with the mask of the elements that belong (the short windows' surplus repeats
    their first element) and each window's length."""
    n = x.shape[dim]
    starts = np.array([i * n // out_size for i in range(out_size)])
    ends = np.array([-(-(i + 1) * n // out_size) for i in range(out_size)])
    longest = int((ends - starts).max())
    offsets = starts[:, None] + np.arange(longest)[None, :]
    valid = offsets < ends[:, None]
    index = Tensor.from_numpy(np.where(valid, offsets, starts[:, None]).reshape(-1).astype(np.int64))
    gathered = mv.index_select(x, dim, index)
    gathered = mv.reshape(gathered, x.shape[:dim] + (out_size, longest) + x.shape[dim + 1 :])
    trailing = (1,) * (x.ndim - dim - 1)
    return gathered, Tensor.from_numpy(valid.reshape((out_size, longest) + trailing)), ends - starts


def _adaptive_mean(x: Tensor, dim: int, out_size: int) -> Tensor:
    """Mean over each adaptive window, the surplus masked out (so NaN stays in its window)."""
    gathered, mask, lengths = _adaptive_windows(x, dim, out_size)
    trailing = (1,) * (x.ndim - dim - 1)
    counts = Tensor.from_numpy(lengths.reshape((out_size,) + trailing).astype(x.dtype.storage), x.dtype)
    return ew.div(rd.sum(ew.where(mask, gathered, 0.0), dim + 1), counts)


def _adaptive_max(x: Tensor, dim: int, out_size: int) -> Tensor:
    """Maximum of each adaptive window, picked by argmax (NaN propagates, the gradient goes to the first
    maximum) as max_pool2d does."""
    gathered, mask, _ = _adaptive_windows(x, dim, out_size)
    masked = ew.where(mask, gathered, -math.inf)
    best = mv.unsqueeze(rd.argmax(masked, dim + 1), dim + 1)
    return mv.squeeze(mv.gather(masked, dim + 1, best), dim + 1)


def _adaptive_pool(op: str, input: Tensor, output_size: Any, spatial: int,
                   along: Callable[[Tensor, int, int], Tensor]) -> Tensor:
    """Separable windows: reducing each spatial dim in turn (`along(x, dim, size)`) reduces the whole window."""
    if input.ndim not in (spatial + 1, spatial + 2) or 0 in input.shape[-spatial - 1 :]:
        fail(op, f"expected {spatial + 1}D or {spatial + 2}D input with non-zero non-batch dims, got {input.shape}")
    require_float(op, input=input)
    given = (output_size,) * spatial if output_size is None or isinstance(output_size, int) else tuple(output_size)
    if len(given) != spatial:
        fail(op, f"output_size must be an int or {spatial} sizes, got {output_size!r}", kind=ArgumentError)
    out = input
    for i, size in enumerate(given):
        dim = input.ndim - spatial + i
        out = along(out, dim, input.shape[dim] if size is None else int_arg(op, "output_size", size))
    return out


def adaptive_avg_pool1d(input: Tensor, output_size: IntPair) -> Tensor:
    return _adaptive_pool("adaptive_avg_pool1d", input, output_size, 1, _adaptive_mean)


def adaptive_avg_pool2d(input: Tensor, output_size: IntPair | Sequence[int | None]) -> Tensor:
    return _adaptive_pool("adaptive_avg_pool2d", input, output_size, 2, _adaptive_mean)


def _no_indices(op: str, return_indices: bool) -> None:
    if return_indices:
        fail(op, "return_indices is not supported for adaptive max pooling; use max_pool with return_indices",
             kind=UnsupportedError)


def adaptive_max_pool1d(input: Tensor, output_size: IntPair, return_indices: bool = False) -> Tensor:
    _no_indices("adaptive_max_pool1d", return_indices)
    return _adaptive_pool("adaptive_max_pool1d", input, output_size, 1, _adaptive_max)


def adaptive_max_pool2d(input: Tensor, output_size: IntPair | Sequence[int | None],
                        return_indices: bool = False) -> Tensor:
    _no_indices("adaptive_max_pool2d", return_indices)
    return _adaptive_pool("adaptive_max_pool2d", input, output_size, 2, _adaptive_max)
