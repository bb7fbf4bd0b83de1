"""Indexing ops: gathers and scatters (negative indices count from the end), one-hot, top-k, arg-max/min,
cumulative sums, einsum."""

from __future__ import annotations

import math

import numpy as np

import tensorgraphs as tg
from tensorgraphs.frontend import movement as mv
from tensorgraphs.frontend.tensor import Tensor
from tensorgraphs.onnx.lowering import OnnxNode, Value, ints, known, lowers, scalar, tensor
from tensorgraphs.onnx.ops.shape import axis_of


def wrapped(index: Value, dim: int | Tensor) -> Tensor:
    """Indices with negative ones counted from the end of an axis of size `dim`, as int64."""
    index = tensor(index).to(tg.int64)
    return tg.where(index < 0, tg.add(index, dim), index)


@lowers("Gather")
def gather(node: OnnxNode, x: Value, index: Value) -> Tensor:
    x = tensor(x)
    axis = axis_of(node.attr("axis", 0), x.ndim)
    flat = tg.reshape(wrapped(index, x.shape[axis]), (-1,))
    picked = tg.index_select(x, axis, flat)
    return tg.reshape(picked, tuple(x.shape[:axis]) + tuple(index.shape) + tuple(x.shape[axis + 1:]))


@lowers("GatherElements")
def gather_elements(node: OnnxNode, x: Value, index: Value) -> Tensor:
    x = tensor(x)
    axis = axis_of(node.attr("axis", 0), x.ndim)
    return tg.gather(x, axis, wrapped(index, x.shape[axis]))


COMBINE = {"mul": (tg.mul, 1), "max": (tg.maximum, -np.inf), "min": (tg.minimum, np.inf)}
"""Scatter reductions other than add: how two values combine, and the value that changes nothing."""


@lowers("ScatterElements", "Scatter")
def scatter_elements(node: OnnxNode, x: Value, index: Value, updates: Value) -> Tensor:
    x = tensor(x)
    axis = axis_of(node.attr("axis", 0), x.ndim)
    if node.attr("reduction", "none") in COMBINE:
        positions = list(np.indices(index.shape))
        positions[axis] = np.where(known(index) < 0, known(index) + x.shape[axis], known(index))
        return _scatter_combined(node, x, np.ravel_multi_index(positions, x.shape).reshape(-1), tensor(updates))
    return _scatter(node, x, axis, wrapped(index, x.shape[axis]), tensor(updates))


def _scatter_combined(node: OnnxNode, x: Tensor, targets: np.ndarray, updates: Tensor) -> Tensor:
    """x with each flat position in `targets` (known) combined with its updates (flattened in the same order):
    the updates of each position are gathered into a row padded with the identity, reduced, then combined."""
    combine, identity = COMBINE[node.attr("reduction")]
    flat = tg.reshape(x, (-1,))
    positions, groups = np.unique(targets, return_inverse=True)
    order = np.argsort(groups, kind="stable")
    counts = np.bincount(groups, minlength=len(positions))
    width = int(counts.max()) if counts.size else 0
    table = np.full((len(positions), width), targets.size, np.int64)  # the padding slot holds the identity
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    for row, (start, count) in enumerate(zip(starts, counts)):
        table[row, :count] = order[start:start + count]
    padded = tg.cat([tg.reshape(updates, (-1,)).to(x.dtype), tg.full((1,), identity, dtype=x.dtype)])
    rows = tg.reshape(tg.index_select(padded, 0, tensor(table.reshape(-1))), table.shape)
    reduced = rows[:, 0]
    for column in range(1, width):
        reduced = combine(reduced, rows[:, column])
    combined = combine(tg.index_select(flat, 0, tensor(positions.astype(np.int64))), reduced)
    slot = np.full(flat.shape[0], len(positions), np.int64)
    slot[positions] = np.arange(len(positions))
    placed = tg.index_select(tg.cat([combined, tg.zeros((1,), dtype=x.dtype)]), 0, tensor(slot))
    return tg.reshape(tg.where(tensor(slot < len(positions)), placed, flat), x.shape)


def _scatter(node: OnnxNode, x: Tensor, axis: int, index: Tensor, updates: Tensor) -> Tensor:
    """x with `updates` written (reduction "none") or added at `index` along `axis`."""
    reduction = node.attr("reduction", "none")
    added = tg.scatter_add(tg.zeros_like(x), axis, index, updates)
    if reduction == "add":
        return tg.add(x, added)
    hit = tg.scatter_add(tg.zeros(x.shape, dtype=tg.int32), axis, index, tg.ones(updates.shape, dtype=tg.int32))
    return tg.where(hit > 0, added, x)


