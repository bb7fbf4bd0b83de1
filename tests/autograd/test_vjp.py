"""autograd.vjp: the gradient graph of a graph of nodes, built without the front end's API."""

from __future__ import annotations

import numpy as np
import torch

import tensorgraphs as tg
from tensorgraphs.autograd.vjp import vjp
from tensorgraphs.backends.numpy_backend import REFERENCE
from tensorgraphs.graph import node as g
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
