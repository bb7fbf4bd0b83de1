"""Reductions over dims, with PyTorch's dim/keepdim/dtype conventions."""

from __future__ import annotations

import math
from collections import namedtuple
from typing import Any, Sequence

from tensorgraphs import dtypes
from tensorgraphs.dtypes import DType
from tensorgraphs.errors import DTypeError, ShapeError, fail
from tensorgraphs.frontend import elementwise as ew
from tensorgraphs.frontend.autocast import FLOAT32, autocast_op
from tensorgraphs.frontend.tensor import (
    Tensor,
    apply,
    apply_composite,
    cast,
    expand_to,
    full_like_node,
    normalize_dim,
    normalize_dims,
)
from tensorgraphs.graph import node as g
from tensorgraphs.graph.composite import Composite, register
from tensorgraphs.graph.ops import Op

Dims = int | Sequence[int] | None
MinMax = namedtuple("MinMax", ["values", "indices"])


def _finish(t: Tensor, dims: tuple[int, ...], keepdim: bool) -> Tensor:
    """Reduced axes are kept as size 1 by the primitive; drop them unless keepdim."""
    if keepdim:
        return t
    shape = tuple(s for i, s in enumerate(t.shape) if i not in dims)
    return apply(Op.RESHAPE, t, arg=shape)


def _check_nonempty(op: str, x: Tensor, dims: tuple[int, ...]) -> None:
    for d in dims:
        if x.shape[d] == 0:
            fail(op, f"expected reduction dim {d} to have non-zero size (shape {x.shape})", kind=ShapeError)
    if not dims and x.numel() == 0:
        fail(op, "cannot reduce an empty tensor with no identity", kind=ShapeError)


def _accumulation_dtype(x: Tensor, dtype: DType | None) -> DType:
    if dtype is not None:
        return dtypes.to_dtype(dtype)
    return dtypes.int64 if x.dtype.is_bool or x.dtype.is_integer else x.dtype


def sum(x: Tensor, dim: Dims = None, keepdim: bool = False, *, dtype: Any = None) -> Tensor:
    dims = normalize_dims("sum", dim, x.ndim)
    out_dtype = _accumulation_dtype(x, dtype)
    wide = dtypes.float32 if out_dtype in (dtypes.float16, dtypes.bfloat16) else out_dtype
    reduced = apply(Op.REDUCE_SUM, cast(x, wide), arg=dims)
    return cast(_finish(reduced, dims, keepdim), out_dtype)


def mean(x: Tensor, dim: Dims = None, keepdim: bool = False, *, dtype: Any = None) -> Tensor:
    if dtype is None and not x.dtype.is_floating_point:
        fail("mean", f"mean needs a floating point input, got {x.dtype.name}; pass dtype= or call .float()",
             kind=DTypeError)
    dims = normalize_dims("mean", dim, x.ndim)
    count = math.prod(x.shape[d] for d in dims)
    total = sum(x, dims, keepdim, dtype=dtype)
    return ew.div(total, count) if count else ew.mul(total, math.nan)


def _max_along(x: Tensor, dims: tuple[int, ...]) -> Tensor:
    return apply(Op.REDUCE_MAX, x, arg=dims)


def amax(x: Tensor, dim: Dims = (), keepdim: bool = False) -> Tensor:
    dims = normalize_dims("amax", None if dim == () else dim, x.ndim)
    _check_nonempty("amax", x, dims)
    return _finish(_max_along(x, dims), dims, keepdim)


def amin(x: Tensor, dim: Dims = (), keepdim: bool = False) -> Tensor:
    dims = normalize_dims("amin", None if dim == () else dim, x.ndim)
    _check_nonempty("amin", x, dims)
    return _finish(_order_reversed(_max_along(_order_reversed(x), dims)), dims, keepdim)


def _order_reversed(x: Tensor) -> Tensor:
    """An order-reversing bijection: -x for floats, ~x for integers and bools."""
    return ew.neg(x) if x.dtype.is_floating_point else ew.bitwise_not(x)


def argmax(x: Tensor, dim: int | None = None, keepdim: bool = False) -> Tensor:
    """Index of the first maximum; NaN counts as the maximum, as in PyTorch."""
    if dim is None:
        return argmax(x.reshape(-1), 0, False) if not keepdim else argmax(x.reshape(-1), 0).reshape((1,) * x.ndim)
    d = normalize_dim("argmax", dim, x.ndim)
    if x.ndim == 0:
        return Tensor(g.const(0, dtypes.int64))
    _check_nonempty("argmax", x, (d,))
    top = expand_to(_max_along(x, (d,)), x.shape)
    is_top = ew.logical_or(ew.eq(x, top), ew.isnan(x)) if x.dtype.is_floating_point else ew.eq(x, top)
    n = x.shape[d]
    positions = _positions(x.shape, d)
    candidates = ew.where(is_top, positions, full_like_node(n, positions))
    first = ew.bitwise_not(_max_along(ew.bitwise_not(candidates), (d,)))
    return _finish(first, (d,), keepdim)


