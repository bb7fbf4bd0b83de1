"""Decomposing composite nodes; the `detach` composite that stops gradients and the `clone` one that copies."""

from __future__ import annotations

from typing import Any, Callable

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


def _identity(name: str, grad: Callable[..., tuple[Any, ...]]) -> Composite:
    """A composite whose value is its input's, with its own gradient rule."""
    return register(Composite(name, infer=lambda x: (x.dtype, x.shape), decompose=lambda x: x, grad=grad))


DETACH = _identity("detach", lambda out, grad, x: (None,))


def detach_node(node: Node) -> Node:
    """`node` with gradients stopped (identity in value)."""
    if node.op is DETACH:
        return node
    return make_node(DETACH, (node,), {}, node.dtype, node.shape)


CLONE = _identity("clone", lambda out, grad, x: (grad,))


def clone_node(node: Node) -> Node:
    """A node of its own with `node`'s value (identity in value and gradient), so an in-place write into a clone
    does not count as a write into the original (`inplace.overwritten`)."""
    return make_node(CLONE, (node,), {}, node.dtype, node.shape)
