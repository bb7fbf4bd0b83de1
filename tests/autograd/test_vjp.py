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


def test_products_of_equally_shaped_operands_join_into_one_product_matching_torch() -> None:
    """The gradient of a weight used by several products (an unrolled recurrence's W_hh: one product per time step)
    is one product of the joined operands, [a_1 .. a_n] @ [b_1; ..; b_n], not n small products summed; a product of
    other shapes is added to it. Values as torch's, on the reference interpreter and on the cpu device."""
    rng = np.random.default_rng(11)
    steps = [rng.standard_normal((2, 8)).astype(np.float32) for _ in range(4)]
    other = rng.standard_normal((3, 8)).astype(np.float32)
    weight = rng.standard_normal((8, 9)).astype(np.float32)

    def loss(w: Any, xs: list[Any], y: Any) -> Any:
        return sum(((x @ w).tanh() * (t + 1)).sum() for t, x in enumerate(xs)) + (y @ w).sin().sum()

    w = tg.tensor(weight, requires_grad=True)
    (grad,) = vjp([loss(w, [tg.tensor(s) for s in steps], tg.tensor(other)).node], [g.const(1.0, tg.float32, ())],
                  [w.node])
    products = [n for n in grad.toposort() if is_composite(n) and n.op.name == "matmul" and n.shape == weight.shape]
    assert sorted(p.src[0].shape for p in products) == [(8, 3), (8, 8)], "the four (8, 2) @ (2, 9) are one"
    tw = torch.tensor(weight, requires_grad=True)
    loss(tw, [torch.tensor(s) for s in steps], torch.tensor(other)).backward()
    np.testing.assert_allclose(REFERENCE.evaluate([grad])[0], tw.grad.numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(tg.Tensor(grad).numpy(), tw.grad.numpy(), rtol=1e-5, atol=1e-5)


def test_products_whose_join_copies_more_than_their_sum_stay_apart() -> None:
    """The input gradient of q, k and v projections of one x: three (M, E) @ (E, E) products. Joined, the
    operands to copy (3E(M + E)) outweigh the sums (2ME): they stay three products, added."""
    rng = np.random.default_rng(12)
    x = tg.tensor(rng.standard_normal((6, 8)).astype(np.float32), requires_grad=True)
    weights = [tg.tensor(rng.standard_normal((8, 8)).astype(np.float32)) for _ in range(3)]
    loss = sum(((x @ w).tanh() * (i + 1)).sum() for i, w in enumerate(weights))
    (grad,) = vjp([loss.node], [g.const(1.0, tg.float32, ())], [x.node])
    backward = [n for n in grad.toposort() if is_composite(n) and n.op.name == "matmul" and n.src[0] is not x.node]
    assert [n.src[0].shape for n in backward] == [(6, 8)] * 3


def test_an_unrolled_lstm_computes_each_weight_gradient_as_one_product() -> None:
    """A 2-layer LSTM over 6 time steps: every weight gradient is one product over all time steps (W_hh's:
    (H, T*N) @ (T*N, 4H), as torch and cuDNN compute it), so the gradients hold the recurrence's own products only:
    14 forward (one per layer and step, plus each layer's input projection), 10 for h (none into the initial
    state, which needs no gradient), 2 for W_hh, 2 for W_ih and 1 into layer 1's input."""
    length, batch, hidden = 6, 2, 8
    lstm = tg.nn.LSTM(5, hidden, 2)
    out, (h, c) = lstm(tg.tensor(np.random.default_rng(2).standard_normal((length, batch, 5)).astype(np.float32)))
    loss = out.sum() + (h * c).sum()
    weights = dict(lstm.named_parameters())
    grads = vjp([loss.node], [g.const(1.0, tg.float32, ())], [w.node for w in weights.values()])
    products = [n for n in g.toposort(grads) if is_composite(n) and n.op.name == "matmul"]
    assert len(products) == 14 + 10 + 2 + 2 + 1
    for layer in range(2):
        (w_hh_grad,) = [n for n in products if n.shape == (hidden, 4 * hidden) and n.src[0].shape[-1] > batch
                        and n in g.toposort([grads[list(weights).index(f"weight_hh_l{layer}")]])]
        assert w_hh_grad.src[0].shape == (hidden, length * batch), f"layer {layer}"
