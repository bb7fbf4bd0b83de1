"""tg.nn.init and every layer's default initialization against torch's, by a two-sample Kolmogorov-Smirnov test
on the drawn values (plus exact checks where the result is deterministic)."""

from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np
import pytest
import torch

import tensorgraphs as tg


def assert_same_distribution(mine: np.ndarray, reference: np.ndarray, label: str) -> None:
    """KS statistic below the alpha = 1e-3 critical value (seeds are fixed, so the test is deterministic)."""
    mine, reference = np.sort(mine.ravel()), np.sort(reference.ravel())
    grid = np.concatenate([mine, reference])
    gap = np.abs(np.searchsorted(mine, grid, "right") / mine.size - np.searchsorted(reference, grid, "right")
                 / reference.size).max()
    critical = 1.949 * math.sqrt((mine.size + reference.size) / (mine.size * reference.size))
    assert gap <= critical, f"{label}: KS statistic {gap:.4f} > {critical:.4f}"


LAYERS: dict[str, Callable[[Any], Any]] = {
    "Linear": lambda nn: nn.Linear(64, 256),
    "Conv2d": lambda nn: nn.Conv2d(8, 64, 3),
    "Conv1d": lambda nn: nn.Conv1d(4, 64, 5, groups=2),
    "ConvTranspose2d": lambda nn: nn.ConvTranspose2d(16, 8, 3),
    "Bilinear": lambda nn: nn.Bilinear(8, 8, 64),
    "Embedding": lambda nn: nn.Embedding(100, 32, padding_idx=3),
    "LSTM": lambda nn: nn.LSTM(16, 32),
    "GRUCell": lambda nn: nn.GRUCell(16, 32),
    "MultiheadAttention": lambda nn: nn.MultiheadAttention(32, 4),
    "LayerNorm": lambda nn: nn.LayerNorm(64),
    "BatchNorm1d": lambda nn: nn.BatchNorm1d(16),
    "GroupNorm": lambda nn: nn.GroupNorm(2, 8),
}


@pytest.mark.parametrize("name", LAYERS)
def test_default_initialization_matches_torch(name: str) -> None:
    torch.manual_seed(0)
    tg.manual_seed(0)
    reference, mine = LAYERS[name](torch.nn), LAYERS[name](tg.nn)
    mine_state = mine.state_dict()
    for key, expected in reference.state_dict().items():
        got = mine_state[key].numpy()
        assert got.shape == tuple(expected.shape) and got.dtype == expected.numpy().dtype, f"{name}.{key}"
        assert_same_distribution(got, expected.numpy(), f"{name}.{key}")
    if name == "Embedding":
        assert not np.any(mine.weight.detach().numpy()[3]), "the padding row starts at zero"


INIT_FUNCTIONS: dict[str, tuple[tuple[int, ...], Callable[[Any, Any], Any]]] = {
    "uniform_": ((2000,), lambda init, t: init.uniform_(t, -0.5, 2.0)),
    "normal_": ((2000,), lambda init, t: init.normal_(t, 1.0, 0.3)),
    "trunc_normal_": ((4000,), lambda init, t: init.trunc_normal_(t, 0.5, 1.0, -0.5, 1.0)),
    "xavier_uniform_": ((40, 60), lambda init, t: init.xavier_uniform_(t, gain=2.0)),
    "xavier_normal_": ((40, 60), lambda init, t: init.xavier_normal_(t)),
    "kaiming_uniform_": ((30, 20, 3), lambda init, t: init.kaiming_uniform_(t, mode="fan_out", nonlinearity="relu")),
    "kaiming_normal_": ((30, 20, 3), lambda init, t: init.kaiming_normal_(t, a=0.1)),
    "constant_": ((3, 4), lambda init, t: init.constant_(t, 0.25)),
    "eye_": ((3, 5), lambda init, t: init.eye_(t)),
}


@pytest.mark.parametrize("name", INIT_FUNCTIONS)
def test_init_function_matches_torch(name: str) -> None:
    shape, apply = INIT_FUNCTIONS[name]
    torch.manual_seed(0)
    tg.manual_seed(0)
    reference = apply(torch.nn.init, torch.empty(shape))
    param = tg.nn.Parameter(tg.zeros(shape))
    returned = apply(tg.nn.init, param)
    assert returned is param and param.requires_grad
    assert_same_distribution(param.detach().numpy(), reference.numpy(), name)


def test_trunc_normal_stays_in_bounds() -> None:
    tg.manual_seed(1)
    values = tg.nn.init.trunc_normal_(tg.nn.Parameter(tg.zeros(5000)), std=2.0, a=-1.0, b=1.5).detach().numpy()
    assert values.min() >= -1.0 and values.max() <= 1.5


def test_orthogonal_gives_orthonormal_rows() -> None:
    tg.manual_seed(0)
    weight = tg.nn.init.orthogonal_(tg.nn.Parameter(tg.zeros(4, 6)), gain=2.0).detach().numpy()
    np.testing.assert_allclose(weight @ weight.T, 4.0 * np.eye(4), atol=1e-5)


@pytest.mark.parametrize("nonlinearity,param", [("linear", None), ("conv2d", None), ("sigmoid", None),
                                                ("tanh", None), ("relu", None), ("leaky_relu", None),
                                                ("leaky_relu", 0.3), ("selu", None)])
def test_calculate_gain_matches_torch(nonlinearity: str, param: float | None) -> None:
    assert tg.nn.init.calculate_gain(nonlinearity, param) == pytest.approx(
        torch.nn.init.calculate_gain(nonlinearity, param))


def test_fan_needs_two_dims() -> None:
    with pytest.raises(ValueError, match="fewer than 2 dimensions"):
        tg.nn.init.xavier_uniform_(tg.nn.Parameter(tg.zeros(5)))