def argmin(x: Tensor, dim: int | None = None, keepdim: bool = False) -> Tensor:
    return argmax(_order_reversed(x), dim, keepdim)


def _positions(shape: tuple[int, ...], dim: int) -> Tensor:
    """int64 tensor of `shape` whose value is the index along `dim`."""
    line = Tensor(g.iota(shape[dim], dtypes.int64))
    view = tuple(s if i == dim else 1 for i, s in enumerate(shape))
    return expand_to(apply(Op.RESHAPE, line, arg=view), shape)


def max(x: Tensor, dim: Any = None, keepdim: bool = False) -> Any:
    """max() -> value; max(dim) -> (values, indices); max(other) -> maximum."""
    if isinstance(dim, Tensor):
        return ew.maximum(x, dim)
    if dim is None:
        return amax(x)
    return MinMax(amax(x, dim, keepdim), argmax(x, dim, keepdim))


def min(x: Tensor, dim: Any = None, keepdim: bool = False) -> Any:
    if isinstance(dim, Tensor):
        return ew.minimum(x, dim)
    if dim is None:
        return amin(x)
    return MinMax(amin(x, dim, keepdim), argmin(x, dim, keepdim))


@autocast_op(FLOAT32)
def prod(x: Tensor, dim: int | None = None, keepdim: bool = False, *, dtype: Any = None) -> Tensor:
    """Pairwise product tree: exact for integers, NaN and zeros propagate, gradients flow through MULs."""
    out_dtype = _accumulation_dtype(x, dtype)
    x = cast(x, out_dtype)
    if dim is None:
        result = prod(x.reshape(-1), 0)
        return result.reshape((1,) * x.ndim) if keepdim else result
    d = normalize_dim("prod", dim, x.ndim)
    if x.ndim == 0:
        return x
    moved = x.movedim(d, -1)
    n = moved.shape[-1]
    while n > 1:
        half = (n + 1) // 2
        if n % 2:
            moved = moved.pad_dim(-1, 0, 1, 1)
        moved = ew.mul(moved[..., :half], moved[..., half:])
        n = half
    if n == 0:
        moved = Tensor(g.const(1, out_dtype, moved.shape[:-1] + (1,)))
    result = moved.movedim(-1, d)
    return result if keepdim else result.squeeze(d)


def var(x: Tensor, dim: Dims = None, unbiased: bool | None = None, keepdim: bool = False, *,
        correction: float | None = None) -> Tensor:
    if correction is None:
        correction = 1 if unbiased is None or unbiased else 0
    dims = normalize_dims("var", dim, x.ndim)
    x = ew.to_float(x)
    centered = ew.sub(x, mean(x, dims, keepdim=True))
    count = math.prod(x.shape[d] for d in dims)
    total = sum(ew.mul(centered, centered), dims, keepdim)
    return ew.div(total, float(count - correction) if count - correction > 0 else 0.0)


def std(x: Tensor, dim: Dims = None, unbiased: bool | None = None, keepdim: bool = False, *,
        correction: float | None = None) -> Tensor:
    """sqrt(var); where var is 0 the gradient is 0 (as in PyTorch), not 0 * inf."""
    variance = var(x, dim, unbiased, keepdim, correction=correction)
    zero = ew.eq(variance, 0)
    return ew.where(zero, 0.0, ew.sqrt(ew.where(zero, 1.0, variance)))


def var_mean(x: Tensor, dim: Dims = None, *, correction: float = 1, keepdim: bool = False) -> tuple[Tensor, Tensor]:
    return var(x, dim, keepdim=keepdim, correction=correction), mean(x, dim, keepdim)


def logsumexp(x: Tensor, dim: Dims, keepdim: bool = False) -> Tensor:
    """max + log(sum(exp(x - max))); an infinite max is not subtracted (inf - inf would be NaN)."""
    x = ew.to_float(x)
    dims = normalize_dims("logsumexp", dim, x.ndim)
    if x.numel() == 0:
        return _finish(ew.log(apply(Op.REDUCE_SUM, ew.exp(x), arg=dims)), dims, keepdim)
    top = _max_along(x, dims)
    shift = ew.where(ew.isinf(top), full_like_node(0.0, top), top).detach()
    total = apply(Op.REDUCE_SUM, ew.exp(ew.sub(x, expand_to(shift, x.shape))), arg=dims)
    return _finish(ew.add(ew.log(total), shift), dims, keepdim)


def all(x: Tensor, dim: Dims = None, keepdim: bool = False) -> Tensor:
    """uint8 inputs give uint8 results, as in PyTorch; every other dtype gives bool."""
    result = ew.logical_not(any(ew.logical_not(x), dim, keepdim))
    return cast(result, dtypes.uint8) if x.dtype is dtypes.uint8 else result


