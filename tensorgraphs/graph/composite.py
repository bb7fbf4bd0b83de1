"""Composites: named ops with a reference decomposition into primitives.

The graph keeps a composite node (op = the `Composite`) until planning, so a
dedicated kernel can replace it whole; its decomposition is the oracle every
such kernel is tested against. Decompositions and gradient rules are written
with the front end's values (Tensors, which build nodes without tracking
gradients); the front end says once how a node becomes such a value
(`use_values`), so every layer below it decomposes nodes without importing it.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable, ContextManager

from tensorgraphs.dtypes import DType
from tensorgraphs.graph.node import Node, Shape

Params = tuple[tuple[str, Any], ...]


@dataclass(frozen=True, eq=False)
class Composite:
    """`decompose(*inputs, **params)` and `infer(*inputs, **params) -> (dtype, shape)` take Tensors.

    `grad(node_tensor, grad, *inputs, **params)` returns one gradient (or None) per
    input; without it autograd differentiates the decomposition. A `stored` composite's
    decomposed result is computed once per element (a separable window's column results, which
    the windows of the next dim would otherwise compute again at each of their taps): staged
    a plane or a row at a time by the kernel reading it, or in a buffer of its own
    (`schedule.fusion.decompose_stored`).
    """

    name: str
    infer: Callable[..., tuple[DType, Shape]]
    decompose: Callable[..., Any]
    grad: Callable[..., tuple[Any, ...]] | None = None
    stored: bool = False

    def __repr__(self) -> str:
        return f"Composite({self.name})"


REGISTRY: dict[str, Composite] = {}


def register(composite: Composite) -> Composite:
    if composite.name in REGISTRY:
        raise ValueError(f"composite {composite.name!r} is already registered")
    REGISTRY[composite.name] = composite
    return composite


def params_of(node: Node) -> dict[str, Any]:
    return dict(node.arg)


def make_node(composite: Composite, src: tuple[Node, ...], params: dict[str, Any], dtype: DType, shape: Shape) -> Node:
    frozen: Params = tuple(sorted((k, _freeze(v)) for k, v in params.items()))
    return Node(composite, dtype, tuple(shape), src, frozen)


def _freeze(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(_freeze(v) for v in value)
    return value


def is_composite(node: Node) -> bool:
    return isinstance(node.op, Composite)


_wrap: Callable[[Node], Any] = lambda node: node  # noqa: E731 - until a front end registers its values
_unwrap: Callable[[Any], Node] = lambda value: value  # noqa: E731
_body_context: Callable[[], ContextManager[Any]] = contextlib.nullcontext


def use_values(wrap: Callable[[Node], Any], unwrap: Callable[[Any], Node],
               body_context: Callable[[], ContextManager[Any]] = contextlib.nullcontext) -> None:
    """Decomposition bodies (and user rules) take and return the values `wrap` makes of nodes (`unwrap` gives the
    node back), and run inside `body_context()` (the front end's modes that must not reach them: autocast)."""
    global _wrap, _unwrap, _body_context
    _wrap, _unwrap, _body_context = wrap, unwrap, body_context


def body_context() -> ContextManager[Any]:
    """The context engine code runs value-written bodies in (decompositions, gradient rules): see `use_values`."""
    return _body_context()


def as_value(node: Node) -> Any:
    """`node` as the front end's value (a Tensor), for bodies written with its API."""
    return _wrap(node)


def as_node(value: Any) -> Node:
    return _unwrap(value)


def decompose(node: Node) -> Node:
    """The reference decomposition of one composite node, one level deep."""
    assert is_composite(node), node
    with body_context():
        out = as_node(node.op.decompose(*map(as_value, node.src), **params_of(node)))
    assert out.shape == node.shape and out.dtype is node.dtype, (
        f"decomposition of {node.op.name} gives {out.dtype.name}{out.shape}, expected {node.dtype.name}{node.shape}"
    )
    return out


DETACH = register(Composite("detach", infer=lambda x: (x.dtype, x.shape), decompose=lambda x: x,
                            grad=lambda out, grad, x: (None,)))


def detach_node(node: Node) -> Node:
    """`node` with gradients stopped (identity in value)."""
    if node.op is DETACH:
        return node
    return make_node(DETACH, (node,), {}, node.dtype, node.shape)
