"""Results of a compiled call that autograd can differentiate (`tg.compile` of a module).

The compiled program computes the results in one native call. Each result tensor also carries the graph the
traced function built, bound to what this call read: its arguments and the parameters as they are now, the
random keys and numbers it was fed. Its value is already known (`realized_values`), so a loss built on it costs
only the loss; `loss.backward()` then differentiates exactly the graph eager code would have built, into the
parameters' `.grad` and through arguments that require grad.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from tensorgraphs import dtypes
from tensorgraphs.frontend.tensor import Tensor, held
from tensorgraphs.graph.node import Node, substitute, toposort
from tensorgraphs.runtime.realize import default_device, graph_without_data, realized_values

LeafSource = Callable[[Sequence[Any], Sequence[np.ndarray]], Tensor | None]
"""The tensor a leaf of the traced graph stands for at a call, from the call's arguments and the arrays its
program is fed (in program input order); None for a gradient that is not there."""


def argument(position: int) -> LeafSource:
    """The tensor argument at `position` itself (gradients flow into it), a numpy array as a tensor."""

    def source(args: Sequence[Any], fed: Sequence[np.ndarray]) -> Tensor:
        value = args[position]
        return value if isinstance(value, Tensor) else held(value, dtypes.from_numpy_dtype(value.dtype))

    return source


def tensor(read: Callable[[], Tensor | None]) -> LeafSource:
    """A tensor read from outside the function (a parameter, a module buffer) as it is at the call."""
    return lambda args, fed: read()


def number(position: int, dtype: dtypes.DType) -> LeafSource:
    """The number argument at `position`, as the 0-d tensor of `dtype` its placeholder is."""
    return lambda args, fed: held(np.asarray(args[position], dtype.storage), dtype)


def fed(index: int, dtype: dtypes.DType) -> LeafSource:
    """What the program is fed as its input `index` (a random key, a value fixed when traced), as a constant."""
    return lambda args, arrays: held(arrays[index], dtype)


@dataclass
class ResultGraph:
    """The traced function's results as a graph over data-free `leaves`, each found at a call by its source."""

    roots: list[Node]
    leaves: list[Node]
    sources: list[LeafSource]
    reaches: list[tuple[int, ...]]  # per result, the leaves its graph reads

    @staticmethod
    def build(roots: list[Node], sources: dict[Node, LeafSource]) -> ResultGraph:
        """`roots` (a traced function's results) with their leaves in `sources` made replaceable."""
        leaves = [n for n in toposort(roots, stop=sources.__contains__) if n in sources]
        index = {leaf: i for i, leaf in enumerate(leaves)}
        reaches = [tuple(index[n] for n in toposort([r], stop=sources.__contains__) if n in index) for r in roots]
        free_roots, free_leaves = graph_without_data(roots, leaves)
        return ResultGraph(free_roots, free_leaves, [sources[leaf] for leaf in leaves], reaches)

    def bind(self, args: Sequence[Any], fed: Sequence[np.ndarray]) -> list[Node | None]:
        """Per result, its graph over the tensors this call reads, or None where no gradient can flow (nothing
        it reads requires grad). Call before the program runs: a tensor the call reassigns is read as it was."""
        tensors: dict[int, Tensor | None] = {}

        def leaf_tensor(i: int) -> Tensor | None:
            if i not in tensors:
                tensors[i] = self.sources[i](args, fed)
            return tensors[i]

        wanted = [root.dtype.is_floating_point and any((t := leaf_tensor(i)) is not None and t.requires_grad
                                                       for i in reach) for root, reach in zip(self.roots, self.reaches)]
        if not any(wanted):
            return [None] * len(self.roots)
        given = {leaf: _node_of(leaf_tensor(i), leaf) for i, leaf in enumerate(self.leaves)}
        substituted = iter(substitute([r for r, w in zip(self.roots, wanted) if w], given))
        return [next(substituted) if w else None for w in wanted]


def _node_of(tensor: Tensor | None, leaf: Node) -> Node:
    if tensor is None or tensor.shape != leaf.shape or tensor.dtype is not leaf.dtype:
        return leaf  # the program refuses such a call before this graph is used
    return tensor._node


def differentiable_result(node: Node, array: np.ndarray) -> Tensor:
    """A result that requires grad: `node`'s graph, with `array` (the program's result) as its known value."""
    realized_values(default_device())[node] = array
    result = Tensor(node)
    result.requires_grad = True
    return result
