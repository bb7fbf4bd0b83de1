"""`Tensor.backward` and `tg.grad`: gradients of Tensors, built by autograd's `vjp` over their nodes.

The front end's part of differentiation: which leaves own which buffers, `.grad` accumulation, torch's checks
(a freed graph, values overwritten in place), and eager backward's replay of one cached gradient program.
"""

from __future__ import annotations

import weakref
from typing import Sequence

from tensorgraphs.autograd.hooks import run_post_accumulate_grad_hooks
from tensorgraphs.autograd.vjp import input_grads, vjp
from tensorgraphs.errors import ArgumentError, AutogradError, ShapeError, UnsupportedError, fail
from tensorgraphs.frontend import gradient_rules  # noqa: F401  (registers the primitives' gradient rules)
from tensorgraphs.frontend.inplace_ops import overwritten
from tensorgraphs.frontend.tensor import Tensor, as_tensor, held
from tensorgraphs.graph.node import Node, const, structure, toposort
from tensorgraphs.graph.ops import Op
from tensorgraphs.runtime import tracing
from tensorgraphs.runtime.realize import (
    cached_executable,
    carried_with,
    default_device,
    graph_without_data,
    input_value,
    is_data_view,
    owned,
    placeholder,
    realized_values,
    view_source,
)


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
    return [(n, leaf) for n in toposort([node]) if n.op is Op.BUFFER and (leaf := _leaf_of(n)) is not None]


def _leaf_of(node: Node) -> Tensor | None:
    """The leaf that requires grad and owns the BUFFER `node`, if any."""
    owner = node.arg.grad_leaf if node.op is Op.BUFFER else None
    leaf = None if owner is None else owner()
    return leaf if leaf is not None and leaf.requires_grad else None


def _gradient_totals(output: Node, seed: Node, leaves: list[tuple[Node, Tensor]]) -> dict[Tensor, Tensor]:
    """Per leaf, its gradient after this backward: what was in `.grad` plus the sum over its buffers."""
    grads = vjp([output], [seed], [n for n, _ in leaves])
    per_leaf: dict[Tensor, Tensor] = {}
    for (_, leaf), gr in zip(leaves, grads):
        if gr is not None:
            per_leaf[leaf] = Tensor(gr) if leaf not in per_leaf else per_leaf[leaf] + Tensor(gr)
    return {leaf: total if leaf.grad is None else leaf.grad + total for leaf, total in per_leaf.items()}


_freed: weakref.WeakValueDictionary[int, Tensor] = weakref.WeakValueDictionary()
"""Outputs a backward went through without retain_graph (by id: a Tensor's == compares values)."""


def backward(output: Tensor, gradient: Tensor | None = None, retain_graph: bool | None = None,
             create_graph: bool = False) -> None:
    """Accumulate d(output)/d(leaf) into `.grad` of every leaf that requires grad; computed now.

    Eager: the gradient graph is built once per structure of the differentiated graph (which buffers belong to
    which leaves, which leaves have a `.grad` already) and later only run on the current arrays. As in torch, a
    second backward from the same output needs `retain_graph=True` on the first."""
    if not output.requires_grad:
        fail("backward", "element 0 of tensors does not require grad and does not have a grad_fn",
             kind=ArgumentError)
    if create_graph:
        fail("backward", "create_graph=True is not supported; use tg.grad(..., create_graph=True)",
             kind=UnsupportedError)
    if _freed.get(id(output)) is output:
        fail("backward", "Trying to backward through the graph a second time (or directly access saved tensors "
             "after they have already been freed). Specify retain_graph=True if you need to backward through the "
             "graph a second time", kind=AutogradError)
    seed = _seed_gradient(output, gradient, "backward")
    check_versions(output.node)
    if not retain_graph:
        _freed[id(output)] = output
    trace = tracing.active()
    if trace is not None:  # compiled: the gradients stay graphs the program computes
        totals = _gradient_totals(output.node, seed, _grad_leaves(output.node))
        for leaf, total in totals.items():
            trace.note_grad(leaf)
            leaf.grad = Tensor(total.node)
        run_post_accumulate_grad_hooks(totals)
        return
    state = carried_with([output.node])  # a hidden state carried to the next step: computed along
    key, inputs = structure([output.node, seed, *state], lambda n: n.op is Op.BUFFER or is_data_view(n))
    tracing.refuse_placeholders("backward", map(view_source, inputs))
    owners = [_leaf_of(n) for n in inputs]
    leaves = list(dict.fromkeys(leaf for leaf in owners if leaf is not None))
    number = {leaf: i for i, leaf in enumerate(leaves)}
    layout = (key, tuple(-1 if leaf is None else number[leaf] for leaf in owners),
              tuple(None if leaf.grad is None else (leaf.grad.dtype, leaf.grad.shape) for leaf in leaves))
    run, updated = cached_executable(("backward", layout),
                                     lambda: _backward_graph(output, seed, state, inputs, owners))
    arrays = [input_value(n) for n in inputs] + [leaf.grad._value() for leaf in leaves if leaf.grad is not None]
    values = owned(run(arrays), arrays)
    known = realized_values(default_device())
    known[output.node] = values[0]  # a later `loss.item()` reuses it
    for node, value in zip(state, values[len(values) - len(state):]):
        known[node] = value
    for index, value in zip(updated, values[1:]):
        leaves[index].grad = held(value, leaves[index].dtype)
    run_post_accumulate_grad_hooks(leaves[index] for index in updated)


