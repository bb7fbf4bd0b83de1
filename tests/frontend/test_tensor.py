"""tensorgraphs.frontend.tensor: reading many tensors' values at once."""

from __future__ import annotations

import numpy as np

import tensorgraphs as tg
from tensorgraphs.frontend import tensor as tensor_module
from tensorgraphs.frontend.tensor import values_of


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
