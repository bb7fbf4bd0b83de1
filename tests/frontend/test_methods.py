"""Tensor methods that torch code calls on tensors directly."""

from __future__ import annotations

import pytest
import torch

import tensorgraphs as tg


def test_tensor_format_spec_matches_torch() -> None:
    assert f"{tg.tensor(1.23456):.4f}" == f"{torch.tensor(1.23456):.4f}"
    assert f"{tg.tensor(7):>4}" == f"{torch.tensor(7):>4}"
    with pytest.raises(TypeError, match="unsupported format string"):
        f"{tg.ones(2):.3f}"
