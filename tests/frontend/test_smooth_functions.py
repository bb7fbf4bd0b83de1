"""Smooth float functions are composites with exact derivatives: no NaN or zero gradient where their
decompositions switch formulas (exactly 0, far tails), and values keep the sign of zero."""

import numpy as np
import pytest
import torch

import tensorgraphs as tg

POINTS = {
    "tanh": [0.0, -0.0, 1e-8, -3.0, 50.0, -100.0],
    "sigmoid": [0.0, -100.0, 100.0, 3.0],
    "asinh": [0.0, -0.0, 1e-8, 1e9, -1e9, 2.5],
    "atan": [0.0, -0.0, 1e-8, 3.0, -1e9],
    "erf": [0.0, 0.3, -2.0, 10.0],
    "sinh": [0.0, -2.0, 5.0],
    "cosh": [0.0, -2.0, 5.0],
    "atanh": [0.0, -0.5, 0.9],
    "asin": [0.0, -0.5, 0.9],
    "acos": [0.0, -0.5, 0.9],
    "acosh": [1.5, 10.0, 1e9],
    "log1p": [0.0, 1e-8, -0.5, 1e9],
    "expm1": [0.0, 1e-8, -50.0, 20.0],
}


@pytest.mark.parametrize("name", sorted(POINTS))
def test_value_and_gradient_match_torch_at_switch_points(name: str) -> None:
    data = np.array(POINTS[name], dtype=np.float32)
    x = tg.tensor(data, requires_grad=True)
    out = getattr(tg, name)(x)
    assert out.node.op.name == name, "the function should stay one composite node until planning"
    out.sum().backward()
    reference = torch.tensor(data, requires_grad=True)
    expected = getattr(torch, name)(reference)
    expected.sum().backward()
    np.testing.assert_allclose(out.detach().numpy(), expected.detach().numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(np.signbit(out.detach().numpy()), np.signbit(expected.detach().numpy()))
    np.testing.assert_allclose(x.grad.numpy(), reference.grad.numpy(), rtol=1e-4, atol=1e-6)