def any(x: Tensor, dim: Dims = None, keepdim: bool = False) -> Tensor:
    dims = normalize_dims("any", dim, x.ndim)
    flags = ew.ne(x, 0) if not x.dtype.is_bool else x
    if x.numel() == 0:
        kept = tuple(1 if i in dims else s for i, s in enumerate(x.shape))
        result = _finish(Tensor(g.const(False, dtypes.bool_, kept)), dims, keepdim)
    else:
        result = _finish(_max_along(flags, dims), dims, keepdim)
    return cast(result, dtypes.uint8) if x.dtype is dtypes.uint8 else result


def count_nonzero(x: Tensor, dim: Dims = None) -> Tensor:
    return sum(ew.ne(x, 0), dim)


def norm(x: Tensor, p: Any = "fro", dim: Dims = None, keepdim: bool = False) -> Tensor:
    x = ew.to_float(x)
    if p in ("fro", 2, 2.0):
        return ew.sqrt(sum(ew.mul(x, x), dim, keepdim))
    if p in (math.inf, "inf"):
        return amax(ew.abs(x), () if dim is None else dim, keepdim)
    if p == -math.inf:
        return amin(ew.abs(x), () if dim is None else dim, keepdim)
    if p == 1:
        return sum(ew.abs(x), dim, keepdim)
    if p == 0:
        return sum(cast(ew.ne(x, 0), x.dtype), dim, keepdim)
    return ew.pow(sum(ew.pow(ew.abs(x), p), dim, keepdim), 1.0 / p)


def _scan_decomposition(x: Tensor, axis: int, combine: str) -> Tensor:
    """Inclusive scan in log2(n) steps (Hillis-Steele): x op= x shifted by 1, 2, 4, ..."""
    op, identity = (ew.add, 0) if combine == "add" else (ew.mul, 1)
    n = x.shape[axis]
    step = 1
    while step < n:
        head = [slice(None)] * x.ndim
        head[axis] = slice(0, n - step)
        x = op(x, x[tuple(head)].pad_dim(axis, step, 0, identity))
        step *= 2
    return x


def _reverse_cumsum(t: Tensor, axis: int) -> Tensor:
    return apply_composite(CUMSUM, t.flip(axis), axis=axis, combine="add").flip(axis)


def _cumsum_grad(out: Tensor, grad: Tensor, x: Tensor, axis: int, combine: str) -> tuple[Tensor]:
    """The gradient of a running sum is the running sum of the gradient from the end."""
    return (_reverse_cumsum(grad, axis),)


def _cumprod_grad(out: Tensor, grad: Tensor, x: Tensor, axis: int, combine: str) -> tuple[Tensor]:
    """d out_j / d x_k = prod_{i <= j, i != k} x_i, as torch computes it: before the first zero of a row that
    is out_j / x_k; at the first zero, the products with that zero replaced by 1; after it, 0."""
    zero = ew.eq(x, 0)
    zeros_so_far = apply_composite(CUMSUM, cast(zero, dtypes.int64), axis=axis, combine="add")
    first_zero = ew.logical_and(zero, ew.eq(zeros_so_far, 1))
    skipping_it = apply_composite(CUMPROD, ew.where(first_zero, full_like_node(1, x), x), axis=axis, combine="mul")
    at_zero = _reverse_cumsum(ew.mul(grad, skipping_it), axis)
    before = ew.div(_reverse_cumsum(ew.mul(grad, out), axis), ew.where(zero, full_like_node(1, x), x))
    after = full_like_node(0, x)
    return (ew.where(first_zero, at_zero, ew.where(ew.eq(zeros_so_far, 0), before, after)),)


_scan_infer = lambda x, axis, combine: (x.dtype, x.shape)  # noqa: E731
CUMSUM = register(Composite("cumsum", infer=_scan_infer, decompose=_scan_decomposition, grad=_cumsum_grad))
CUMPROD = register(Composite("cumprod", infer=_scan_infer, decompose=_scan_decomposition, grad=_cumprod_grad))
"""Inclusive scans along one axis: composites, so a backend can run them as one loop along the axis (the
`cpu` device does) instead of the log2(n) shifted copies of the decomposition."""


def _scan(op: str, composite: Composite, x: Tensor, dim: int) -> Tensor:
    """float16/bfloat16 accumulate in float32, each output rounded once, as torch on CPU."""
    d = normalize_dim(op, dim, x.ndim)
    if x.ndim == 0 or x.shape[d] <= 1:
        return x
    combine = "add" if composite is CUMSUM else "mul"
    return ew.in_float32_for_halves(lambda t: apply_composite(composite, t, axis=d, combine=combine), x)


def cumsum(x: Tensor, dim: int, *, dtype: Any = None) -> Tensor:
    x = cast(x, _accumulation_dtype(x, dtype))
    return _scan("cumsum", CUMSUM, x, dim)


def cumprod(x: Tensor, dim: int, *, dtype: Any = None) -> Tensor:
    x = cast(x, _accumulation_dtype(x, dtype))
    return _scan("cumprod", CUMPROD, x, dim)


