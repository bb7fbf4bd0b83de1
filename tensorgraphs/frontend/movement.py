"""Views (reshape, permute, slicing, ...) and the ops built from them (cat, pad, gather, ...).

Every function here builds movement primitives, which never copy: a backend
turns them into index expressions.
"""

from __future__ import annotations

import functools
import itertools
import math
from typing import Any, Sequence

from tensorgraphs import dtypes
from tensorgraphs.errors import ArgumentError, DTypeError, IndexingError, ShapeError, UnsupportedError, fail
from tensorgraphs.frontend import elementwise as ew
from tensorgraphs.frontend.autocast import FLOAT32, autocast_op
from tensorgraphs.frontend.checks import dims_arg, int_arg, ints_arg, size_arg
from tensorgraphs.frontend.tensor import (
    Tensor,
    apply,
    apply_composite,
    as_tensor,
    broadcast_shapes,
    cast,
    expand_to,
    normalize_dim,
    operands,
    viewing,
)
from tensorgraphs.graph import node as g
from tensorgraphs.graph.composite import Composite, register
from tensorgraphs.graph.ops import Op

ShapeArg = Any  # ints as varargs, or one sequence


@viewing
def reshape(x: Tensor, *shape: ShapeArg) -> Tensor:
    new = list(size_arg("reshape", shape, "shape"))
    if new.count(-1) > 1:
        fail("reshape", f"only one dimension can be inferred (-1), got shape {tuple(new)}")
    known = math.prod(s for s in new if s != -1)
    if -1 in new:
        if known == 0 or x.numel() % known:
            fail("reshape", f"shape {tuple(new)} is invalid for input of size {x.numel()}")
        new[new.index(-1)] = x.numel() // known
    if any(s < 0 for s in new) or math.prod(new) != x.numel():
        fail("reshape", f"shape {tuple(new)} is invalid for input of shape {x.shape} (size {x.numel()})")
    return apply(Op.RESHAPE, x, arg=tuple(new))


@viewing
def permute(x: Tensor, *dims: ShapeArg) -> Tensor:
    given = size_arg("permute", dims, "dims")
    order = tuple(normalize_dim("permute", d, x.ndim) for d in given)
    if sorted(order) != list(range(x.ndim)):
        fail("permute", f"dims {given} are not a permutation of the {x.ndim} dims of shape {x.shape}")
    return apply(Op.PERMUTE, x, arg=order) if x.ndim else x


@viewing
def transpose(x: Tensor, dim0: int, dim1: int) -> Tensor:
    if x.ndim == 0:
        return x
    a, b = normalize_dim("transpose", dim0, x.ndim), normalize_dim("transpose", dim1, x.ndim)
    order = list(range(x.ndim))
    order[a], order[b] = order[b], order[a]
    return apply(Op.PERMUTE, x, arg=tuple(order))


@viewing
def movedim(x: Tensor, source: int, destination: int) -> Tensor:
    s, d = normalize_dim("movedim", source, x.ndim), normalize_dim("movedim", destination, x.ndim)
    order = [i for i in range(x.ndim) if i != s]
    order.insert(d, s)
    return permute(x, order)


@viewing
def T(x: Tensor) -> Tensor:
    return permute(x, tuple(reversed(range(x.ndim))))


@viewing
def mT(x: Tensor) -> Tensor:
    if x.ndim < 2:
        fail("mT", f"expected a tensor with 2 or more dimensions, got shape {x.shape}")
    return transpose(x, -2, -1)


@viewing
def expand(x: Tensor, *sizes: ShapeArg) -> Tensor:
    target = size_arg("expand", sizes)
    if len(target) < x.ndim:
        fail("expand", f"the number of sizes {len(target)} must be >= the number of dims {x.ndim} (shape {x.shape})")
    lead = len(target) - x.ndim
    shape = tuple(x.shape[i - lead] if s == -1 and i >= lead else s for i, s in enumerate(target))
    for i, s in enumerate(x.shape):
        if s != 1 and shape[i + lead] != s:
            fail("expand", f"cannot expand shape {x.shape} to {target} (dim {i}: size {s} is not 1)")
    return expand_to(x, shape)


