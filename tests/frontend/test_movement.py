"""Movement ops against torch on the cases where their conventions are easy to get wrong."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tensorgraphs as tg

EMPTY_1D = (0,)
CAT_CASES = [  # (shape, dtype) of each input
    [(EMPTY_1D, "int64"), (EMPTY_1D, "float32")],
    [(EMPTY_1D, "bool"), (EMPTY_1D, "int8")],
    [(EMPTY_1D, "float64"), ((2, 3), "float32")],
    [((2, 3), "int32"), (EMPTY_1D, "float16")],
    [((0, 3), "int64"), (EMPTY_1D, "float32")],
    [(EMPTY_1D, "uint8"), ((0, 3), "int8"), ((2, 3), "bool")],
]


@pytest.mark.parametrize("inputs", CAT_CASES, ids=lambda c: "-".join(f"{s}{d}" for s, d in c))
def test_cat_promotes_over_every_input_including_skipped_empty_ones(inputs: list) -> None:
    """torch leaves 1-d empty inputs out of the shape checks, not out of the result's dtype."""
    arrays = [np.arange(int(np.prod(shape))).reshape(shape).astype(dtype) for shape, dtype in inputs]
    expected = torch.cat([torch.from_numpy(a) for a in arrays])
    got = tg.cat([tg.tensor(a) for a in arrays])
    assert got.dtype.name == str(expected.dtype).removeprefix("torch.")
    assert got.shape == tuple(expected.shape)
    np.testing.assert_array_equal(got.numpy(), expected.numpy())
