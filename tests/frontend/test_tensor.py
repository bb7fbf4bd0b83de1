"""tensorgraphs.frontend.tensor: reading many tensors' values at once, the nodes an op builds."""

from __future__ import annotations

import numpy as np

import tensorgraphs as tg
from tensorgraphs.frontend import tensor as tensor_module
from tensorgraphs.frontend.tensor import values_of
from tensorgraphs.graph.ops import Op


def test_values_of_reads_held_buffers_and_realizes_the_rest_together(count_calls) -> None:
    rng = np.random.default_rng(0)
    a_np, b_np = rng.standard_normal((3, 4)), rng.standard_normal((3, 4))
    a, b = tg.tensor(a_np, dtype=tg.float32), tg.tensor(b_np, dtype=tg.bfloat16)
    total, scaled = a + 1.0, (a * 2.0).sum(0)
    calls = count_calls(tensor_module, "realize")

    values = values_of([a, total, b, scaled, total])

    assert calls["realize"] == 1  # the pending values are one graph
    assert values[0] is a.node.arg.data  # a held buffer is read, not copied
    np.testing.assert_allclose(values[1], a_np.astype(np.float32) + 1, rtol=1e-6)
    np.testing.assert_array_equal(values[2], b._value())
    np.testing.assert_allclose(values[3], (a_np.astype(np.float32) * 2).sum(0), rtol=1e-6)
    assert values[4] is values[1]
    assert all(v.dtype == np.float32 for v in values)


def test_operands_of_one_dtype_and_shape_add_only_the_op_and_a_scalar_one_constant_of_their_shape() -> None:
    """Counted graph work: `x + y` builds one node, `x * 2.0` two (the constant already broadcast, the product)."""
    rng = np.random.default_rng(1)
    x_np, y_np = rng.standard_normal((3, 4)).astype(np.float32), rng.standard_normal((3, 4)).astype(np.float32)
    x, y = tg.tensor(x_np), tg.tensor(y_np)
    total, product = x + y, x * 2.0
    assert [n.op for n in total.node.toposort()].count(Op.BUFFER) == 2 and len(total.node.toposort()) == 3
    constants = [n for n in product.node.toposort() if n.op is Op.CONST]
    assert len(product.node.toposort()) == 3 and [c.shape for c in constants] == [(3, 4)]
    np.testing.assert_array_equal(total.numpy(), x_np + y_np)
    np.testing.assert_array_equal(product.numpy(), x_np * np.float32(2.0))
    assert (tg.tensor([1, 2]) * 2.5).dtype is tg.float32 and (tg.tensor([1, 2]) / tg.tensor([2, 2])).dtype is tg.float32
