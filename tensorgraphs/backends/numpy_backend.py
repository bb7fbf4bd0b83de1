"""The reference interpreter: runs primitive graphs op by op with numpy.

Composite nodes run through their reference decomposition, so this backend
is the oracle for every dedicated kernel. With `float64=True` every float op
is computed in float64 (a more exact oracle for accuracy tests).
"""

from __future__ import annotations

from typing import Callable, Mapping, Sequence

import numpy as np

from tensorgraphs import dtypes
from tensorgraphs.dtypes import DType
from tensorgraphs.errors import user_location
from tensorgraphs.graph.composite import decompose, is_composite
from tensorgraphs.graph.node import Node, toposort
from tensorgraphs.graph.ops import Op


def _check_indices(op: str, index: np.ndarray, size: int, axis: int) -> None:
    """Indices must lie in [0, size): numpy would wrap negative ones silently."""
    bad = index[(index < 0) | (index >= size)]
    if bad.size:
        raise IndexError(f"{op}: index {bad.flat[0]} is out of bounds for axis {axis} with size {size} "
                         f"(while computing a value needed at {user_location()})")


def _scatter_add(base: np.ndarray, index: np.ndarray, values: np.ndarray, axis: int) -> np.ndarray:
    _check_indices("scatter_add", index, base.shape[axis], axis)
    out = base.copy()
    where = list(np.indices(index.shape, sparse=True))
    where[axis] = index
    np.add.at(out, tuple(where), values)
    return out


def _divide(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if a.dtype.kind == "f":
        return a / b
    return np.floor_divide(a, b)  # integer division by zero gives 0 (documented)


def _cast(x: np.ndarray, node: Node) -> np.ndarray:
    """Conversions numpy does not do as C does; the rest happens when the result takes the node's type."""
    if node.dtype.is_bool:
        return x != 0
    if node.dtype.is_integer and x.dtype.kind == "f":
        # C semantics: truncate. NaN/Inf/out-of-range are undefined; here NaN/Inf give 0, unsigned wraps
        # (as the conversion through int64 compilers emit), signed saturates.
        x = np.where(np.isfinite(x), np.trunc(x.astype(np.float64)), 0.0)
        if node.dtype.kind == "u":
            return np.mod(x, 2.0**node.dtype.bits)
        limit, info = 2.0 ** (node.dtype.bits - 1), np.iinfo(node.dtype.storage)
        return np.where(x >= limit, info.max, np.where(x < -limit, info.min, x.astype(node.dtype.storage)))
    return x


def _pad(x: np.ndarray, widths: tuple[tuple[int, int], ...]) -> np.ndarray:
    return np.pad(x, widths, mode="constant", constant_values=0)


def _shrink(x: np.ndarray, bounds: tuple[tuple[int, int], ...]) -> np.ndarray:
    return x[tuple(slice(b, e) for b, e in bounds)]


def _gather(x: np.ndarray, index: np.ndarray, axis: int) -> np.ndarray:
    _check_indices("gather", index, x.shape[axis], axis)
    return np.take_along_axis(x, index.astype(np.int64), axis)


_Evaluator = Callable[..., np.ndarray]

PRIMITIVE_EVALUATORS: dict[Op, _Evaluator] = {
    Op.BUFFER: lambda node: node.arg.data,
    Op.CONST: lambda node: np.full(node.shape, node.arg),
    Op.IOTA: lambda node: np.arange(node.shape[0]),
    Op.EXP2: lambda node, x: np.exp2(x),
    Op.LOG2: lambda node, x: np.log2(x),
    Op.SIN: lambda node, x: np.sin(x),
    Op.SQRT: lambda node, x: np.sqrt(x),
    Op.CAST: lambda node, x: _cast(x, node),
    Op.ADD: lambda node, a, b: a + b,
    Op.MUL: lambda node, a, b: a * b,
    Op.DIV: lambda node, a, b: _divide(a, b),
    Op.MOD: lambda node, a, b: np.mod(a, b),
    Op.MAX: lambda node, a, b: np.maximum(a, b),
    Op.CMPLT: lambda node, a, b: a < b,
    Op.CMPNE: lambda node, a, b: a != b,
    Op.AND: lambda node, a, b: a & b,
    Op.OR: lambda node, a, b: a | b,
    Op.XOR: lambda node, a, b: a ^ b,
    Op.WHERE: lambda node, c, a, b: np.where(c, a, b),
    Op.REDUCE_SUM: lambda node, x: np.sum(x, axis=node.arg, keepdims=True, dtype=x.dtype),
    Op.REDUCE_MAX: lambda node, x: np.max(x, axis=node.arg, keepdims=True),
    Op.RESHAPE: lambda node, x: x.reshape(node.arg),
    Op.PERMUTE: lambda node, x: x.transpose(node.arg),
    Op.EXPAND: lambda node, x: np.broadcast_to(x, node.arg),
    Op.PAD: lambda node, x: _pad(x, node.arg),
    Op.SHRINK: lambda node, x: _shrink(x, node.arg),
    Op.FLIP: lambda node, x: np.flip(x, node.arg),
    Op.GATHER: lambda node, x, i: _gather(x, i, node.arg),
    Op.SCATTER_ADD: lambda node, b, i, v: _scatter_add(b, i, v, node.arg),
    Op.ASSIGN: lambda node, target, value: value,
    Op.COPY: lambda node, x: x,
}

class NumpyBackend:
    """Evaluates graphs node by node; every result takes its node's storage type (bfloat16 rounded)."""

    name = "numpy"

    def __init__(self, float64: bool = False) -> None:
        self.float64 = float64

    def storage_type(self, dtype: DType) -> type:
        return np.float64 if self.float64 and dtype.is_floating_point else dtype.storage

    def evaluate(self, roots: list[Node], known: Mapping[Node, np.ndarray] | None = None) -> list[np.ndarray]:
        """Values of `roots`; nodes in `known` are taken from it and not recomputed."""
        known = {} if known is None else known
        values: dict[Node, np.ndarray] = {}
        with np.errstate(all="ignore"):
            for node in toposort(roots, stop=known.__contains__):
                cached = known.get(node)
                values[node] = self._run(node, values) if cached is None else cached
        return [values[r] for r in roots]

    def prepare(self, roots: list[Node], inputs: list[Node]) -> Callable[[Sequence[np.ndarray]], list[np.ndarray]]:
        """`roots` interpreted again on each call's arrays for `inputs`."""
        return lambda arrays: self.evaluate(roots, dict(zip(inputs, arrays)))

    def _run(self, node: Node, values: dict[Node, np.ndarray]) -> np.ndarray:
        if is_composite(node):

            return self.evaluate([decompose(node)], values)[0]
        evaluate = PRIMITIVE_EVALUATORS[node.op]
        out = np.asarray(evaluate(node, *(values[s] for s in node.src)), dtype=self.storage_type(node.dtype))
        return out if self.float64 else dtypes.round_to_storage(out, node.dtype)


REFERENCE = NumpyBackend()
