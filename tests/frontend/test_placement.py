"""Device arguments: `.to(device)`, `module.to(device)`, `device=` take tg.device, torch.device and strings."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tensorgraphs as tg
from tensorgraphs.errors import UnsupportedError

DEVICES = [tg.device("cpu"), torch.device("cpu"), "cpu", "numpy"]


@pytest.mark.parametrize("device", DEVICES, ids=str)
def test_device_arguments_are_accepted_and_keep_values(device: object) -> None:
    x = tg.tensor([1.5, -2.0], device=device)
    assert x.to(device) is x
    np.testing.assert_array_equal(x.to(device, tg.float64).numpy(), np.array([1.5, -2.0]))
    assert x.to(device=device, dtype=torch.float16).dtype is tg.float16
    assert tg.zeros(2, 3, device=device).shape == (2, 3)
    model = tg.nn.Linear(2, 3)
    assert model.to(device) is model and model.weight.dtype is tg.float32
    assert model.to(device, tg.float64).weight.dtype is tg.float64


@pytest.mark.parametrize("call", [
    lambda: tg.ones(2).to("cuda"),
    lambda: tg.ones(2).to(torch.device("cuda", 0), tg.float16),
    lambda: tg.nn.Linear(2, 2).to(tg.device("cuda")),
    lambda: tg.zeros(3, device="cuda"),
    lambda: tg.tensor([1.0], device="mps"),
], ids=["tensor.to", "tensor.to-torch-device", "module.to", "zeros", "tensor"])
def test_missing_devices_raise_at_the_call(call: object) -> None:
    with pytest.raises(UnsupportedError, match="tensorgraphs has no '(cuda|mps)' device.*test_placement.py"):
        call()  # type: ignore[operator]


def test_to_rejects_unknown_keywords() -> None:
    with pytest.raises(TypeError, match="unexpected keyword argument 'dvice'"):
        tg.ones(2).to(dvice="cpu")