def check_versions(output: Node) -> None:
    """torch's saved-tensor check: raise when the gradient of `output` needs a value that an in-place op has
    overwritten since it was used (`inplace_ops.overwritten`); the op that overwrote it may read it."""
    if not overwritten:
        return
    forward = toposort([output])
    changed = [n for n in forward if n in overwritten]
    if not changed:
        return
    inside, relevant, changed_set = set(forward), set(), set(changed)
    for node in forward:
        if node.dtype.is_floating_point and any(s in relevant for s in node.src):
            relevant.add(node)
            if node not in changed_set and not changed_set.intersection(node.src):
                continue  # a gradient rule reads its node and its inputs only
            for value in _values_read(node, inside, relevant).intersection(changed):
                if node not in _written_from(value):
                    fail("backward", "one of the variables needed for gradient computation has been modified by an "
                         f"inplace operation: [{value.dtype.name} {list(value.shape)}] was written in place after "
                         "it was used; clone() it before the in-place op", kind=AutogradError)
        elif node.op is Op.BUFFER and _leaf_of(node) is not None:
            relevant.add(node)


def _values_read(node: Node, forward: set[Node], relevant: set[Node]) -> set[Node]:
    """The values of the forward graph that `node`'s gradient rule reads for its `relevant` inputs."""
    seed = placeholder(node.dtype, node.shape)
    grads = input_grads(node, Tensor(seed))
    stack = [gr.node for gr, src in zip(grads, node.src) if gr is not None and src in relevant]
    seen: set[Node] = set()
    found: set[Node] = set()
    while stack:
        n = stack.pop()
        if n in seen or n is seed:
            continue
        seen.add(n)
        if n in forward:
            found.add(n)
        else:
            stack.extend(n.src)
    return found


def _written_from(value: Node) -> set[Node]:
    """The nodes of the in-place op that overwrote `value`: between it and the node that replaced it."""
    written = overwritten[value]()
    reached = {value}
    for n in toposort([] if written is None else [written]):
        if any(s in reached for s in n.src):
            reached.add(n)
    return reached - {value}


def _backward_graph(output: Tensor, seed: Node, state: list[Node], inputs: list[Node],
                    owners: list[Tensor | None]) -> tuple[list[Node], list[Node], list[int]]:
    """`backward`'s graph over placeholders: roots (the output, each updated leaf's new gradient, then the carried
    `state`), inputs (`inputs`' placeholders, then those of the leaves' present gradients) and the updated leaves'
    numbers."""
    (output_node, seed_node, *state_nodes), free = graph_without_data([output.node, seed, *state], inputs)
    leaves = list(dict.fromkeys(leaf for leaf in owners if leaf is not None))
    stand_ins = [Tensor(placeholder(leaf.dtype, leaf.shape)) for leaf in leaves]  # take `.grad` like `leaves`
    present = [Tensor(placeholder(leaf.grad.dtype, leaf.grad.shape)) for leaf in leaves if leaf.grad is not None]
    for stand_in, grad in zip((s for s, leaf in zip(stand_ins, leaves) if leaf.grad is not None), present):
        stand_in.grad = grad
    number = {leaf: i for i, leaf in enumerate(leaves)}
    buffers = [(node, stand_ins[number[leaf]]) for node, leaf in zip(free, owners) if leaf is not None]
    totals = _gradient_totals(output_node, seed_node, buffers)
    updated = [number_of for number_of, stand_in in enumerate(stand_ins) if stand_in in totals]
    roots = [output_node] + [totals[stand_ins[i]].node for i in updated] + state_nodes
    return roots, free + [g.node for g in present], updated


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
    for output in outputs:
        check_versions(output.node)
    grads = vjp([o.node for o in outputs], seeds, [t.node for t in inputs])
    if None in grads and not allow_unused:
        fail("grad", "one of the differentiated tensors appears to not have been used in the graph; "
             "pass allow_unused=True", kind=ArgumentError)
    wrap = (lambda node: Tensor.result(node, *outputs, *inputs)) if create_graph else Tensor
    return tuple(None if gr is None else wrap(gr) for gr in grads)
