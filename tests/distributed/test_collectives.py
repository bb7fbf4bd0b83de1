"""tg.distributed's collectives on 2 processes (gloo, localhost), and their errors in this process."""

from __future__ import annotations

import numpy as np
import pytest

import tensorgraphs as tg
import tensorgraphs.distributed as dist

pytest.importorskip("torch.distributed")


@pytest.mark.long
def test_collectives_on_every_kind_of_tensor(group_results) -> None:
    ranks = group_results("collectives")
    import torch

    bf16_sum = (torch.tensor([1.0, 1 / 3], dtype=torch.bfloat16) * 2).float().numpy()  # what torch reduces to
    for rank, results in enumerate(ranks):
        np.testing.assert_array_equal(results["lazy"], [3, 6, 9])
        np.testing.assert_array_equal(results["own"], [2, 4, 6])
        assert results["own_in_place"], "a tensor's own contiguous buffer is reduced where it is"
        np.testing.assert_array_equal(results["kept"], [2, 4])
        np.testing.assert_array_equal(results["built_before"], [10, 20])
        np.testing.assert_array_equal(results["base"], [rank, 1, 1, rank])  # the view [1:3] summed 0 + 1
        np.testing.assert_array_equal(results["largest"], [1, 0])
        np.testing.assert_array_equal(results["third"], bf16_sum)
        np.testing.assert_array_equal(results["flags"], [False, True])
        np.testing.assert_array_equal(results["gathered"], [[0, 0], [1, 10]])
        assert results["weight_is_leaf"]
        assert str(results["dtype_error"]) == "DTypeError" and str(results["async_error"]) == "UnsupportedError"
    np.testing.assert_array_equal(ranks[0]["weight"], ranks[1]["weight"])


def test_no_sync_accumulates_locally_then_averages(group_results) -> None:
    first, second = group_results("no-sync")
    names = [key.partition("/")[2] for key in first if key.startswith("single/")]
    for name in names:
        assert not np.allclose(first[f"local/{name}"], second[f"local/{name}"]), name  # not averaged inside
        np.testing.assert_array_equal(first[f"synced/{name}"], second[f"synced/{name}"])
        np.testing.assert_allclose(first[f"synced/{name}"], first[f"single/{name}"], rtol=1e-5, atol=1e-6)


def test_collectives_need_an_initialized_group() -> None:
    assert not dist.is_initialized()
    for call in (dist.get_rank, dist.get_world_size, dist.barrier, lambda: dist.all_reduce(tg.ones(2))):
        with pytest.raises(tg.UnsupportedError, match="init_process_group"):
            call()
    with pytest.raises(tg.UnsupportedError, match="init_process_group"):
        tg.nn.parallel.DistributedDataParallel(tg.nn.Linear(2, 2))


def test_only_gloo() -> None:
    with pytest.raises(tg.UnsupportedError, match="backend='gloo'"):
        dist.init_process_group("nccl")
