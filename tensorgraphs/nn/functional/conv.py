"""Convolutions: the conv2d composite (conv1d and conv_transpose1d/2d are built on it), the window views
of conv and unfold (with the window sizes pooling shares), and unfold/fold (im2col and its adjoint).

conv2d decomposes into one strided slice of the padded input per kernel offset
(SHRINK/PAD/RESHAPE views), stacked into columns and contracted with the
weights by the `matmul` composite, so the gradients are matmuls too; a depthwise
conv2d sums the slices times their weights instead.
"""

from __future__ import annotations

import math
from typing import Sequence

from tensorgraphs import dtypes
from tensorgraphs.errors import ArgumentError, fail
from tensorgraphs.frontend import elementwise as ew
from tensorgraphs.frontend import linalg
from tensorgraphs.frontend import movement as mv
from tensorgraphs.frontend import reduce as rd
from tensorgraphs.frontend.autocast import LOWER, autocast_op
from tensorgraphs.frontend.tensor import Tensor, apply_composite, cast, expand_to
from tensorgraphs.graph.composite import Composite, register
from tensorgraphs.nn.functional.arguments import require_float, require_same_dtype, tuple_of

Pads = tuple[tuple[int, int], ...]  # (before, after) per spatial dim


# ---------------------------------------------------------------------------
# window views (pooling shares the sizes and `long_window`)
# ---------------------------------------------------------------------------


def window_count(size: int, kernel: int, stride: int, dilation: int) -> int:
    return (size - dilation * (kernel - 1) - 1) // stride + 1


def pad_spatial(x: Tensor, pads: Pads, value: float = 0.0) -> Tensor:
    """Pad (negative widths crop) the trailing len(pads) dims."""
    first = x.ndim - len(pads)
    for offset, (before, after) in enumerate(pads):
        x = mv.pad_dim(x, first + offset, before, after, value)
    return x


def window_views(x: Tensor, kernel: Sequence[int], stride: Sequence[int], dilation: Sequence[int]) -> list[Tensor]:
    """(..., H, W) -> for each kernel offset (row-major), the strided (..., Ho, Wo) slice it sees."""
    (kh, kw), (sh, sw), (dh, dw) = kernel, stride, dilation
    ho = window_count(x.shape[-2], kh, sh, dh)
    wo = window_count(x.shape[-1], kw, sw, dw)
    return [x[..., i * dh : i * dh + sh * (ho - 1) + 1 : sh, j * dw : j * dw + sw * (wo - 1) + 1 : sw]
            for i in range(kh) for j in range(kw)]


LONG_WINDOW_TAPS = 64
"""Windows of more taps than this are not built one view per tap: a kernel with a term per tap takes gcc about the
cube of its loads to compile (200 taps: ~90 s, bench/NOTES.md), and its lowering and gradient grow alike. Pooling
reduces them by doubling (`pooling.pool_windows`); convolution and unfold take them by movement alone
(`unfolded_windows`)."""


def long_window(kernel: Sequence[int]) -> bool:
    """Whether a window of `kernel` has more than `LONG_WINDOW_TAPS` taps."""
    return math.prod(kernel) > LONG_WINDOW_TAPS


def sliding_windows(x: Tensor, kernel: Sequence[int], stride: Sequence[int], dilation: Sequence[int]) -> Tensor:
    """(..., H, W) -> (..., kh * kw, Ho, Wo): the window views stacked as views (`stack_views`), or for a long
    window `unfolded_windows`."""
    if long_window(kernel):
        return unfolded_windows(x, kernel, stride, dilation)
    return mv.stack_views(window_views(x, kernel, stride, dilation), dim=-3)


