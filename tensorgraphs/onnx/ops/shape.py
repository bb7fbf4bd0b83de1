"""Shape and movement ops: what ONNX passes as shapes, axes, pads or repeats is read as known values
(`lowering.known`); the data moves through tensorgraphs' views."""

from __future__ import annotations

import math

import numpy as np

import tensorgraphs as tg
from tensorgraphs.frontend import movement as mv
from tensorgraphs.frontend.tensor import Tensor
from tensorgraphs.onnx.dtypes import numpy_dtype, tg_dtype
from tensorgraphs.onnx.lowering import OnnxNode, Value, ints, known, lowers, scalar, tensor


def axis_of(axis: int, rank: int) -> int:
    return axis + rank if axis < 0 else axis


def shape_of(value: Value) -> tuple[int, ...]:
    return tuple(value.shape)


def axes_argument(node: OnnxNode, axes: Value | None, since: int) -> list[int] | None:
    """Axes as an attribute before opset `since`, as an input from it."""
    return node.attr("axes") if node.opset < since else ints(axes)


@lowers("Constant")
def constant(node: OnnxNode) -> np.ndarray:
    for name in ("value", "value_float", "value_floats", "value_int", "value_ints"):
        if node.has(name):
            value = node.attr(name)
            if isinstance(value, np.ndarray):
                return value
            return np.asarray(value, np.float32 if "float" in name else np.int64)
    return node.fail("only tensor, float and int constants are supported")


@lowers("Shape")
def shape(node: OnnxNode, x: Value) -> np.ndarray:
    dims = shape_of(x)
    start, end = node.attr("start", 0), node.attr("end", len(dims))
    return np.asarray(dims[slice(start, end)], np.int64)


@lowers("Size")
def size(node: OnnxNode, x: Value) -> np.ndarray:
    return np.asarray(math.prod(shape_of(x)), np.int64)


@lowers("Reshape")
def reshape(node: OnnxNode, x: Value, target: Value | None = None) -> Tensor:
    dims = node.attr("shape") if node.opset < 5 else ints(target)
    if not node.attr("allowzero", 0):
        dims = [x.shape[i] if d == 0 else d for i, d in enumerate(dims)]
    return tg.reshape(tensor(x), tuple(dims))


@lowers("Flatten")
def flatten(node: OnnxNode, x: Value) -> Tensor:
    axis = axis_of(node.attr("axis", 1), len(x.shape))
    return tg.reshape(tensor(x), (math.prod(x.shape[:axis]), math.prod(x.shape[axis:])))


@lowers("Squeeze")
def squeeze(node: OnnxNode, x: Value, axes: Value | None = None) -> Tensor:
    chosen = axes_argument(node, axes, 13)
    rank = len(x.shape)
    drop = {axis_of(a, rank) for a in chosen} if chosen else {i for i, d in enumerate(x.shape) if d == 1}
    return tg.reshape(tensor(x), tuple(d for i, d in enumerate(x.shape) if i not in drop))


@lowers("Unsqueeze")
def unsqueeze(node: OnnxNode, x: Value, axes: Value | None = None) -> Tensor:
    chosen = axes_argument(node, axes, 13)
    rank = len(x.shape) + len(chosen)
    inserted = {axis_of(a, rank) for a in chosen}
    dims = iter(x.shape)
    return tg.reshape(tensor(x), tuple(1 if i in inserted else next(dims) for i in range(rank)))


@lowers("Transpose")
def transpose(node: OnnxNode, x: Value) -> Tensor:
    perm = node.attr("perm") or list(reversed(range(len(x.shape))))
    return tg.permute(tensor(x), tuple(perm))


@lowers("Concat")
def concat(node: OnnxNode, *inputs: Value) -> Tensor:
    return tg.cat([tensor(v) for v in inputs], dim=node.attr("axis"))


