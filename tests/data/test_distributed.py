"""DistributedSampler against torch's: the same indices per rank without shuffling (padding, drop_last), and
with shuffling a partition of one permutation per epoch that every rank draws alike."""

from __future__ import annotations

import pytest

import tensorgraphs as tg

torch_data = pytest.importorskip("torch.utils.data")


@pytest.mark.parametrize("size", [0, 1, 5, 10, 11])
@pytest.mark.parametrize("replicas", [1, 2, 3, 4])
@pytest.mark.parametrize("drop_last", [False, True])
def test_unshuffled_indices_are_torchs(size: int, replicas: int, drop_last: bool) -> None:
    data = list(range(size))
    for rank in range(replicas):
        ours = tg.data.DistributedSampler(data, replicas, rank, shuffle=False, drop_last=drop_last)
        theirs = torch_data.DistributedSampler(data, replicas, rank, shuffle=False, drop_last=drop_last)
        assert list(ours) == list(theirs) and len(ours) == len(theirs), (size, replicas, rank, drop_last)


@pytest.mark.parametrize("drop_last", [False, True])
def test_shuffled_ranks_share_one_permutation_per_epoch(drop_last: bool) -> None:
    data = list(range(11))
    samplers = [tg.data.DistributedSampler(data, 3, rank, seed=7, drop_last=drop_last) for rank in range(3)]
    orders = []
    for epoch in (0, 1):
        for sampler in samplers:
            sampler.set_epoch(epoch)
        shares = [list(sampler) for sampler in samplers]
        assert all(len(share) == len(samplers[0]) for share in shares)
        merged = [i for position in zip(*shares) for i in position]
        assert len(set(merged)) == (9 if drop_last else 11)  # padding repeats the first indices
        orders.append(merged)
    assert orders[0] != orders[1]
    again = tg.data.DistributedSampler(data, 3, 0, seed=7, drop_last=drop_last)
    assert list(again) == orders[0][0::3]


def test_feeds_a_dataloader() -> None:
    dataset = tg.data.TensorDataset(tg.arange(10))
    loader = tg.data.DataLoader(dataset, batch_size=2, sampler=tg.data.DistributedSampler(dataset, 2, 1, shuffle=False))
    assert [batch.tolist() for (batch,) in loader] == [[1, 3], [5, 7], [9]]


def test_bad_rank_and_missing_group() -> None:
    with pytest.raises(ValueError, match="Invalid rank 2"):
        tg.data.DistributedSampler(range(4), 2, 2)
    with pytest.raises(RuntimeError, match="init_process_group"):
        tg.data.DistributedSampler(range(4))
