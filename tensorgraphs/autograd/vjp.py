"""Reverse-mode autodiff over nodes: `vjp` builds the gradient graph of a graph.

Gradient rules (`autograd.rules`, and a composite's own `grad`) are written with the front end's values; they are
called on `graph.composite.as_value` of the nodes, as decompositions are, so this layer never imports the front end.
"""

from __future__ import annotations

from typing import Any, Sequence

from tensorgraphs.autograd.rules import GRAD_RULES, GRADIENT_SUM
from tensorgraphs.graph.composite import as_node, as_value, body_context, decompose, is_composite, params_of
from tensorgraphs.graph.node import Node, toposort


def vjp(roots: Sequence[Node], root_grads: Sequence[Node], wrt: Sequence[Node], *,
        wrt_are_leaves: bool = False) -> list[Node | None]:
    """Gradients of sum(root * root_grad) with respect to each node in `wrt` (None if unconnected). With
    `wrt_are_leaves`, a gradient stops at the `wrt` nodes (partial derivatives: one `wrt` node computed from another
    passes nothing on to it). The rules run in the front end's `body_context` (as in torch, autocast does not reach
    the backward pass: each gradient takes the dtype of the forward value it is for)."""
    with body_context():
        return _vjp(roots, root_grads, wrt, wrt_are_leaves)


def _vjp(roots: Sequence[Node], root_grads: Sequence[Node], wrt: Sequence[Node],
         wrt_are_leaves: bool) -> list[Node | None]:
    targets = set(wrt)
    order = toposort(list(roots))
    relevant: set[Node] = set()
    for node in order:
        if node.dtype.is_floating_point and (node in targets or any(s in relevant for s in node.src)):
            relevant.add(node)
    contributions: dict[Node, list[Any]] = {}
    for root, root_grad in zip(roots, root_grads):
        _accumulate(contributions, root, as_value(root_grad))
    for node in reversed(order):
        if node not in contributions or node not in relevant or not node.src or (wrt_are_leaves and node in targets):
            continue
        for src, src_grad in zip(node.src, input_grads(node, _total(contributions, node))):
            if src_grad is not None and src in relevant:
                _accumulate(contributions, src, src_grad)
    return [as_node(_total(contributions, w)) if w in contributions else None for w in wrt]


def _accumulate(contributions: dict[Node, list[Any]], node: Node, grad: Any) -> None:
    assert grad.shape == node.shape, f"gradient of {node} has shape {grad.shape}"
    contributions.setdefault(node, []).append(grad)


def _total(contributions: dict[Node, list[Any]], node: Node) -> Any:
    """`node`'s whole gradient: its contributions summed once all have arrived (`rules.GRADIENT_SUM`)."""
    parts = contributions[node]
    if len(parts) > 1:
        contributions[node] = parts = [GRADIENT_SUM[0](parts)]
    return parts[0]


def input_grads(node: Node, grad: Any) -> tuple[Any, ...]:
    """The gradient (a value, or None) of each of `node`'s inputs, given the value `grad` of its own."""
    inputs = [as_value(s) for s in node.src]
    if is_composite(node):
        if node.op.grad is not None:
            return node.op.grad(as_value(node), grad, *inputs, **params_of(node))

        # a node read at two positions (attention(x, x, x)) gets its whole gradient once, not once per position;
        # an input computed from another (layer_norm(x, weight=2 * x)) passes nothing on to it here: the outer
        # pass does, through the input's own gradient
        distinct = list(dict.fromkeys(node.src))
        total = dict(zip(distinct, vjp([decompose(node)], [as_node(grad)], distinct, wrt_are_leaves=True)))
        first = {src: position for position, src in reversed(list(enumerate(node.src)))}
        return tuple(None if total[s] is None or first[s] != i else as_value(total[s])
                     for i, s in enumerate(node.src))
    rule = GRAD_RULES.get(node.op)
    if rule is None:
        return (None,) * len(node.src)
    return rule(as_value(node), grad, *inputs)
