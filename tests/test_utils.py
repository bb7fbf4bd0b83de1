"""torch's module paths: tg.utils.data is tg.data."""

from __future__ import annotations

import numpy as np
import torch

import tensorgraphs as tg


def test_utils_data_is_the_data_module() -> None:
    import tensorgraphs.utils.data as utils_data
    from tensorgraphs.utils.data import DataLoader, TensorDataset

    assert utils_data is tg.data and tg.utils.data is tg.data
    assert DataLoader is tg.data.DataLoader and TensorDataset is tg.data.TensorDataset


WEIGHTS = {"weight": np.array([[0.5, -0.25, 1.0]], np.float32), "bias": np.array([0.1], np.float32)}


def torch_style_training(lib) -> list[str]:
    """A torch script's idioms, written once against `lib` (torch or tg): device choice, module.to(device),
    tensors made on it, utils.data loading, a bare @no_grad evaluation and formatted losses."""
    device = lib.device("cuda" if lib.cuda.is_available() else "cpu")
    model = lib.nn.Linear(3, 1).to(device)
    model.load_state_dict({name: lib.tensor(value, device=device) for name, value in WEIGHTS.items()})
    features = lib.tensor(np.linspace(-1, 1, 24, dtype=np.float32).reshape(8, 3), device=device)
    targets = features.sum(1, keepdim=True)
    loader = lib.utils.data.DataLoader(lib.utils.data.TensorDataset(features, targets), batch_size=4)
    optimizer = lib.optim.RAdam(model.parameters(), lr=0.1, weight_decay=0.01)

    @lib.no_grad
    def evaluate() -> object:
        return lib.nn.functional.mse_loss(model(features), targets)

    lines = []
    for _ in range(3):
        for x, y in loader:
            optimizer.zero_grad()
            loss = lib.nn.functional.mse_loss(model(x.to(device)), y.to(device))
            loss.backward()
            optimizer.step()
            lines.append(f"{loss:.4f}")
    return [*lines, f"eval {evaluate():.4f}"]


def test_torch_style_script_idioms_match_torch() -> None:
    assert torch_style_training(tg) == torch_style_training(torch)