def unfolded_windows(x: Tensor, kernel: Sequence[int], stride: Sequence[int], dilation: Sequence[int]) -> Tensor:
    """(..., H, W) -> (..., kh * kw, Ho, Wo) in a constant number of movement ops, whatever the kernel (its
    gradient too: they are sums, pads and reshapes): each spatial dim is unfolded by `_unfold_last`."""
    (kh, kw), (sh, sw), (dh, dw) = kernel, stride, dilation
    columns = _unfold_last(x, kw, sw, dw)  # (..., H, kw, Wo)
    rows = _unfold_last(mv.movedim(columns, -3, -1), kh, sh, dh)  # (..., kw, Wo, kh, Ho)
    nd = rows.ndim
    windows = mv.permute(rows, (*range(nd - 4), nd - 2, nd - 4, nd - 1, nd - 3))  # (..., kh, kw, Ho, Wo)
    return mv.reshape(windows, (*windows.shape[:-4], kh * kw, *windows.shape[-2:]))


def folded_windows(windows: Tensor, size: Sequence[int], kernel: Sequence[int], stride: Sequence[int],
                   dilation: Sequence[int]) -> Tensor:
    """The adjoint of `unfolded_windows`: (..., kh * kw, Ho, Wo) -> (..., H, W) of `size`, each window's elements
    summed where they were read, in a constant number of movement ops and one sum per dim (`_fold_last`)."""
    (kh, kw), (sh, sw), (dh, dw) = kernel, stride, dilation
    split = mv.reshape(windows, (*windows.shape[:-3], kh, kw, *windows.shape[-2:]))
    nd = split.ndim
    rows = mv.permute(split, (*range(nd - 4), nd - 3, nd - 1, nd - 4, nd - 2))  # (..., kw, Wo, kh, Ho)
    columns = mv.movedim(_fold_last(rows, size[0], sh, dh), -1, -3)  # (..., H, kw, Wo)
    return _fold_last(columns, size[1], sw, dw)


