"""tg.save / tg.load: safetensors files that torch reads, and torch's files that tg reads."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

import tensorgraphs as tg

DTYPES = [(tg.float32, torch.float32), (tg.float64, torch.float64), (tg.float16, torch.float16),
          (tg.bfloat16, torch.bfloat16), (tg.int64, torch.int64), (tg.int32, torch.int32), (tg.int8, torch.int8),
          (tg.uint8, torch.uint8), (tg.bool, torch.bool)]


def torch_values(torch_dtype: torch.dtype) -> torch.Tensor:
    values = torch.tensor([[-2.5, 0.0, 1.0], [3.140625, -0.0078125, 100.0]])
    return (values > 0) if torch_dtype is torch.bool else values.to(torch_dtype)


@pytest.mark.parametrize("tg_dtype,torch_dtype", DTYPES, ids=[d[0].name for d in DTYPES])
def test_tg_file_loads_in_torch_and_back(tmp_path: Path, tg_dtype, torch_dtype) -> None:
    expected = torch_values(torch_dtype)
    mine = tg.tensor(expected.float().numpy()).to(tg_dtype)
    tg.save({"x": mine}, tmp_path / "tg.safetensors")
    loaded = load_file(tmp_path / "tg.safetensors")["x"]
    assert loaded.dtype is torch_dtype and torch.equal(loaded, expected)

    save_file({"y": expected}, tmp_path / "torch.safetensors")
    back = tg.load(tmp_path / "torch.safetensors")["y"]
    assert back.dtype is tg_dtype
    np.testing.assert_array_equal(back.to(tg.float64).numpy(), expected.double().numpy())


def test_module_state_dict_round_trips_between_tg_and_torch(tmp_path: Path) -> None:
    build = lambda nn: nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))
    mine, reference = build(tg.nn), build(torch.nn)
    tg.save(mine.state_dict(), tmp_path / "model.safetensors")
    reference.load_state_dict(load_file(tmp_path / "model.safetensors"))
    for name, value in mine.state_dict().items():
        np.testing.assert_array_equal(reference.state_dict()[name].numpy(), value.numpy())

    torch.nn.init.normal_(reference[0].weight)
    save_file(reference.state_dict(), tmp_path / "torch.safetensors")
    mine.load_state_dict(tg.load(tmp_path / "torch.safetensors"))
    np.testing.assert_array_equal(mine[0].weight.detach().numpy(), reference[0].weight.detach().numpy())
    assert mine[0].weight.requires_grad


def test_nested_checkpoint_round_trips(tmp_path: Path) -> None:
    """An optimizer's state_dict (int keys, tuples, floats, None) comes back with the same structure."""
    model = tg.nn.Linear(2, 1)
    optimizer = tg.optim.Adam(model.parameters(), lr=0.01)
    model(tg.ones(1, 2)).sum().backward()
    optimizer.step()
    checkpoint = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": 1, "note": None}
    tg.save(checkpoint, tmp_path / "checkpoint.safetensors")
    loaded = tg.load(tmp_path / "checkpoint.safetensors")
    assert loaded["step"] == 1 and loaded["note"] is None
    assert loaded["optimizer"]["state"][0]["step"].shape == () and loaded["optimizer"]["state"][0]["step"].item() == 1
    assert list(loaded["model"]) == ["weight", "bias"]
    state = loaded["optimizer"]["state"][0]
    np.testing.assert_array_equal(state["exp_avg"].numpy(), optimizer.state[model.weight]["exp_avg"].numpy())
    fresh = tg.optim.Adam(model.parameters())
    fresh.load_state_dict(loaded["optimizer"])
    assert fresh.param_groups[0]["lr"] == 0.01 and list(fresh.param_groups[0]["betas"]) == [0.9, 0.999]
    assert set(load_file(tmp_path / "checkpoint.safetensors")) == {
        "model.weight", "model.bias", *(f"optimizer.state.{i}.{key}" for i in range(2)
                                        for key in ("step", "exp_avg", "exp_avg_sq"))}


def test_unsupported_values_are_rejected(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="tg.save stores tensors"):
        tg.save({"x": object()}, tmp_path / "bad.safetensors")


@pytest.mark.parametrize("tree", [
    lambda a, b: {"a.b": a, "a": {"b": b}},
    lambda a, b: {1: a, "1": b},
    lambda a, b: {"x": [a, {"0": b}], "x.0": b},
])
def test_keys_that_spell_the_same_path_keep_their_own_tensors_and_key_types(tree, tmp_path: Path) -> None:
    a, b = tg.tensor([1.0, 2.0]), tg.tensor([3, 4, 5])
    tg.save(tree(a, b), tmp_path / "c.safetensors")
    loaded = tg.load(tmp_path / "c.safetensors")

    def same(saved, got) -> None:
        if isinstance(saved, tg.Tensor):
            assert got.dtype is saved.dtype
            np.testing.assert_array_equal(got.numpy(), saved.numpy())
        elif isinstance(saved, dict):
            assert list(got) == list(saved)  # int and str keys kept apart, in order
            for key in saved:
                same(saved[key], got[key])
        else:
            assert len(got) == len(saved)
            for s, g in zip(saved, got):
                same(s, g)

    same(tree(a, b), loaded)


def test_metadata_cannot_take_tensorgraphs_keys_and_a_failed_save_keeps_the_old_file(tmp_path: Path) -> None:
    path = tmp_path / "model.safetensors"
    tg.save({"w": tg.ones(2)}, path)
    before = path.read_bytes()
    with pytest.raises(tg.ArgumentError, match="tensorgraphs.structure.*test_serialization.py"):
        tg.save({"w": tg.zeros(2), "step": 3}, path, metadata={"tensorgraphs.structure": "mine"})
    with pytest.raises(TypeError):
        tg.save({"w": tg.zeros(2), "bad": object()}, path)
    assert path.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["model.safetensors"]
    tg.save({"w": tg.zeros(2)}, path, metadata={"note": "mine"})
    np.testing.assert_array_equal(tg.load(path)["w"].numpy(), np.zeros(2, np.float32))


def test_a_checkpoint_gets_the_permissions_a_new_file_would_get(tmp_path: Path) -> None:
    mask = os.umask(0o022)
    try:
        tg.save({"w": tg.ones(2)}, tmp_path / "model.safetensors")
    finally:
        os.umask(mask)
    assert (tmp_path / "model.safetensors").stat().st_mode & 0o777 == 0o644