@lowers("Split")
def split(node: OnnxNode, x: Value, sizes: Value | None = None) -> tuple[Tensor, ...]:
    axis = axis_of(node.attr("axis", 0), len(x.shape))
    dim = x.shape[axis]
    chosen = node.attr("split") if node.opset < 13 else ints(sizes)
    if not chosen:
        parts = node.attr("num_outputs", node.outputs)
        step = -(-dim // parts)
        chosen = [min(step, dim - i * step) for i in range(parts)]
    return tuple(tg.split(tensor(x), list(chosen), dim=axis))


@lowers("Slice")
def slice_(node: OnnxNode, x: Value, starts: Value | None = None, ends: Value | None = None,
           axes: Value | None = None, steps: Value | None = None) -> Tensor:
    """numpy's slicing per axis (out-of-range bounds clamp); a negative step reads the flipped axis."""
    if node.opset < 10:
        starts, ends, axes, steps = node.attr("starts"), node.attr("ends"), node.attr("axes"), None
    else:
        starts, ends, axes, steps = ints(starts), ints(ends), ints(axes), ints(steps)
    rank = len(x.shape)
    axes = axes or list(range(len(starts)))
    steps = steps or [1] * len(starts)
    out = tensor(x)
    for start, end, axis, step in zip(starts, ends, axes, steps):
        out = slice_axis(out, axis_of(axis, rank), start, end, step)
    return out


def slice_axis(x: Tensor, axis: int, start: int, end: int, step: int) -> Tensor:
    dim = x.shape[axis]
    first, stop, step = slice(start, end, step).indices(dim)
    count = len(range(first, stop, step))
    if count == 0:
        return mv.shrink_dim(x, axis, 0, 0)
    if step < 0:
        x, first, step = tg.flip(x, axis), dim - 1 - first, -step
    return mv.slice_dim(x, axis, first, first + step * (count - 1) + 1, step)


@lowers("Expand")
def expand(node: OnnxNode, x: Value, target: Value) -> Tensor:
    x = tensor(x)
    dims = tuple(ints(target))
    out_shape = np.broadcast_shapes(tuple(x.shape), dims)
    return tg.broadcast_to(x, out_shape)


@lowers("Tile")
def tile(node: OnnxNode, x: Value, repeats: Value) -> Tensor:
    return tg.tile(tensor(x), tuple(ints(repeats)))


@lowers("Pad")
def pad(node: OnnxNode, x: Value, pads: Value | None = None, value: Value | None = None,
        axes: Value | None = None) -> Tensor:
    """pads = [begin per axis..., end per axis...]; negative widths crop. constant/reflect/edge/wrap."""
    x = tensor(x)
    rank = x.ndim
    if node.opset < 11:
        widths, fill, chosen = node.attr("pads"), node.attr("value", 0.0), None
    else:
        widths, fill, chosen = ints(pads), scalar(value, 0), ints(axes)
    chosen = [axis_of(a, rank) for a in chosen] if chosen else list(range(rank))
    mode = node.attr("mode", "constant")
    half = len(chosen)
    for i, axis in enumerate(chosen):
        before, after = widths[i], widths[i + half]
        if mode == "constant":
            x = mv.pad_dim(x, axis, before, after, fill)
        else:
            x = x if before >= 0 and after >= 0 else mv.pad_dim(x, axis, min(before, 0), min(after, 0), 0)
            x = tg.index_select(x, axis, tensor(_pad_positions(mode, x.shape[axis], max(before, 0),
                                                             max(after, 0), node)))
    return x


def _pad_positions(mode: str, dim: int, before: int, after: int, node: OnnxNode) -> np.ndarray:
    """For reflect/edge/wrap: the source position of each output position along one axis."""
    positions = np.arange(-before, dim + after)
    if mode == "edge":
        return np.clip(positions, 0, dim - 1)
    if mode == "wrap":
        return np.mod(positions, dim)
    if mode == "reflect":
        if dim == 1:
            return np.zeros_like(positions)
        period = 2 * (dim - 1)
        folded = np.mod(positions, period)
        return np.where(folded >= dim, period - folded, folded)
    return node.fail(f"pad mode {mode!r} is not supported")


@lowers("ConstantOfShape")
def constant_of_shape(node: OnnxNode, dims: Value) -> np.ndarray:
    value = node.attr("value", np.zeros(1, np.float32))
    return np.full(tuple(ints(dims)), value.reshape(-1)[0], value.dtype)


@lowers("Range")
def range_(node: OnnxNode, start: Value, limit: Value, delta: Value) -> np.ndarray:
    first, stop, step = (known(v).reshape(()) for v in (start, limit, delta))
    count = max(int(math.ceil((stop - first) / step)), 0)
    return (first + np.arange(count) * step).astype(known(start).dtype)


@lowers("Cast")
def cast(node: OnnxNode, x: Value) -> Value:
    to = node.attr("to")
    dtype = tg_dtype(to, f"{node.describe()} output")
    return x.astype(numpy_dtype(to)) if isinstance(x, np.ndarray) else tensor(x).to(dtype)


@lowers("BitCast")
def bit_cast(node: OnnxNode, x: Value) -> np.ndarray:
    """The same bits as another type of the same width: a view of a known value (no op reinterprets bits)."""
    return known(x).view(numpy_dtype(node.attr("to")))


@lowers("CastLike")
def cast_like(node: OnnxNode, x: Value, like: Value) -> Tensor:
    return tensor(x).to(tensor(like).dtype)


@lowers("DepthToSpace")
def depth_to_space(node: OnnxNode, x: Value) -> Tensor:
    n, c, h, w = x.shape
    b = node.attr("blocksize")
    if node.attr("mode", "DCR") == "DCR":
        out = tg.permute(tg.reshape(tensor(x), (n, b, b, c // (b * b), h, w)), (0, 3, 4, 1, 5, 2))
    else:
        out = tg.permute(tg.reshape(tensor(x), (n, c // (b * b), b, b, h, w)), (0, 1, 4, 2, 5, 3))
    return tg.reshape(out, (n, c // (b * b), h * b, w * b))


@lowers("SpaceToDepth")
def space_to_depth(node: OnnxNode, x: Value) -> Tensor:
    n, c, h, w = x.shape
    b = node.attr("blocksize")
    order = (0, 3, 5, 1, 2, 4) if node.attr("mode", "DCR") == "DCR" else (0, 1, 3, 5, 2, 4)
    out = tg.permute(tg.reshape(tensor(x), (n, c, h // b, b, w // b, b)), order)
    return tg.reshape(out, (n, c * b * b, h // b, w // b))


@lowers("Trilu")
def trilu(node: OnnxNode, x: Value, k: Value | None = None) -> Tensor:
    diagonal = scalar(k, 0)
    return (tg.triu if node.attr("upper", 1) else tg.tril)(tensor(x), diagonal)


@lowers("EyeLike")
def eye_like(node: OnnxNode, x: Value) -> np.ndarray:
    dtype = node.attr("dtype")
    dtype = np.dtype(x.dtype.storage if isinstance(x, Tensor) else x.dtype) if dtype is None else numpy_dtype(dtype)
    return np.eye(x.shape[0], x.shape[1], node.attr("k", 0), dtype=dtype)


@lowers("Dropout")
def dropout(node: OnnxNode, x: Value, ratio: Value | None = None, training: Value | None = None) -> tuple:
    """Inference: the identity (and an all-true mask); training mode draws from ONNX's unspecified generator."""
    if scalar(training, False) and scalar(ratio, 0.5) > 0:
        node.fail("training_mode=True draws random numbers; only inference (or ratio 0) is supported")
    return tensor(x), np.ones(x.shape, bool)