def _unfold_last(x: Tensor, kernel: int, stride: int, dilation: int) -> Tensor:
    """(..., L) -> (..., kernel, out): row i holds the window elements at tap i, x[i * dilation + t * stride].
    x repeated end to end and read as rows of L + dilation elements starts row i at x[i * dilation] (the tinygrad
    pool's trick); every `stride`-th column of the rows are the windows."""
    last, length, out = x.ndim - 1, x.shape[-1], window_count(x.shape[-1], kernel, stride, dilation)
    if kernel == 1:
        rows = mv.unsqueeze(x, last)
    else:
        row, lead = length + dilation, x.shape[:-1]
        repeated = expand_to(mv.unsqueeze(x, last), (*lead, -(-kernel * row // length), length))
        rows = mv.reshape(mv.shrink_dim(mv.reshape(repeated, (*lead, -1)), last, 0, kernel * row),
                          (*lead, kernel, row))
    return mv.slice_dim(rows, last + 1, 0, stride * (out - 1) + 1, stride)


def _fold_last(windows: Tensor, length: int, stride: int, dilation: int) -> Tensor:
    """The adjoint of `_unfold_last`: (..., kernel, out) -> (..., length), tap i's element t added into
    x[i * dilation + t * stride]: each row spread to its stride (`zero_dilate`), the rows laid end to end
    L + dilation elements apart, and the repeats of x summed."""
    kernel, last, lead = windows.shape[-2], windows.ndim - 2, windows.shape[:-2]
    spread = zero_dilate(windows, last + 1, stride)
    if kernel == 1:
        return mv.pad_dim(mv.squeeze(spread, last), last, 0, length - spread.shape[-1])
    row = length + dilation
    repeats = -(-kernel * row // length)
    rows = mv.pad_dim(spread, last + 1, 0, row - spread.shape[-1])
    flat = mv.pad_dim(mv.reshape(rows, (*lead, kernel * row)), last, 0, repeats * length - kernel * row)
    return rd.sum(mv.reshape(flat, (*lead, repeats, length)), last)


# ---------------------------------------------------------------------------
# the conv2d composite
# ---------------------------------------------------------------------------


def _conv2d_infer(x: Tensor, w: Tensor, *, stride: tuple, padding: Pads, dilation: tuple, groups: int,
                  float32_sum: bool = False) -> tuple:
    sizes = tuple(window_count(x.shape[2 + i] + sum(padding[i]), w.shape[2 + i], stride[i], dilation[i])
                  for i in range(2))
    return dtypes.float32 if float32_sum else x.dtype, (x.shape[0], w.shape[0]) + sizes


def _conv2d_decomposition(x: Tensor, w: Tensor, *, stride: tuple, padding: Pads, dilation: tuple,
                          groups: int, float32_sum: bool = False) -> Tensor:
    """Kernels (groups, O/groups, C/groups*kh*kw) @ columns (N, groups, C/groups*kh*kw, Ho*Wo): the columns are the
    window views stacked as they lie (a 1x1 conv's are x itself) and the product comes out in the output's layout,
    so nothing is transposed. A depthwise conv (one input channel per group) is `_depthwise_sum` instead. With
    `float32_sum` float16/bfloat16 operands give the float32 sum unrounded (their products are exact in float32):
    columns and kernels keep their dtype and are widened as the product reads them."""
    n, out_channels, (kh, kw) = x.shape[0], w.shape[0], w.shape[2:]
    padded = pad_spatial(x, padding)
    if long_window((kh, kw)):
        windows = unfolded_windows(padded, (kh, kw), stride, dilation)
    else:
        views = window_views(padded, (kh, kw), stride, dilation)
        if groups > 1 and w.shape[1] == 1:
            return _depthwise_sum(views, w, float32_sum)
        windows = mv.stack(views, dim=2)
    ho, wo = windows.shape[-2:]
    columns = mv.reshape(windows, (n, groups, w.shape[1] * kh * kw, ho * wo))
    kernels = mv.reshape(w, (groups, out_channels // groups, w.shape[1] * kh * kw))
    if float32_sum:  # widened after the broadcast, as the product reads them
        kernels = expand_to(kernels, (n, *kernels.shape))
        columns, kernels = cast(columns, dtypes.float32), cast(kernels, dtypes.float32)
    return mv.reshape(linalg.matmul(kernels, columns), (n, out_channels, ho, wo))


def _depthwise_sum(views: list[Tensor], w: Tensor, float32_sum: bool) -> Tensor:
    """A depthwise conv as one elementwise loop: the sum over kernel offsets of each (N, C, Ho, Wo) window view
    times its weight per output channel (output channel o reads input channel o // (O / C)), in float32 for
    float16/bfloat16 (rounded once at the end unless `float32_sum`), as the product would sum."""
    n, channels, ho, wo = views[0].shape
    out_channels = w.shape[0]
    wide = dtypes.float32 if w.dtype in (dtypes.float16, dtypes.bfloat16) else w.dtype
    weights = mv.reshape(cast(w, wide), (1, out_channels, len(views), 1, 1))
    total = None
    for k, view in enumerate(views):
        if out_channels != channels:
            spread = (n, channels, out_channels // channels, ho, wo)
            view = mv.reshape(expand_to(mv.unsqueeze(view, 2), spread), (n, out_channels, ho, wo))
        term = ew.mul(cast(view, wide), mv.squeeze(mv.shrink_dim(weights, 2, k, k + 1), 2))
        total = term if total is None else ew.add(total, term)
    return total if float32_sum else cast(total, w.dtype)


CONV2D = register(Composite("conv2d", _conv2d_infer, _conv2d_decomposition))


# ---------------------------------------------------------------------------
# public convolutions
# ---------------------------------------------------------------------------


def _resolve_padding(op: str, padding: int | Sequence[int] | str, kernel: tuple, stride: tuple,
                     dilation: tuple) -> Pads:
    """Explicit sizes pad both sides; 'valid' is none; 'same' keeps the size (the odd extra goes after)."""
    n = len(kernel)
    if isinstance(padding, str):
        if padding == "valid":
            return ((0, 0),) * n
        if padding != "same":
            fail(op, f"invalid padding string {padding!r}, should be one of {{'valid', 'same'}}", kind=ArgumentError)
        if any(s != 1 for s in stride):
            fail(op, "padding='same' is not supported for strided convolutions", kind=ArgumentError)
        totals = [d * (k - 1) for k, d in zip(kernel, dilation)]
        return tuple((t // 2, t - t // 2) for t in totals)
    return tuple((p, p) for p in tuple_of(op, "padding", padding, n, minimum=0))


def _check_conv_operands(op: str, input: Tensor, weight: Tensor, bias: Tensor | None, n: int) -> None:
    if input.ndim not in (n + 1, n + 2):
        fail(op, f"expected {n + 1}D (unbatched) or {n + 2}D (batched) input, but got input of size {input.shape}")
    if weight.ndim != n + 2:
        fail(op, f"expected a {n + 2}D weight, got weight of size {weight.shape}")
    require_float(op, input=input)
    require_same_dtype(op, input=input, weight=weight, bias=bias)


def _check_output_size(op: str, input: Tensor, out_sizes: Sequence[int]) -> None:
    if any(s <= 0 for s in out_sizes):
        fail(op, f"calculated output size {tuple(out_sizes)} for input of size {input.shape} is too small")


def _biased_conv2d(op: str, x: Tensor, weight: Tensor, bias: Tensor | None, stride: tuple, pads: Pads,
                   dilation: tuple, groups: int) -> Tensor:
    """The conv2d composite plus the bias over channels. float16/bfloat16 convolutions sum the products and the
    bias in float32 and round once, as torch's cpu convolutions do (rounding the product, then its sum with the
    bias, would round twice)."""
    if bias is not None and bias.shape != (weight.shape[0],):
        fail(op, f"expected bias of shape ({weight.shape[0]},), got {bias.shape}")
    half = x.dtype in (dtypes.float16, dtypes.bfloat16)
    out = conv2d_composite(op, x, weight, stride, pads, dilation, groups, float32_sum=half and bias is not None)
    if bias is None:
        return out
    out = ew.add(out, mv.reshape(cast(bias, out.dtype), (weight.shape[0], 1, 1)))
    return cast(out, x.dtype)


def conv_nd(op: str, input: Tensor, weight: Tensor, bias: Tensor | None, stride: int | Sequence[int],
            padding: int | Sequence[int] | str, dilation: int | Sequence[int], groups: int, n: int) -> Tensor:
    """conv1d/conv2d: checks, then the conv2d composite (1-D convolutions get a size-1 height)."""
    _check_conv_operands(op, input, weight, bias, n)
    batched = input.ndim == n + 2
    x = input if batched else mv.unsqueeze(input, 0)
    if groups <= 0 or weight.shape[0] % groups:
        fail(op, f"groups must be positive and divide out_channels, got groups={groups} and weight of size "
             f"{weight.shape}", kind=ArgumentError)
    if x.shape[1] != weight.shape[1] * groups:
        fail(op, f"given groups={groups}, weight of size {weight.shape}, expected input {input.shape} to have "
             f"{weight.shape[1] * groups} channels, but got {x.shape[1]} channels instead")
    stride = tuple_of(op, "stride", stride, n)
    dilation = tuple_of(op, "dilation", dilation, n)
    pads = _resolve_padding(op, padding, weight.shape[2:], stride, dilation)
    if n == 1:
        x, weight = mv.unsqueeze(x, 2), mv.unsqueeze(weight, 2)
        stride, dilation, pads = (1,) + stride, (1,) + dilation, ((0, 0),) + pads
    out = _biased_conv2d(op, x, weight, bias, stride, pads, dilation, groups)
    if n == 1:
        out = mv.squeeze(out, 2)
    return out if batched else mv.squeeze(out, 0)


def conv2d_composite(op: str, x: Tensor, weight: Tensor, stride: tuple, pads: Pads, dilation: tuple,
                     groups: int, float32_sum: bool = False) -> Tensor:
    _, shape = _conv2d_infer(x, weight, stride=stride, padding=pads, dilation=dilation, groups=groups)
    _check_output_size(op, x, shape[2:])
    wide = {"float32_sum": True} if float32_sum else {}  # absent when off: float32 convs keep their signature
    return apply_composite(CONV2D, x, weight, stride=stride, padding=pads, dilation=dilation, groups=groups, **wide)


@autocast_op(LOWER)
def conv1d(input: Tensor, weight: Tensor, bias: Tensor | None = None, stride: int | Sequence[int] = 1,
           padding: int | Sequence[int] | str = 0, dilation: int | Sequence[int] = 1, groups: int = 1) -> Tensor:
    return conv_nd("conv1d", input, weight, bias, stride, padding, dilation, groups, 1)


@autocast_op(LOWER)
def conv2d(input: Tensor, weight: Tensor, bias: Tensor | None = None, stride: int | Sequence[int] = 1,
           padding: int | Sequence[int] | str = 0, dilation: int | Sequence[int] = 1, groups: int = 1) -> Tensor:
    return conv_nd("conv2d", input, weight, bias, stride, padding, dilation, groups, 2)


def zero_dilate(x: Tensor, dim: int, factor: int) -> Tensor:
    """Insert factor - 1 zeros between neighbours along `dim`: size s becomes (s - 1) * factor + 1."""
    if factor == 1:
        return x
    size = x.shape[dim]
    spread = mv.pad_dim(mv.unsqueeze(x, dim + 1), dim + 1, 0, factor - 1)
    merged = mv.reshape(spread, x.shape[:dim] + (size * factor,) + x.shape[dim + 1 :])
    return mv.shrink_dim(merged, dim, 0, (size - 1) * factor + 1)


@autocast_op(LOWER)
def conv_transpose2d(input: Tensor, weight: Tensor, bias: Tensor | None = None, stride: int | Sequence[int] = 1,
                     padding: int | Sequence[int] = 0, output_padding: int | Sequence[int] = 0, groups: int = 1,
                     dilation: int | Sequence[int] = 1) -> Tensor:
    """The gradient of conv2d with respect to its input: a stride-1 conv2d of the zero-dilated, padded input
    with the kernels flipped and their in/out channels swapped."""
    op = "conv_transpose2d"
    _check_conv_operands(op, input, weight, bias, 2)
    x = input if input.ndim == 4 else mv.unsqueeze(input, 0)
    in_channels = weight.shape[0]
    if groups <= 0 or in_channels % groups:
        fail(op, f"groups must be positive and divide in_channels, got groups={groups} and weight of size "
             f"{weight.shape}", kind=ArgumentError)
    if x.shape[1] != in_channels:
        fail(op, f"weight of size {weight.shape} expects input {input.shape} to have {in_channels} channels, "
             f"but got {x.shape[1]} channels instead")
    stride, dilation = tuple_of(op, "stride", stride, 2), tuple_of(op, "dilation", dilation, 2)
    padding = tuple_of(op, "padding", padding, 2, minimum=0)
    output_padding = tuple_of(op, "output_padding", output_padding, 2, minimum=0)
    kernel = weight.shape[2:]
    for o, s, d in zip(output_padding, stride, dilation):
        if o >= max(s, d):
            fail(op, f"output padding {output_padding} must be smaller than either stride {stride} or dilation "
                 f"{dilation}", kind=ArgumentError)
    for i in range(2):
        x = zero_dilate(x, 2 + i, stride[i])
    reach = [d * (k - 1) for k, d in zip(kernel, dilation)]
    x = pad_spatial(x, tuple((r - p, r - p + o) for r, p, o in zip(reach, padding, output_padding)))
    out_per_group = weight.shape[1]
    flipped = mv.reshape(weight, (groups, in_channels // groups, out_per_group) + kernel)
    flipped = mv.reshape(mv.transpose(flipped, 1, 2), (groups * out_per_group, in_channels // groups) + kernel)
    flipped = mv.flip(flipped, (2, 3))
    out = _biased_conv2d(op, x, flipped, bias, (1, 1), ((0, 0), (0, 0)), dilation, groups)
    return out if input.ndim == 4 else mv.squeeze(out, 0)


@autocast_op(LOWER)
def conv_transpose1d(input: Tensor, weight: Tensor, bias: Tensor | None = None, stride: int | Sequence[int] = 1,
                     padding: int | Sequence[int] = 0, output_padding: int | Sequence[int] = 0, groups: int = 1,
                     dilation: int | Sequence[int] = 1) -> Tensor:
    """conv_transpose2d over rows of height 1: (N, C, L) -> (N, C, 1, L), each size k -> (1, k)."""
    op = "conv_transpose1d"
    if input.ndim not in (2, 3) or weight.ndim != 3:
        fail(op, f"expected a 2D or 3D input and a 3D weight, got {input.shape} and {weight.shape}")
    (s,), (p,), (o,), (d,) = (tuple_of(op, name, v, 1, minimum) for name, v, minimum in
                              (("stride", stride, 1), ("padding", padding, 0), ("output_padding", output_padding, 0),
                               ("dilation", dilation, 1)))
    out = conv_transpose2d(mv.unsqueeze(input, -2), mv.unsqueeze(weight, -2), bias, (1, s), (0, p), (0, o), groups,
                           (1, d))
    return mv.squeeze(out, -2)


def unfold(input: Tensor, kernel_size: int | Sequence[int], dilation: int | Sequence[int] = 1,
           padding: int | Sequence[int] = 0, stride: int | Sequence[int] = 1) -> Tensor:
    """im2col: (N, C, H, W) -> (N, C * kh * kw, L), one column per window, as torch."""
    op = "unfold"
    if input.ndim not in (3, 4):
        fail(op, f"expected a 3D or 4D input, got {input.shape}")
    kernel, dilation_ = tuple_of(op, "kernel_size", kernel_size, 2), tuple_of(op, "dilation", dilation, 2)
    pads, stride_ = tuple_of(op, "padding", padding, 2, minimum=0), tuple_of(op, "stride", stride, 2)
    windows = sliding_windows(pad_spatial(input, tuple((p, p) for p in pads)), kernel, stride_, dilation_)
    if 0 in windows.shape[-2:]:
        fail(op, f"the {kernel} windows do not fit the padded input of shape {input.shape}")
    return mv.reshape(windows, input.shape[:-3] + (input.shape[-3] * math.prod(kernel), -1))


def fold(input: Tensor, output_size: int | Sequence[int], kernel_size: int | Sequence[int],
         dilation: int | Sequence[int] = 1, padding: int | Sequence[int] = 0,
         stride: int | Sequence[int] = 1) -> Tensor:
    """col2im, the adjoint of unfold: (N, C * kh * kw, L) -> (N, C, H, W), overlapping windows summed. Each
    kernel offset's block is spread to its stride (zeros between), shifted into place and added; a long window
    (`long_window`) by `folded_windows`."""
    op = "fold"
    size, kernel = tuple_of(op, "output_size", output_size, 2), tuple_of(op, "kernel_size", kernel_size, 2)
    dilation_, stride_ = tuple_of(op, "dilation", dilation, 2), tuple_of(op, "stride", stride, 2)
    pads = tuple_of(op, "padding", padding, 2, minimum=0)
    padded = tuple(n + 2 * p for n, p in zip(size, pads))
    counts = tuple(window_count(n, k, s, d) for n, k, s, d in zip(padded, kernel, stride_, dilation_))
    windows = math.prod(kernel)
    if input.ndim not in (2, 3) or input.shape[-2] % windows or input.shape[-1] != math.prod(counts) or 0 in counts:
        fail(op, f"expected input of shape (N, C * {windows}, {math.prod(counts)}) for output_size {size}, "
             f"kernel_size {kernel}, dilation {dilation_}, padding {pads} and stride {stride_}, got {input.shape}")
    blocks = mv.reshape(input, input.shape[:-2] + (input.shape[-2] // windows, windows) + counts)
    if long_window(kernel):
        return pad_spatial(folded_windows(blocks, padded, kernel, stride_, dilation_), tuple((-p, -p) for p in pads))
    out = None
    for i in range(kernel[0]):
        for j in range(kernel[1]):
            block = blocks[..., i * kernel[1] + j, :, :]
            for axis in range(2):
                block = zero_dilate(block, block.ndim - 2 + axis, stride_[axis])
            start = (i * dilation_[0], j * dilation_[1])
            placed = pad_spatial(block, tuple((b, n - b - e) for b, n, e in zip(start, padded, block.shape[-2:])))
            out = placed if out is None else ew.add(out, placed)
    return pad_spatial(out, tuple((-p, -p) for p in pads))
