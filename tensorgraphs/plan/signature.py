"""What a kernel call computes, independent of which data it computes on.

A `Signature` is a composite (or primitive) name, its parameters and the dtypes
and shapes of its inputs and output: the structural key of one node with its
inputs anonymous. Plans are cached by it (so twelve identical layers are planned
once), measurements are stored by it, and its work (floating-point operations,
bytes moved) is the feature vector of the cost model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from tensorgraphs.dtypes import DType
from tensorgraphs.graph.composite import is_composite
from tensorgraphs.graph.node import Node, Shape, buffer
from tensorgraphs.graph.ops import ELEMENTWISE, REDUCE, SOURCES, Op


@dataclass(frozen=True)
class TensorSpec:
    dtype: DType
    shape: Shape

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    def __str__(self) -> str:
        return f"{self.dtype.name}{list(self.shape)}"


@dataclass(frozen=True, eq=False)
class Signature:
    """`name` is a composite's name or a primitive `Op`'s name; `params` the node's (sorted) arguments."""

    name: str
    params: tuple[tuple[str, Any], ...]
    inputs: tuple[TensorSpec, ...]
    output: TensorSpec

    def __post_init__(self) -> None:
        specs = tuple((s.dtype.name, s.shape) for s in (*self.inputs, self.output))
        object.__setattr__(self, "key", (self.name, repr(self.params), specs))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Signature) and self.key == other.key

    def __hash__(self) -> int:
        return hash(self.key)

    @property
    def dtype_key(self) -> str:
        """The dtype column of a database row: the input dtypes (the output's for sources)."""
        return ",".join(s.dtype.name for s in self.inputs) or self.output.dtype.name

    @property
    def shape_key(self) -> str:
        """The shape column of a database row: input shapes and parameters."""
        shapes = "x".join(str(list(s.shape)) for s in self.inputs) or str(list(self.output.shape))
        return f"{shapes} {dict(self.params)}" if self.params else shapes

    @property
    def flops(self) -> float:
        return float(FLOPS.get(self.name, _elementwise_flops)(self))

    @property
    def bytes(self) -> float:
        """Bytes read and written when every input and the output are materialized once (views move none)."""
        if self.name in VIEWS:
            return 0.0
        return float(sum(s.nbytes for s in self.inputs) + self.output.nbytes)

    def __str__(self) -> str:
        arguments = [*map(str, self.inputs), *(f"{k}={v!r}" for k, v in self.params)]
        return f"{self.name}({', '.join(arguments)}) -> {self.output}"


def signature_of(node: Node) -> Signature:
    name = node.op.name
    params = node.arg if is_composite(node) else (() if node.arg is None else (("arg", node.arg),))
    return Signature(name, params, tuple(TensorSpec(s.dtype, s.shape) for s in node.src),
                     TensorSpec(node.dtype, node.shape))


def _elementwise_flops(sig: Signature) -> int:
    return sig.output.size


def _matmul_flops(sig: Signature) -> int:
    return 2 * sig.output.size * sig.inputs[0].shape[-1]


def _conv2d_flops(sig: Signature) -> int:
    """Multiply-adds of the direct sum, twice: each output element over its group's channels and kernel taps."""
    return 2 * sig.output.size * math.prod(sig.inputs[1].shape[1:])


def _per_element(flops: int) -> Callable[[Signature], int]:
    return lambda sig: flops * sig.output.size


def _reduction_flops(sig: Signature) -> int:
    return sig.inputs[0].size


def _no_flops(sig: Signature) -> int:
    return 0


VIEWS = frozenset(op.name for op in (Op.RESHAPE, Op.PERMUTE, Op.EXPAND, Op.SHRINK, Op.FLIP))

# Work of each composite (and primitive): rough operation counts, enough for a roofline and as a regression feature.
FLOPS: dict[str, Callable[[Signature], int]] = {
    "matmul": _matmul_flops,
    "conv2d": _conv2d_flops,
    "softmax": _per_element(5),
    "log_softmax": _per_element(5),
    "layer_norm": _per_element(8),
    "gelu": _per_element(30),
    "erf": _per_element(25),
    **{op.name: _elementwise_flops for op in ELEMENTWISE},
    **{op.name: _reduction_flops for op in REDUCE},
    **{op.name: _no_flops for op in (*SOURCES, Op.RESHAPE, Op.PERMUTE, Op.EXPAND, Op.SHRINK, Op.PAD, Op.FLIP)},
}


def placeholder(spec: TensorSpec) -> Node:
    """A BUFFER node of `spec` holding no data (zeros broadcast), a new one on each call."""
    from tensorgraphs.runtime.buffer import Buffer

    data = np.broadcast_to(spec.dtype.storage(0), spec.shape)
    return buffer(Buffer("numpy", spec.dtype, spec.shape, data), spec.dtype, spec.shape)


def placeholder_node(sig: Signature) -> Node:
    """A node computing `sig` over placeholder buffers (no data): what planning decomposes and inspects."""
    from tensorgraphs.graph.composite import REGISTRY, make_node

    sources = tuple(placeholder(s) for s in sig.inputs)
    if sig.name in REGISTRY:
        return make_node(REGISTRY[sig.name], sources, dict(sig.params), sig.output.dtype, sig.output.shape)
    return Node(Op[sig.name], sig.output.dtype, sig.output.shape, sources, dict(sig.params).get("arg"))