def _linear(index: Tensor, dims: tuple[int, ...]) -> Tensor:
    """index (..., k) into the leading len(dims) == k axes -> flat positions (...)."""
    strides = [math.prod(dims[i + 1:]) for i in range(len(dims))]
    wrapped_index = wrapped(index, tensor(np.asarray(dims, np.int64)))
    return tg.sum(tg.mul(wrapped_index, tensor(np.asarray(strides, np.int64))), -1)


@lowers("ScatterND")
def scatter_nd(node: OnnxNode, x: Value, index: Value, updates: Value) -> Tensor:
    if node.attr("reduction", "none") in COMBINE:
        return _scatter_nd_combined(node, tensor(x), known(index), tensor(updates))
    x, index, updates = tensor(x), tensor(index), tensor(updates)
    k = index.shape[-1]
    rows = tg.reshape(x, (math.prod(x.shape[:k]), -1)) if k else tg.reshape(x, (1, -1))
    positions = tg.reshape(_linear(index, tuple(x.shape[:k])), (-1, 1))
    values = tg.reshape(updates, (positions.shape[0], rows.shape[1]))
    out = _scatter(node, rows, 0, tg.broadcast_to(positions, values.shape), values)
    return tg.reshape(out, x.shape)


def _scatter_nd_combined(node: OnnxNode, x: Tensor, index: np.ndarray, updates: Tensor) -> Tensor:
    k = index.shape[-1]
    dims = np.asarray(x.shape[:k])
    rows = np.ravel_multi_index(tuple(np.moveaxis(np.where(index < 0, index + dims, index), -1, 0)), x.shape[:k])
    inner = math.prod(x.shape[k:])
    targets = (rows.reshape(-1, 1) * inner + np.arange(inner)).reshape(-1)
    return _scatter_combined(node, x, targets, updates)


@lowers("GatherND")
def gather_nd(node: OnnxNode, x: Value, index: Value) -> Tensor:
    x, index = tensor(x), tensor(index)
    batch = node.attr("batch_dims", 0)
    k = index.shape[-1]
    batches = math.prod(x.shape[:batch])
    inner = tuple(x.shape[batch:batch + k])
    rest = tuple(x.shape[batch + k:])
    positions = _linear(tg.reshape(index, (batches, -1, k)), inner)
    offsets = tensor(np.arange(batches, dtype=np.int64).reshape(-1, 1) * math.prod(inner))
    rows = tg.reshape(x, (batches * math.prod(inner),) + rest)
    picked = tg.index_select(rows, 0, tg.reshape(tg.add(positions, offsets), (-1,)))
    return tg.reshape(picked, tuple(index.shape[:-1]) + rest)


@lowers("OneHot")
def one_hot(node: OnnxNode, index: Value, depth: Value, values: Value) -> Tensor:
    index, values = tensor(index), tensor(values)
    size = int(scalar(depth))
    axis = axis_of(node.attr("axis", -1), index.ndim + 1)
    classes = tensor(np.arange(size, dtype=np.int64).reshape((size,) + (1,) * (index.ndim - axis)))
    hot = tg.eq(tg.unsqueeze(wrapped(index, size), axis), classes)
    return tg.where(hot, values[1], values[0])


@lowers("ArgMax", "ArgMin")
def arg_extreme(node: OnnxNode, x: Value) -> Tensor:
    """The first extreme position along `axis`, or the last with select_last_index (the flipped axis's first)."""
    x = tensor(x)
    axis = axis_of(node.attr("axis", 0), x.ndim)
    last = node.attr("select_last_index", 0)
    pick = tg.argmax if node.op_type == "ArgMax" else tg.argmin
    keep = bool(node.attr("keepdims", 1))
    if not last:
        return pick(x, axis, keepdim=keep)
    return tg.sub(x.shape[axis] - 1, pick(tg.flip(x, axis), axis, keepdim=keep))


@lowers("TopK")
def top_k(node: OnnxNode, x: Value, k: Value | None = None) -> tuple[Tensor, Tensor]:
    x = tensor(x)
    count = node.attr("k") if node.opset < 10 else int(scalar(k))
    axis = axis_of(node.attr("axis", -1), x.ndim)
    values, positions = tg.topk(x, count, axis, largest=bool(node.attr("largest", 1)), sorted=True)
    return values, positions.to(tg.int64)


@lowers("CumSum", "CumProd")
def cumulative(node: OnnxNode, x: Value, axis: Value) -> Tensor:
    """Inclusive or exclusive (the identity shifted in), forward or reverse."""
    x = tensor(x)
    dim = axis_of(int(scalar(axis)), x.ndim)
    reverse, exclusive = node.attr("reverse", 0), node.attr("exclusive", 0)
    source = tg.flip(x, dim) if reverse else x
    if exclusive:
        identity = 0 if node.op_type == "CumSum" else 1
        source = mv.pad_dim(mv.shrink_dim(source, dim, 0, source.shape[dim] - 1), dim, 1, 0, identity)
    out = (tg.cumsum if node.op_type == "CumSum" else tg.cumprod)(source, dim).to(x.dtype)
    return tg.flip(out, dim) if reverse else out


