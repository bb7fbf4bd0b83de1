"""Reverse-mode autodiff over nodes: `vjp` builds gradient graphs; `backward` and `grad` use it."""

from __future__ import annotations

from typing import Sequence

from tensorgraphs.autograd.rules import GRAD_RULES
from tensorgraphs.errors import ArgumentError, ShapeError, fail
from tensorgraphs.frontend.tensor import Tensor, as_tensor
from tensorgraphs.graph.composite import is_composite, params_of
from tensorgraphs.graph.node import Node, const, toposort
from tensorgraphs.graph.ops import Op
from tensorgraphs.runtime import tracing
from tensorgraphs.runtime.realize import realize


def vjp(roots: Sequence[Node], root_grads: Sequence[Node], wrt: Sequence[Node]) -> list[Node | None]:
    """Gradients of sum(root * root_grad) with respect to each node in `wrt` (None if unconnected)."""
    targets = set(wrt)
    order = toposort(list(roots))
    relevant: set[Node] = set()
    for node in order:
        if node.dtype.is_floating_point and (node in targets or any(s in relevant for s in node.src)):
            relevant.add(node)
    grads: dict[Node, Tensor] = {}
    for root, root_grad in zip(roots, root_grads):
        _accumulate(grads, root, Tensor(root_grad))
    for node in reversed(order):
        if node not in grads or node not in relevant or not node.src:
            continue
        for src, src_grad in zip(node.src, _input_grads(node, grads[node])):
            if src_grad is not None and src in relevant:
                _accumulate(grads, src, src_grad)
    return [grads[w].node if w in grads else None for w in wrt]


def _accumulate(grads: dict[Node, Tensor], node: Node, grad: Tensor) -> None:
    assert grad.shape == node.shape, f"gradient of {node} has shape {grad.shape}"
    previous = grads.get(node)
    grads[node] = grad if previous is None else previous + grad


def _input_grads(node: Node, grad: Tensor) -> tuple[Tensor | None, ...]:
    inputs = [Tensor(s) for s in node.src]
    if is_composite(node):
        if node.op.grad is not None:
            return node.op.grad(Tensor(node), grad, *inputs, **params_of(node))
        from tensorgraphs.frontend.composites import decompose

        grads = vjp([decompose(node)], [grad.node], list(node.src))
        return tuple(None if gr is None else Tensor(gr) for gr in grads)
    rule = GRAD_RULES.get(node.op)
    if rule is None:
        return (None,) * len(node.src)
    return rule(Tensor(node), grad, *inputs)


def _seed_gradient(output: Tensor, gradient: Tensor | None, op: str) -> Node:
    if gradient is None:
        if output.numel() != 1:
            fail(op, f"grad can be implicitly created only for scalar outputs (got shape {output.shape}); "
                 "pass gradient=", kind=ArgumentError)
        return const(1.0, output.dtype, output.shape)
    gradient = as_tensor(gradient, output.dtype)
    if gradient.shape != output.shape:
        fail(op, f"gradient has shape {gradient.shape} but the output has shape {output.shape}")
    return gradient.node


def _grad_leaves(node: Node) -> list[tuple[Node, Tensor]]:
    """BUFFER nodes under `node` owned by a leaf that requires grad.

    A leaf's buffers from before an `assign` count too: a graph built earlier still
    differentiates into the same leaf, as in PyTorch.
    """
    leaves = []
    for n in toposort([node]):
        if n.op is Op.BUFFER and n.arg.grad_leaf is not None:
            leaf = n.arg.grad_leaf()
            if leaf is not None and leaf.requires_grad:
                leaves.append((n, leaf))
    return leaves


def backward(output: Tensor, gradient: Tensor | None = None) -> None:
    """Accumulate d(output)/d(leaf) into `.grad` of every leaf that requires grad; computed now."""
    if not output.requires_grad:
        fail("backward", "element 0 of tensors does not require grad and does not have a grad_fn",
             kind=ArgumentError)
    seed = _seed_gradient(output, gradient, "backward")
    leaves = _grad_leaves(output.node)
    grads = vjp([output.node], [seed], [n for n, _ in leaves])
    per_leaf: dict[Tensor, Tensor] = {}
    for (_, leaf), gr in zip(leaves, grads):
        if gr is not None:
            per_leaf[leaf] = Tensor(gr) if leaf not in per_leaf else per_leaf[leaf] + Tensor(gr)
    totals = [total if leaf.grad is None else leaf.grad + total for leaf, total in per_leaf.items()]
    trace = tracing.active()
    if trace is not None:  # compiled: the gradients stay graphs the program computes
        for leaf, total in zip(per_leaf, totals):
            trace.note_grad(leaf)
            leaf.grad = Tensor(total.node)
        return
    # the output is computed on the way anyway: realizing it too lets a later `loss.item()` reuse the value
    values = realize([output.node] + [t.node for t in totals])[1:]
    for leaf, value in zip(per_leaf, values):
        leaf.grad = Tensor.from_numpy(value, leaf.dtype)


def grad(outputs: Tensor | Sequence[Tensor], inputs: Tensor | Sequence[Tensor],
         grad_outputs: Tensor | Sequence[Tensor | None] | None = None,
         allow_unused: bool = False, create_graph: bool = False) -> tuple[Tensor | None, ...]:
    """torch.autograd.grad: gradients of `outputs` with respect to `inputs`, as lazy tensors.

    The gradients are ordinary graphs over the same leaves, so with `create_graph` they require grad
    and can be differentiated again.
    """
    outputs = [outputs] if isinstance(outputs, Tensor) else list(outputs)
    inputs = [inputs] if isinstance(inputs, Tensor) else list(inputs)
    if grad_outputs is None or isinstance(grad_outputs, Tensor):
        grad_outputs = [grad_outputs] * len(outputs)
    if len(grad_outputs) != len(outputs):
        fail("grad", f"got {len(grad_outputs)} grad_outputs for {len(outputs)} outputs", kind=ShapeError)
    if not all(t.requires_grad for t in (*outputs, *inputs)):
        fail("grad", "every output and every differentiated tensor must require grad", kind=ArgumentError)
    seeds = [_seed_gradient(o, go, "grad") for o, go in zip(outputs, grad_outputs)]
    grads = vjp([o.node for o in outputs], seeds, [t.node for t in inputs])
    if None in grads and not allow_unused:
        fail("grad", "one of the differentiated tensors appears to not have been used in the graph; "
             "pass allow_unused=True", kind=ArgumentError)
    wrap = (lambda node: Tensor.result(node, *outputs, *inputs)) if create_graph else Tensor
    return tuple(None if gr is None else wrap(gr) for gr in grads)
