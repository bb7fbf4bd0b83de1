"""tg.data: batching, shuffling (seeded), drop_last and collation, checked against torch.utils.data."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.utils.data as torch_data

import tensorgraphs as tg


def dataset(lib) -> object:
    features = np.arange(20, dtype=np.float32).reshape(10, 2)
    labels = np.arange(10, dtype=np.int64)
    return lib.data.TensorDataset(tg.tensor(features), tg.tensor(labels)) if lib is tg else \
        torch_data.TensorDataset(torch.tensor(features), torch.tensor(labels))


def as_lists(loader) -> list[list[np.ndarray]]:
    return [[np.asarray(t) for t in batch] for batch in loader]


@pytest.mark.parametrize("batch_size,drop_last", [(3, False), (3, True), (5, False), (1, False), (12, False)])
def test_sequential_batches_equal_torch(batch_size: int, drop_last: bool) -> None:
    mine = tg.data.DataLoader(dataset(tg), batch_size=batch_size, drop_last=drop_last)
    reference = torch_data.DataLoader(dataset(torch), batch_size=batch_size, drop_last=drop_last)
    got, expected = as_lists(mine), as_lists(reference)
    assert len(mine) == len(reference) == len(expected)
    for batch, want in zip(got, expected):
        for tensor, wanted in zip(batch, want):
            np.testing.assert_array_equal(tensor, wanted)
    assert got[0][0].dtype == np.float32 and got[0][1].dtype == np.int64


def test_shuffle_is_a_seeded_permutation_per_epoch() -> None:
    loader = tg.data.DataLoader(dataset(tg), batch_size=4, shuffle=True, generator=7)
    epochs = [np.concatenate([labels.numpy() for _, labels in loader]) for _ in range(2)]
    for order in epochs:
        assert sorted(order.tolist()) == list(range(10))
    assert epochs[0].tolist() != epochs[1].tolist(), "each epoch draws a new order"
    again = tg.data.DataLoader(dataset(tg), batch_size=4, shuffle=True, generator=7)
    assert np.concatenate([labels.numpy() for _, labels in again]).tolist() == epochs[0].tolist()


def test_shuffle_without_generator_follows_tg_manual_seed() -> None:
    orders = []
    for _ in range(2):
        tg.manual_seed(3)
        loader = tg.data.DataLoader(dataset(tg), batch_size=10, shuffle=True)
        orders.append(next(iter(loader))[1].numpy().tolist())
    assert orders[0] == orders[1] and orders[0] != list(range(10))


def test_features_and_labels_stay_paired_when_shuffled() -> None:
    for features, labels in tg.data.DataLoader(dataset(tg), batch_size=3, shuffle=True, generator=0):
        np.testing.assert_array_equal(features.numpy()[:, 0], 2.0 * labels.numpy())


class Squares(tg.data.Dataset):
    def __len__(self) -> int:
        return 5

    def __getitem__(self, index: int) -> dict:
        return {"x": tg.tensor([float(index), float(index) ** 2]), "y": index, "w": 0.5 * index}


def test_default_collate_recurses_like_torch() -> None:
    batch = next(iter(tg.data.DataLoader(Squares(), batch_size=3)))
    assert batch["x"].shape == (3, 2)
    np.testing.assert_array_equal(batch["y"].numpy(), [0, 1, 2])
    assert batch["y"].dtype is tg.int64 and batch["w"].dtype is tg.float64


def test_batch_size_none_yields_samples_and_custom_collate() -> None:
    samples = list(tg.data.DataLoader(Squares(), batch_size=None))
    assert len(samples) == 5 and samples[2]["y"] == 2
    sums = list(tg.data.DataLoader(Squares(), batch_size=2, collate_fn=lambda b: sum(s["y"] for s in b)))
    assert sums == [1, 5, 4]


def test_random_split_and_subset() -> None:
    parts = tg.data.random_split(dataset(tg), [0.7, 0.3], generator=1)
    assert [len(p) for p in parts] == [7, 3]
    seen = sorted(int(p[i][1].item()) for p in parts for i in range(len(p)))
    assert seen == list(range(10))


def test_argument_errors() -> None:
    with pytest.raises(ValueError, match="batch_size should be a positive integer"):
        tg.data.DataLoader(dataset(tg), batch_size=0)
    with pytest.raises(ValueError, match="Size mismatch"):
        tg.data.TensorDataset(tg.zeros(3), tg.zeros(4))


def test_grouped_stacks_k_batches_and_splits_where_shapes_change() -> None:
    loader = tg.data.DataLoader(dataset(tg), batch_size=3)  # batches of 3, 3, 3 and 1
    groups = list(tg.data.grouped(loader, 2))
    assert [tuple(features.shape) for features, _ in groups] == [(2, 3, 2), (1, 3, 2), (1, 1, 2)]
    features = np.concatenate([np.asarray(f).reshape(-1, 2) for f, _ in groups])
    labels = np.concatenate([np.asarray(y).reshape(-1) for _, y in groups])
    np.testing.assert_array_equal(features, np.arange(20, dtype=np.float32).reshape(10, 2))
    np.testing.assert_array_equal(labels, np.arange(10))
    with pytest.raises(ValueError, match="at least 1"):
        next(tg.data.grouped(loader, 0))


def test_grouped_batches_feed_k_compiled_steps() -> None:
    model = tg.nn.Linear(2, 1)
    optimizer = tg.optim.SGD(model.parameters(), lr=0.01)

    @tg.compile
    def step(x: tg.Tensor, y: tg.Tensor) -> tg.Tensor:
        optimizer.zero_grad()
        loss = ((model(x).squeeze(-1) - y.float()) ** 2).mean()
        loss.backward()
        optimizer.step()
        return loss

    loader = tg.data.DataLoader(dataset(tg), batch_size=2)
    losses = np.concatenate([step.steps(x, y).numpy() for x, y in tg.data.grouped(loader, 4)])
    assert losses.shape == (5,) and np.all(np.isfinite(losses))
