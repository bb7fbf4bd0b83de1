"""The benchmark model of bench/train.py trains to the same losses in tg as in PyTorch from the same weights.

The model and its data recipe are bench/train.py's own (`build_model`, `make_data`), so the test follows the
benchmark if it changes: pre-LN TransformerEncoderLayer (d_model 256, 4 heads, ffn 1024, GELU-tanh, batch_first,
norm_first, no dropout), MSE loss to a random target, Adam lr 1e-3, the same batch every step.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
import torch
import torch.nn.functional as TF

import tensorgraphs as tg
import tensorgraphs.nn.functional as F
from tensorgraphs.testing.mixed_precision import assert_tracks_torch

EQUIVALENCE_STEPS = 50
AUTOCAST_STEPS = 200
BENCH_TRAIN = Path(__file__).parents[2] / "bench" / "train.py"


def load_bench_train() -> ModuleType:
    """bench/train.py as a module (bench is a folder of scripts, not a package)."""
    spec = importlib.util.spec_from_file_location("bench_train", BENCH_TRAIN)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the file runs
    spec.loader.exec_module(module)
    return module


bench = load_bench_train()


def reduced_data(spec: object, seq: int) -> tuple[np.ndarray, np.ndarray]:
    """bench's make_data recipe (float32 normals from its seed) at a shorter sequence length."""
    rng = np.random.default_rng(bench.SEED)
    shape = (spec.batch, seq, bench.D_MODEL)
    return rng.standard_normal(shape, dtype=np.float32), rng.standard_normal(shape, dtype=np.float32)


def torch_losses(spec: object, weights: dict[str, np.ndarray], batches: list[tuple[np.ndarray, np.ndarray]],
                 autocast: bool = False) -> list[float]:
    """One Adam step of the torch model from `weights` per batch (the forward pass under bfloat16 autocast if
    asked): the losses."""
    reference = bench.build_model(torch.nn, TF, spec)
    reference.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in weights.items()})
    reference_optimizer = torch.optim.Adam(reference.parameters(), lr=bench.LR)
    losses = []
    for inputs, targets in batches:
        reference_optimizer.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            reference_loss = TF.mse_loss(reference(torch.from_numpy(inputs)), torch.from_numpy(targets))
        reference_loss.backward()
        reference_optimizer.step()
        losses.append(reference_loss.item())
    return losses


def train_both(spec: object, inputs: np.ndarray, targets: np.ndarray, device: str) -> tuple[list[float], list[float]]:
    """EQUIVALENCE_STEPS Adam steps of the tg model on `device` and of torch from tg's initial weights: the losses."""
    tg.manual_seed(bench.SEED)
    model = bench.build_model(tg.nn, F, spec)
    weights = {k: v.numpy() for k, v in model.state_dict().items()}
    optimizer = tg.optim.Adam(model.parameters(), lr=bench.LR)
    x, y = tg.from_numpy(inputs), tg.from_numpy(targets)
    losses = []
    for _ in range(EQUIVALENCE_STEPS):
        with tg.device(device):
            optimizer.zero_grad()
            loss = F.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
    return losses, torch_losses(spec, weights, [(inputs, targets)] * EQUIVALENCE_STEPS)


def assert_same_training(losses: list[float], reference_losses: list[float]) -> None:
    np.testing.assert_allclose(losses, reference_losses, rtol=1e-3, err_msg="tg vs torch MSE loss per Adam step")
    assert losses[-1] < 0.9 * losses[0], f"the model should fit its batch: losses {losses[0]:.4f} -> {losses[-1]:.4f}"


@pytest.mark.long
def test_encoder_layer_training_matches_pytorch_at_reduced_size() -> None:
    """One benchmark layer, sequence 16 and batch 2 instead of 128 and 8, on the reference device (the fastest here:
    at this size a step costs graph building, not arithmetic)."""
    spec = bench.ModelSpec(layers=1, batch=2)
    assert_same_training(*train_both(spec, *reduced_data(spec, seq=16), device="numpy"))


@pytest.mark.slow
@pytest.mark.parametrize("model", ["enc1", "enc2"])
def test_benchmark_training_matches_pytorch_at_full_size(model: str, tmp_path, monkeypatch) -> None:
    """The benchmark's own models and data (sequence 128, batch 8) on its tg device."""
    monkeypatch.setenv("TG_CACHE_DIR", str(tmp_path))  # the planner's choices must not depend on the user's cache
    spec = bench.MODELS[model]
    assert_same_training(*train_both(spec, *bench.make_data(spec), device="planned"))




def linear_map_batches(spec: object, seq: int, steps: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """A fresh batch per step whose target is a fixed random linear map of the input: a loss that falls steadily
    instead of reaching 0 on one memorized batch (where relative differences would only compare rounding floors)."""
    rng = np.random.default_rng(bench.SEED)
    mixing = rng.standard_normal((bench.D_MODEL, bench.D_MODEL), dtype=np.float32) / np.float32(bench.D_MODEL**0.5)
    inputs = [rng.standard_normal((spec.batch, seq, bench.D_MODEL), dtype=np.float32) for _ in range(steps)]
    return [(x, x @ mixing) for x in inputs]


@pytest.mark.slow  # about 30 s
def test_encoder_layer_autocast_training_tracks_torch_autocast(tmp_path, monkeypatch) -> None:
    """The benchmark's own step under bfloat16 autocast (`bench.tg_training_step(spec, autocast=True)`, compiled)
    for 200 Adam steps at the reduced size, against torch's bfloat16 autocast run and its float32 run from the
    same weights on the same batches (see tensorgraphs.testing.mixed_precision)."""
    monkeypatch.setenv("TG_CACHE_DIR", str(tmp_path))
    spec = bench.ModelSpec(layers=1, batch=2)
    batches = linear_map_batches(spec, seq=16, steps=AUTOCAST_STEPS)
    tg.manual_seed(bench.SEED)
    weights = {k: v.numpy() for k, v in bench.build_model(tg.nn, F, spec).state_dict().items()}
    step, _, _ = bench.tg_training_step(spec, autocast=True)  # the same seed: the same initial weights
    compiled = tg.compile(step)
    losses = [compiled(tg.from_numpy(x), tg.from_numpy(y)).item() for x, y in batches]
    assert_tracks_torch(losses, *(torch_losses(spec, weights, batches, autocast) for autocast in (True, False)))
    assert losses[-1] < 0.7 * losses[0], f"the model should learn the map: losses {losses[0]:.4f} -> {losses[-1]:.4f}"