@viewing
def broadcast_to(x: Tensor, shape: Sequence[int]) -> Tensor:
    return expand(x, tuple(shape))


def broadcast_tensors(*tensors: Tensor) -> list[Tensor]:
    shape = broadcast_shapes("broadcast_tensors", *(t.shape for t in tensors))
    return [expand_to(t, shape) for t in tensors]


@viewing
def squeeze(x: Tensor, dim: int | Sequence[int] | None = None) -> Tensor:
    if dim is None:
        dims = {i for i, s in enumerate(x.shape) if s == 1}
    else:
        dims = {normalize_dim("squeeze", d, x.ndim) for d in dims_arg("squeeze", dim)}
        dims = {d for d in dims if d < x.ndim and x.shape[d] == 1}
    return apply(Op.RESHAPE, x, arg=tuple(s for i, s in enumerate(x.shape) if i not in dims))


@viewing
def unsqueeze(x: Tensor, dim: int) -> Tensor:
    d = normalize_dim("unsqueeze", dim, x.ndim + 1)
    return apply(Op.RESHAPE, x, arg=x.shape[:d] + (1,) + x.shape[d:])


@viewing
def flatten(x: Tensor, start_dim: int = 0, end_dim: int = -1) -> Tensor:
    if x.ndim == 0:
        return reshape(x, 1)
    s, e = normalize_dim("flatten", start_dim, x.ndim), normalize_dim("flatten", end_dim, x.ndim)
    if s > e:
        fail("flatten", f"start_dim {start_dim} comes after end_dim {end_dim}")
    return reshape(x, x.shape[:s] + (math.prod(x.shape[s : e + 1]),) + x.shape[e + 1 :])


@viewing
def unflatten(x: Tensor, dim: int, sizes: Sequence[int]) -> Tensor:
    d = normalize_dim("unflatten", dim, x.ndim)
    inner = reshape(Tensor(g.const(0, dtypes.bool_, (x.shape[d],))), size_arg("unflatten", (sizes,), "sizes")).shape
    return reshape(x, x.shape[:d] + inner + x.shape[d + 1 :])


def flip(x: Tensor, dims: int | Sequence[int]) -> Tensor:
    axes = tuple(normalize_dim("flip", d, x.ndim) for d in dims_arg("flip", dims))
    return apply(Op.FLIP, x, arg=axes) if x.ndim else x


def contiguous(x: Tensor) -> Tensor:
    return x


@viewing
def view(x: Tensor, *shape: Any) -> Tensor:
    """view(shape) reshapes; view(dtype) reinterprets the bits in torch, which only the same dtype can do here."""
    if len(shape) == 1 and not isinstance(shape[0], (int, tuple, list)) and not hasattr(shape[0], "__index__"):
        dtype = dtypes.to_dtype(shape[0])
        if dtype is not x.dtype:
            fail("view", f"view({dtype!r}) reinterprets the bits of {x.dtype!r} values, which tensorgraphs does not "
                 "do; use .to(dtype) to convert the values", kind=UnsupportedError)
        return x
    return reshape(x, *shape)


# ---------------------------------------------------------------------------
# slicing
# ---------------------------------------------------------------------------


def shrink_dim(x: Tensor, dim: int, start: int, stop: int) -> Tensor:
    bounds = tuple((start, stop) if i == dim else (0, s) for i, s in enumerate(x.shape))
    return apply(Op.SHRINK, x, arg=bounds)


