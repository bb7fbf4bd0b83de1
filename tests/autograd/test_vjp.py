"""autograd.vjp: the gradient graph of a graph of nodes, built without the front end's API."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

import tensorgraphs as tg
from tensorgraphs.autograd.vjp import vjp
from tensorgraphs.backends.numpy_backend import REFERENCE
from tensorgraphs.graph import node as g
from tensorgraphs.graph.composite import is_composite
from tensorgraphs.graph.ops import Op


def test_vjp_of_a_node_graph_matches_torch_and_leaves_unconnected_nodes_none() -> None:
    """sum(sin(x) * x * y) over nodes: d/dx and d/dy as torch computes them; a node the root does not read has no
    gradient."""
    rng = np.random.default_rng(7)
    arrays = [rng.standard_normal((3, 4)) for _ in range(3)]
    x, y, unused = (tg.tensor(a).node for a in arrays)
    product = g.binary(Op.MUL, g.binary(Op.MUL, g.unary(Op.SIN, x), x), y)
    root = g.reduce(Op.REDUCE_SUM, product, (0, 1))
    seed = g.const(1.0, root.dtype, root.shape)
    dx, dy, none = vjp([root], [seed], [x, y, unused])
    got = REFERENCE.evaluate([dx, dy])
    tx, ty = (torch.tensor(a, requires_grad=True) for a in arrays[:2])
    expected = torch.autograd.grad((torch.sin(tx) * tx * ty).sum(), [tx, ty])
    for position, (value, want) in enumerate(zip(got, expected, strict=True)):
        np.testing.assert_allclose(value, want.numpy(), rtol=1e-12, err_msg=f"gradient {position}")
    assert none is None


def test_a_composite_input_computed_from_another_input_is_counted_once() -> None:
    """A composite without a gradient rule of its own is differentiated through its decomposition; an input made
    from another input (layer_norm's weight a row of x, attention's keys a function of the queries) must pass its
    gradient on to that input once, as torch does, not also inside the decomposition (which doubled that path)."""
    rng = np.random.default_rng(3)
    data = rng.standard_normal((4, 4)).astype(np.float32)

    def cases(F):  # the same expressions written for tg and for torch
        heads = lambda t: t.reshape(1, 1, 4, 4)  # noqa: E731
        return {
            "layer_norm weight=2*x[0]": lambda x: F.layer_norm(x, (4,), x[0] * 2, x[1]),
            "attention k=2x v=exp(x)": lambda x: F.scaled_dot_product_attention(heads(x), heads(x * 2), heads(x.exp())),
            "matmul x @ relu(x)": lambda x: x @ x.relu(),
        }

    for (name, ours), theirs in zip(cases(tg.nn.functional).items(), cases(torch.nn.functional).values()):
        x = tg.tensor(data, requires_grad=True)
        (ours(x) * tg.tensor(np.arange(16, dtype=np.float32).reshape(4, 4))).sum().backward()
        tx = torch.tensor(data, requires_grad=True)
        (theirs(tx) * torch.arange(16, dtype=torch.float32).reshape(4, 4)).sum().backward()
        with tg.device("numpy"):
            got = x.grad.numpy()
        np.testing.assert_allclose(got, tx.grad.numpy(), rtol=1e-4, atol=1e-4, err_msg=name)


def _slices(x: Any) -> list[Any]:
    """Pieces of x along its last axis: three of four chunks (a gap where the third was) and a slice overlapping
    two of them."""
    a, b, _, d = x.chunk(4, -1)
    return [a, b, d, x[:, 1:3]]


def test_slices_gradients_join_into_one_concatenation_matching_torch() -> None:
    """The gradients of disjoint slices along one axis (a split's pieces, an LSTM's gates and time steps) become
    one concatenation, as torch's split backward does, not a sum of zero-padded pieces each evaluated at every
    element; overlapping slices are added. Values and the sign of zero equal torch's."""
    rng = np.random.default_rng(5)
    data = rng.standard_normal((3, 8)).astype(np.float32)
    weights = [-0.0, *rng.standard_normal(3).astype(np.float32)]  # -0.0: a slice's gradient that is negative zero

    def loss(x: Any) -> Any:
        return sum((piece.sin() * float(w)).sum() for piece, w in zip(_slices(x), weights))

    x = tg.tensor(data, requires_grad=True)
    (grad,) = vjp([loss(x).node], [g.const(1.0, tg.float32, ())], [x.node])
    nodes = grad.toposort()
    assert [n.op for n in nodes].count(Op.PAD) == 1, "only the overlapping slice is padded and added"
    (joined,) = [n for n in nodes if is_composite(n) and n.op.name == "cat"]
    assert [piece.shape[-1] for piece in joined.src] == [2, 2, 2, 2]
    tx = torch.tensor(data, requires_grad=True)
    loss(tx).backward()
    (got,) = REFERENCE.evaluate([grad])
    np.testing.assert_allclose(got, tx.grad.numpy(), rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(np.signbit(got[:, :2]), np.signbit(tx.grad.numpy()[:, :2]))
