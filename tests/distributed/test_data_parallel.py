"""DistributedDataParallel on 2 processes (gloo, localhost): the ranks train identical parameters, equal to one
process training on the whole batch and to torch's DistributedDataParallel; a crashing rank fails the others."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch.distributed")


def relative_error(value: np.ndarray, expected: np.ndarray) -> float:
    return float(np.linalg.norm(value - expected) / np.linalg.norm(expected))


def test_ranks_train_the_parameters_of_one_process_on_the_global_batch_and_of_torch_ddp(group_results) -> None:
    first, second = group_results("train")
    names = [key.partition("/")[2] for key in first if key.startswith("single/")]
    assert len(names) == 4
    for way in ("eager", "compiled"):
        for name in names:
            value = first[f"{way}/{name}"]
            np.testing.assert_array_equal(second[f"{way}/{name}"], value, err_msg=f"{way}: {name} differs by rank")
            assert relative_error(value, first[f"single/{name}"]) < 1e-6, (way, name)
            assert relative_error(value, first[f"torch/{name}"]) < 1e-6, (way, name)
    # the compiled step's two bucket collectives run between the kernels producing and consuming them
    calls, producers, consumers = (first[f"compiled/{key}"] for key in ("host_calls", "producers", "consumers"))
    assert len(calls) == 2
    assert (producers < calls).all() and (calls < consumers).all()


@pytest.mark.parametrize("scenario", ["crash-compiled", pytest.param("crash-eager", marks=pytest.mark.slow)])
def test_a_crashing_rank_makes_the_others_fail_clearly(scenario: str, run_ranks) -> None:
    survivor, crashed = run_ranks(scenario, check=False, timeout=60)
    assert crashed.returncode == 3
    assert survivor.returncode != 0 and survivor.results is None
    assert "DistributedError: distributed.all_reduce: the collective failed; another rank has probably stopped" in (
        survivor.output), survivor.output[-2000:]