def slice_dim(x: Tensor, dim: int, start: int, stop: int, step: int) -> Tensor:
    """x[start:stop:step] along `dim` (already normalized by slice.indices) from SHRINK/FLIP/PAD/RESHAPE."""
    n = x.shape[dim]
    if step < 0:
        x = flip(x, dim)
        start, stop, step = n - 1 - start, n - 1 - stop, -step
    length = max(0, (stop - start + step - 1) // step) if step > 0 else 0
    if length == 0:
        return shrink_dim(x, dim, 0, 0)
    x = shrink_dim(x, dim, start, start + (length - 1) * step + 1)
    if step == 1:
        return x
    x = pad_dim(x, dim, 0, length * step - x.shape[dim], 0)
    x = reshape(x, x.shape[:dim] + (length, step) + x.shape[dim + 1 :])
    x = shrink_dim(x, dim + 1, 0, 1)
    return reshape(x, x.shape[:dim] + (length,) + x.shape[dim + 2 :])


@viewing
def narrow(x: Tensor, dim: int, start: int, length: int) -> Tensor:
    d = normalize_dim("narrow", dim, x.ndim)
    start, length = int_arg("narrow", "start", start), int_arg("narrow", "length", length)
    start = start + x.shape[d] if start < 0 else start
    if not 0 <= start <= start + length <= x.shape[d]:
        fail("narrow", f"start ({start}) + length ({length}) exceeds dimension size ({x.shape[d]})")
    return shrink_dim(x, d, start, start + length)


@viewing
def getitem(x: Tensor, index: Any) -> Tensor:
    """Python indexing: ints, slices (any step), None, Ellipsis, integer tensors/lists; a Python bool adds a dim
    of size 1 (True) or 0 (False), as torch does."""
    items = list(index) if isinstance(index, tuple) else [index]
    items = [as_tensor(i) if isinstance(i, list) else i for i in items]
    for item in items:
        if isinstance(item, Tensor) and item.dtype.is_bool:
            fail("index", "boolean mask indexing has a data-dependent shape; use torch-style "
                 "where(mask, x, 0) or masked_fill instead", kind=UnsupportedError)
        if isinstance(item, Tensor) and item.dtype.is_floating_point:
            fail("index", f"tensors used as indices must be integer tensors, got {item.dtype.name}", kind=DTypeError)
    consumed = sum(1 for i in items if i is not None and i is not Ellipsis and not isinstance(i, bool))
    if sum(1 for i in items if i is Ellipsis) > 1:
        fail("index", "an index can only have a single ellipsis ('...')", kind=ArgumentError)
    if consumed > x.ndim:
        fail("index", f"too many indices for tensor of dimension {x.ndim} (got {consumed})", kind=ShapeError)
    at = next((k for k, i in enumerate(items) if i is Ellipsis), len(items))
    items[at : at + 1] = [slice(None)] * (x.ndim - consumed)  # a missing Ellipsis stands at the end

    result, dim, advanced = x, 0, []
    for item in items:
        if item is None or isinstance(item, bool):
            result = unsqueeze(result, dim)
            result = result if item is not False else shrink_dim(result, dim, 0, 0)
            dim += 1
        elif isinstance(item, slice):
            start, stop, step = _slice_bounds(item, result.shape[dim])
            result = slice_dim(result, dim, start, stop, step)
            dim += 1
        elif isinstance(item, Tensor):
            advanced.append((dim, item))
            dim += 1
        else:
            i = int_arg("index", "a single index", item, kind=IndexingError)
            size = result.shape[dim]
            if not -size <= i < size:
                fail("index", f"index {i} is out of bounds for dimension {dim} with size {size}", kind=IndexingError)
            result = squeeze(shrink_dim(result, dim, i % size, i % size + 1), dim)
    return _advanced_index(result, advanced) if advanced else result


def _slice_bounds(item: slice, size: int) -> tuple[int, int, int]:
    """start, stop, step of `item` on a dim of `size`; each given bound must be an int."""
    for name in ("start", "stop", "step"):
        if getattr(item, name) is not None:
            int_arg("index", f"slice {name}", getattr(item, name))
    start, stop, step = item.indices(size)
    if step == 0:
        fail("index", "slice step cannot be zero", kind=ArgumentError)
    return start, stop, step


def _advanced_index(x: Tensor, advanced: list[tuple[int, Tensor]]) -> Tensor:
    """Integer-tensor indices: broadcast together; placed where they stand if adjacent, else in front."""
    dims = [d for d, _ in advanced]
    index_shape = broadcast_shapes("index", *(t.shape for _, t in advanced))
    adjacent = dims == list(range(dims[0], dims[0] + len(dims)))
    rest = [d for d in range(x.ndim) if d not in dims]
    moved = permute(x, dims + rest)
    flat = reshape(moved, (math.prod(x.shape[d] for d in dims),) + tuple(x.shape[d] for d in rest))
    linear = None
    for d, t in advanced:
        size = x.shape[d]
        t = cast(t, dtypes.int64)
        t = ew.where(ew.lt(t, 0), ew.add(t, size), t)
        linear = t if linear is None else ew.add(ew.mul(linear, size), t)
    selected = index_select(flat, 0, reshape(expand_to(linear, index_shape), -1))
    out = reshape(selected, index_shape + tuple(x.shape[d] for d in rest))
    if adjacent and dims[0] > 0:
        k = len(index_shape)
        order = list(range(k, k + dims[0])) + list(range(k)) + list(range(k + dims[0], out.ndim))
        out = permute(out, order)
    return out


# ---------------------------------------------------------------------------
# padding and joining
# ---------------------------------------------------------------------------


def pad_dim(x: Tensor, dim: int, before: int, after: int, value: Any = 0) -> Tensor:
    """Constant padding of one dim; negative widths crop."""
    d = normalize_dim("pad", dim, x.ndim)
    if before < 0 or after < 0:
        x = shrink_dim(x, d, max(0, -before), x.shape[d] - max(0, -after))
        before, after = max(0, before), max(0, after)
    if before == after == 0:
        return x
    widths = tuple((before, after) if i == d else (0, 0) for i in range(x.ndim))
    padded = apply(Op.PAD, x, arg=widths)
    if value == 0 and not (isinstance(value, float) and math.copysign(1, value) < 0):
        return padded
    inside = apply(Op.PAD, Tensor(g.const(True, dtypes.bool_, x.shape)), arg=widths)
    return ew.where(inside, padded, Tensor(g.const(value, x.dtype)))  # the value takes x's dtype, as in torch


@autocast_op(FLOAT32, applies=lambda x, pad, mode="constant", value=None: mode in ("reflect", "replicate"))
def pad(x: Tensor, pad: Sequence[int], mode: str = "constant", value: float | None = None) -> Tensor:
    """torch.nn.functional.pad: `pad` lists (left, right) pairs starting from the last dim."""
    pad = ints_arg("pad", "pad", pad)
    if len(pad) % 2 or len(pad) // 2 > x.ndim:
        fail("pad", f"padding length {len(pad)} must be even and at most 2 * ndim ({2 * x.ndim})", kind=ArgumentError)
    pairs = [(pad[2 * i], pad[2 * i + 1]) for i in range(len(pad) // 2)]
    for i, (before, after) in enumerate(pairs):
        dim = x.ndim - 1 - i
        if mode == "constant":
            x = pad_dim(x, dim, before, after, 0 if value is None else value)
        elif mode in ("reflect", "replicate", "circular"):
            x = _pad_from_edges(x, dim, before, after, mode)
        else:
            fail("pad", f"mode must be 'constant', 'reflect', 'replicate' or 'circular', got {mode!r}",
                 kind=ArgumentError)
    return x


def _pad_from_edges(x: Tensor, dim: int, before: int, after: int, mode: str) -> Tensor:
    n = x.shape[dim]
    if mode == "reflect" and (before >= n or after >= n):
        fail("pad", f"reflect padding ({before}, {after}) must be less than the dim size {n}", kind=ArgumentError)
    if mode == "circular" and (before > n or after > n):
        fail("pad", f"circular padding ({before}, {after}) must be at most the dim size {n}", kind=ArgumentError)
    if n == 0:
        fail("pad", f"cannot {mode}-pad an empty dim {dim}", kind=ArgumentError)
    parts = [_edge_block(x, dim, before, mode, leading=True)] if before else []
    parts.append(x)
    if after:
        parts.append(_edge_block(x, dim, after, mode, leading=False))
    return cat(parts, dim)


def _edge_block(x: Tensor, dim: int, width: int, mode: str, leading: bool) -> Tensor:
    """The `width` elements that padding mode `mode` puts before (leading) or after the data along `dim`."""
    n = x.shape[dim]
    if mode == "reflect":
        start, stop = (1, width + 1) if leading else (n - 1 - width, n - 1)
        return flip(shrink_dim(x, dim, start, stop), dim)
    if mode == "replicate":
        edge = shrink_dim(x, dim, 0, 1) if leading else shrink_dim(x, dim, n - 1, n)
        return expand_dim(edge, dim, width)
    return shrink_dim(x, dim, n - width, n) if leading else shrink_dim(x, dim, 0, width)  # circular


def expand_dim(x: Tensor, dim: int, size: int) -> Tensor:
    return expand_to(x, tuple(size if i == dim else s for i, s in enumerate(x.shape)))


def _concat_decomposition(*tensors: Tensor, axis: int) -> Tensor:
    """Each input padded to the full length and summed (`or` for bools). Floats are padded with -0.0 (the negated
    zero-padding of their negation), the one value whose sum with any x is exactly x, -0.0 included."""
    total = sum(t.shape[axis] for t in tensors)
    result, offset = None, 0
    for t in tensors:
        widths = (offset, total - offset - t.shape[axis])
        part = ew.neg(pad_dim(ew.neg(t), axis, *widths)) if t.dtype.is_floating_point else pad_dim(t, axis, *widths)
        offset += t.shape[axis]
        if result is None:
            result = part
        elif t.dtype.is_bool:
            result = ew.logical_or(result, part)
        else:
            result = ew.add(result, part)
    return result


def _concat_infer(*tensors: Tensor, axis: int) -> tuple[dtypes.DType, tuple[int, ...]]:
    shape = list(tensors[0].shape)
    shape[axis] = sum(t.shape[axis] for t in tensors)
    return tensors[0].dtype, tuple(shape)


def _concat_grad(out: Tensor, grad: Tensor, *tensors: Tensor, axis: int) -> tuple[Tensor, ...]:
    """Each input's slice of the gradient (its own rule: differentiated, the decomposition would also send an
    input's gradient down the other inputs that are views of it, a replicate pad's edges)."""
    starts = itertools.accumulate((t.shape[axis] for t in tensors), initial=0)
    return tuple(shrink_dim(grad, axis, start, start + t.shape[axis]) for start, t in zip(starts, tensors))


CONCAT = register(Composite("cat", _concat_infer, _concat_decomposition, grad=_concat_grad))
"""Inputs of one dtype joined along `axis`: a composite, so a compiled program writes each input into its slice of
one buffer (`schedule.lower`) instead of evaluating every input at every element of the sum of padded inputs (a
DenseNet's chain of concatenations, each of the one before, would recompute the whole chain in every consumer)."""


def _concat_operands(op: str, tensors: Sequence[Tensor], dim: int) -> tuple[list[Tensor], int]:
    """The inputs cast to their promoted dtype, less 1-d empty ones (as torch: left out of the shape checks but
    not of the dtype promotion), and the normalized dim; checked."""
    tensors = list(tensors)
    if not tensors:
        fail(op, "expected a non-empty list of tensors", kind=ArgumentError)
    dtype = functools.reduce(dtypes.promote_types, (t.dtype for t in tensors))
    tensors = [t for t in tensors if not (t.ndim == 1 and t.shape[0] == 0)] or tensors[:1]
    ref = tensors[0]
    d = normalize_dim(op, dim, ref.ndim)
    for t in tensors:
        if t.ndim != ref.ndim or any(a != b for i, (a, b) in enumerate(zip(t.shape, ref.shape)) if i != d):
            listed = ", ".join(str(u.shape) for u in tensors)
            fail(op, f"tensors must have the same shape except in dim {d}; got {listed}")
    return [cast(t, dtype) for t in tensors], d


def _joined(tensors: list[Tensor], axis: int) -> Tensor:
    return tensors[0] if len(tensors) == 1 else apply_composite(CONCAT, *tensors, axis=axis)


def cat(tensors: Sequence[Tensor], dim: int = 0) -> Tensor:
    """The `cat` composite of the inputs cast to their promoted dtype."""
    return _joined(*_concat_operands("cat", tensors, dim))


def _stack_operands(tensors: Sequence[Tensor], dim: int) -> tuple[list[Tensor], int]:
    tensors = list(tensors)
    if not tensors:
        fail("stack", "expected a non-empty list of tensors", kind=ArgumentError)
    for t in tensors:
        if t.shape != tensors[0].shape:
            fail("stack", f"expects each tensor to be equal size, got {[u.shape for u in tensors]}")
    d = normalize_dim("stack", dim, tensors[0].ndim + 1)
    return _concat_operands("stack", [unsqueeze(t, d) for t in tensors], d)


def stack(tensors: Sequence[Tensor], dim: int = 0) -> Tensor:
    return _joined(*_stack_operands(tensors, dim))


def stack_views(tensors: Sequence[Tensor], dim: int = 0) -> Tensor:
    """`stack` as the sum of the padded inputs, no composite: for views that a consumer reduces over right away
    (pooling's windows), which a buffer of the stacked views would only copy."""
    tensors, d = _stack_operands(tensors, dim)
    return _concat_decomposition(*tensors, axis=d)


@viewing
def split(x: Tensor, split_size_or_sections: int | Sequence[int], dim: int = 0) -> tuple[Tensor, ...]:
    d = normalize_dim("split", dim, x.ndim)
    n = x.shape[d]
    if not isinstance(split_size_or_sections, (tuple, list)):
        size = int_arg("split", "split_size", split_size_or_sections)
        if size <= 0 and n:
            fail("split", f"split_size must be positive, got {size}", kind=ArgumentError)
        sizes = [min(size, n - s) for s in range(0, n, size)] if n else [0]
    else:
        sizes = list(ints_arg("split", "split_sizes", split_size_or_sections))
        if sum(sizes) != n:
            fail("split", f"split sizes {sizes} do not sum to the dim size {n}")
    out, start = [], 0
    for s in sizes:
        out.append(shrink_dim(x, d, start, start + s))
        start += s
    return tuple(out)


@viewing
def chunk(x: Tensor, chunks: int, dim: int = 0) -> tuple[Tensor, ...]:
    chunks = int_arg("chunk", "chunks", chunks)
    if chunks <= 0:
        fail("chunk", f"chunks must be positive, got {chunks}", kind=ArgumentError)
    n = x.shape[normalize_dim("chunk", dim, x.ndim)]
    return split(x, max(1, -(-n // chunks)), dim)


@viewing
def unbind(x: Tensor, dim: int = 0) -> tuple[Tensor, ...]:
    d = normalize_dim("unbind", dim, x.ndim)
    return tuple(squeeze(shrink_dim(x, d, i, i + 1), d) for i in range(x.shape[d]))


def repeat(x: Tensor, *sizes: ShapeArg) -> Tensor:
    reps = size_arg("repeat", sizes, "repeats")
    if len(reps) < x.ndim:
        fail("repeat", f"number of repeat dims {len(reps)} can not be smaller than the tensor's ndim {x.ndim}")
    x = reshape(x, (1,) * (len(reps) - x.ndim) + x.shape)
    interleaved = tuple(v for s in x.shape for v in (1, s))
    x = reshape(x, interleaved)
    x = expand_to(x, tuple(v for r, s in zip(reps, x.shape[1::2]) for v in (r, s)))
    return reshape(x, tuple(r * s for r, s in zip(reps, x.shape[1::2])))


def tile(x: Tensor, *dims: ShapeArg) -> Tensor:
    reps = size_arg("tile", dims, "dims")
    return repeat(x, (1,) * (x.ndim - len(reps)) + reps)


def repeat_interleave(x: Tensor, repeats: int, dim: int | None = None) -> Tensor:
    if isinstance(repeats, Tensor):
        if repeats.numel() != 1:
            fail("repeat_interleave", "per-element repeats give a data-dependent shape; pass an int",
                 kind=UnsupportedError)
        repeats = repeats.item()
    repeats = int_arg("repeat_interleave", "repeats", repeats)
    if dim is None:
        x, dim = reshape(x, -1), 0
    d = normalize_dim("repeat_interleave", dim, x.ndim)
    x = unsqueeze(x, d + 1)
    x = expand_dim(x, d + 1, repeats)
    return reshape(x, x.shape[:d] + (x.shape[d] * repeats,) + x.shape[d + 2 :])


def roll(x: Tensor, shifts: int | Sequence[int], dims: int | Sequence[int] | None = None) -> Tensor:
    if dims is None:
        return reshape(roll(reshape(x, -1), shifts, 0), x.shape)
    shift_list, dim_list = ints_arg("roll", "shifts", shifts), dims_arg("roll", dims)
    if len(shift_list) != len(dim_list):
        fail("roll", f"shifts {shift_list} and dims {dim_list} must have the same length", kind=ArgumentError)
    for shift, dim in zip(shift_list, dim_list):
        d = normalize_dim("roll", dim, x.ndim)
        n = x.shape[d]
        if n == 0:
            continue
        s = shift % n
        if s:
            x = cat([shrink_dim(x, d, n - s, n), shrink_dim(x, d, 0, n - s)], d)
    return x


def _triangle_mask(x: Tensor, diagonal: int, lower: bool) -> Tensor:
    op = "tril" if lower else "triu"
    diagonal = int_arg(op, "diagonal", diagonal)
    if x.ndim < 2:
        fail(op, f"input must have at least 2 dims, got shape {x.shape}")
    rows, cols = x.shape[-2], x.shape[-1]
    r = reshape(Tensor(g.iota(rows, dtypes.int64)), (rows, 1))
    c = reshape(Tensor(g.iota(cols, dtypes.int64)), (1, cols))
    offset = ew.sub(c, r)
    return ew.le(offset, diagonal) if lower else ew.ge(offset, diagonal)


def tril(x: Tensor, diagonal: int = 0) -> Tensor:
    return ew.where(_triangle_mask(x, diagonal, True), x, Tensor(g.const(0, x.dtype)))


def triu(x: Tensor, diagonal: int = 0) -> Tensor:
    return ew.where(_triangle_mask(x, diagonal, False), x, Tensor(g.const(0, x.dtype)))


# ---------------------------------------------------------------------------
# indexing with tensors
# ---------------------------------------------------------------------------


def _check_index(op: str, index: Tensor) -> Tensor:
    if not isinstance(index, Tensor) or not index.dtype.is_integer:
        got = index.dtype.name if isinstance(index, Tensor) else type(index).__name__
        fail(op, f"index must be an integer tensor, got {got}", kind=DTypeError)
    return index


def gather(x: Tensor, dim: int, index: Tensor) -> Tensor:
    """torch.gather: out[i][j][k] = x[index[i][j][k]][j][k] for dim 0 (index may be smaller off-dim)."""
    _check_index("gather", index)
    d = normalize_dim("gather", dim, x.ndim)
    if index.ndim != x.ndim:
        fail("gather", f"index {index.shape} and input {x.shape} must have the same number of dimensions")
    for i, (a, b) in enumerate(zip(index.shape, x.shape)):
        if i != d and a > b:
            fail("gather", f"index {index.shape} is larger than input {x.shape} in dim {i}")
    bounds = tuple((0, x.shape[i]) if i == d else (0, s) for i, s in enumerate(index.shape))
    source = apply(Op.SHRINK, x, arg=bounds) if x.ndim else x
    if x.ndim == 0:
        return apply(Op.GATHER, reshape(x, 1), reshape(index, 1), arg=0).reshape(())
    return apply(Op.GATHER, source, index, arg=d)


def scatter_add(x: Tensor, dim: int, index: Tensor, src: Tensor) -> Tensor:
    _check_index("scatter_add", index)
    d = normalize_dim("scatter_add", dim, x.ndim)
    if not (index.ndim == x.ndim == src.ndim):
        fail("scatter_add", f"self {x.shape}, index {index.shape} and src {src.shape} must have the same ndim")
    for i, s in enumerate(index.shape):
        if s > src.shape[i] or (i != d and s > x.shape[i]):
            fail("scatter_add", f"index {index.shape} is larger than src {src.shape} or self {x.shape} in dim {i}")
    values = apply(Op.SHRINK, cast(src, x.dtype), arg=tuple((0, s) for s in index.shape))
    if index.shape == x.shape or d >= 0 and all(index.shape[i] == x.shape[i] for i in range(x.ndim) if i != d):
        return apply(Op.SCATTER_ADD, x, index, values, arg=d)
    widths = tuple((0, 0) if i == d else (0, x.shape[i] - s) for i, s in enumerate(index.shape))
    padded_index = apply(Op.PAD, index, arg=widths)
    padded_values = apply(Op.PAD, values, arg=widths)
    return apply(Op.SCATTER_ADD, x, padded_index, padded_values, arg=d)


def index_select(x: Tensor, dim: int, index: Tensor) -> Tensor:
    _check_index("index_select", index)
    if index.ndim > 1:
        fail("index_select", f"index must be 0-d or 1-d, got shape {index.shape}")
    d = normalize_dim("index_select", dim, x.ndim)
    index = reshape(index, -1)
    view = tuple(index.shape[0] if i == d else 1 for i in range(x.ndim))
    full = tuple(index.shape[0] if i == d else s for i, s in enumerate(x.shape))
    return apply(Op.GATHER, x, expand_to(reshape(index, view), full), arg=d)


def take_along_dim(x: Tensor, indices: Tensor, dim: int | None = None) -> Tensor:
    _check_index("take_along_dim", indices)
    if dim is None:
        return gather(reshape(x, -1), 0, reshape(indices, -1))
    d = normalize_dim("take_along_dim", dim, x.ndim)
    shape = broadcast_shapes("take_along_dim", x.shape[:d] + (1,) + x.shape[d + 1 :],
                             indices.shape[:d] + (1,) + indices.shape[d + 1 :])
    x = expand_to(x, shape[:d] + (x.shape[d],) + shape[d + 1 :])
    indices = expand_to(indices, shape[:d] + (indices.shape[d],) + shape[d + 1 :])
    return apply(Op.GATHER, x, indices, arg=d)


def one_hot(x: Tensor, num_classes: int = -1) -> Tensor:
    if not x.dtype.is_integer:
        fail("one_hot", f"one_hot is only applicable to index tensors, got {x.dtype.name}", kind=DTypeError)
    num_classes = int_arg("one_hot", "num_classes", num_classes)
    if num_classes < 0:
        num_classes = int(x.max().item()) + 1 if x.numel() else 0
    classes = reshape(Tensor(g.iota(num_classes, dtypes.int64)), (1,) * x.ndim + (num_classes,))
    (a, b), _ = operands("one_hot", unsqueeze(cast(x, dtypes.int64), -1), classes)
    return cast(ew.eq(a, b), dtypes.int64)
