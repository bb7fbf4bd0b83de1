"""Decomposing composite nodes, and the `detach` composite that stops gradients."""

from __future__ import annotations

from tensorgraphs.graph.composite import Composite, is_composite, make_node, params_of, register
from tensorgraphs.graph.node import Node


def decompose(node: Node) -> Node:
    """The reference decomposition of one composite node, one level deep."""
    from tensorgraphs.frontend.tensor import Tensor

    assert is_composite(node), node
    inputs = [Tensor(s) for s in node.src]
    out = node.op.decompose(*inputs, **params_of(node)).node
    assert out.shape == node.shape and out.dtype is node.dtype, (
        f"decomposition of {node.op.name} gives {out.dtype.name}{out.shape}, expected {node.dtype.name}{node.shape}"
    )
    return out


DETACH = register(
    Composite(
        "detach",
        infer=lambda x: (x.dtype, x.shape),
        decompose=lambda x: x,
        grad=lambda out, grad, x: (None,),
    )
)


def detach_node(node: Node) -> Node:
    """`node` with gradients stopped (identity in value)."""
    if node.op is DETACH:
        return node
    return make_node(DETACH, (node,), {}, node.dtype, node.shape)