@lowers("Hardmax")
def hardmax(node: OnnxNode, x: Value) -> Tensor:
    x = tensor(x)
    shape = x.shape
    if node.opset < 13:
        axis = axis_of(node.attr("axis", 1), x.ndim)
        x, axis = tg.reshape(x, (math.prod(shape[:axis]), -1)), 1
    else:
        axis = axis_of(node.attr("axis", -1), x.ndim)
    first = tg.argmax(x, axis, keepdim=True)
    positions = tensor(np.arange(x.shape[axis]).reshape((-1,) + (1,) * (x.ndim - axis - 1)))
    return tg.reshape(tg.eq(positions, first).to(x.dtype), shape)


@lowers("Einsum")
def einsum(node: OnnxNode, *inputs: Value) -> Tensor:
    return tg.einsum(node.attr("equation").replace(" ", ""), *(tensor(v) for v in inputs))


@lowers("NonZero")
def non_zero(node: OnnxNode, x: Value) -> np.ndarray:
    """Its output's shape depends on the data: computed when the graph is built (a known value or a graph input)."""
    return np.asarray(np.nonzero(known(x)), np.int64)


@lowers("Compress")
def compress(node: OnnxNode, x: Value, condition: Value) -> Tensor:
    chosen = np.nonzero(known(condition))[0]
    x = tensor(x)
    axis = node.attr("axis")
    flat = tg.reshape(x, (-1,)) if axis is None else x
    dim = 0 if axis is None else axis_of(axis, x.ndim)
    return tg.index_select(flat, dim, tensor(chosen[chosen < flat.shape[dim]].astype(np.int64)))


@lowers("ReverseSequence")
def reverse_sequence(node: OnnxNode, x: Value, lengths: Value) -> Tensor:
    x = tensor(x)
    time, batch = node.attr("time_axis", 0), node.attr("batch_axis", 1)
    steps = np.arange(x.shape[time]).reshape(-1, 1)
    counts = known(lengths).reshape(1, -1)
    source = np.where(steps < counts, counts - 1 - steps, steps)  # (time, batch)
    if time > batch:
        source = source.T
    shape = [1] * x.ndim
    shape[time], shape[batch] = x.shape[time], x.shape[batch]
    index = tg.broadcast_to(tensor(source.reshape(shape).astype(np.int64)), x.shape)
    return tg.gather(x, time, index)


@lowers("TensorScatter")
def tensor_scatter(node: OnnxNode, cache: Value, update: Value, starts: Value | None = None) -> Tensor:
    """The cache with each batch's update written along `axis` from its write index (0 by default); "circular"
    wraps past the cache's end."""
    cache, update = tensor(cache), tensor(update)
    axis = axis_of(node.attr("axis", -2), cache.ndim)
    length, written = cache.shape[axis], update.shape[axis]
    shape = [1] * cache.ndim
    shape[axis] = length
    position = tensor(np.arange(length, dtype=np.int64).reshape(shape))
    start = tg.zeros((cache.shape[0],), dtype=tg.int64) if starts is None else tensor(starts).to(tg.int64)
    source = tg.sub(position, tg.reshape(start, (-1,) + (1,) * (cache.ndim - 1)))
    if node.attr("mode", "linear") == "circular":
        source = tg.remainder(source, length)
    inside = tg.logical_and(source >= 0, source < written)
    index_shape = list(cache.shape)
    index_shape[axis] = length
    index = tg.broadcast_to(tg.clamp(source, 0, written - 1), tuple(index_shape))
    return tg.where(inside, tg.gather(update, axis, index), cache)


@lowers("MaxUnpool")
def max_unpool(node: OnnxNode, x: Value, index: Value, output_shape: Value | None = None) -> Tensor:
    """Zeros of the output shape with each value written at its flat index (MaxPool's Indices)."""
    x = tensor(x)
    if output_shape is not None:
        shape = tuple(ints(output_shape))
    else:
        kernel, strides = node.attr("kernel_shape"), node.attr("strides") or [1] * (x.ndim - 2)
        pads = node.attr("pads") or [0] * (2 * (x.ndim - 2))
        half = len(kernel)
        shape = tuple(x.shape[:2]) + tuple((size - 1) * s - pads[i] - pads[i + half] + k for i, (size, s, k) in
                                           enumerate(zip(x.shape[2:], strides, kernel)))
    flat = tg.zeros((math.prod(shape),), dtype=x.dtype)
    return tg.reshape(tg.scatter_add(flat, 0, tg.reshape(tensor(index).to(tg.int64), (-1,)),
                                     tg.reshape(x, (-1,))), shape)
