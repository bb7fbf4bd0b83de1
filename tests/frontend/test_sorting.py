"""sort / argsort / topk beyond the op-info table: torch's tie and NaN order spelled out, long rows on the
compiled path, tg.compile, and errors at the call."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tensorgraphs as tg
from tensorgraphs.errors import ArgumentError
from tensorgraphs.frontend import sorting

TIES_AND_NANS = np.array([1.0, 3, 3, np.nan, 2, 3, np.nan, 1, -0.0, 0.0, np.inf, -np.inf], np.float32)


@pytest.mark.parametrize("descending", [False, True])
def test_sort_keeps_ties_in_input_order_and_puts_nan_above_infinity(descending: bool) -> None:
    got = tg.sort(tg.tensor(TIES_AND_NANS), descending=descending)
    want = torch.sort(torch.tensor(TIES_AND_NANS), descending=descending, stable=True)
    np.testing.assert_array_equal(got.indices.numpy(), want.indices.numpy())
    np.testing.assert_array_equal(got.values.numpy(), want.values.numpy())
    np.testing.assert_array_equal(tg.tensor(TIES_AND_NANS).argsort(descending=descending).numpy(),
                                  want.indices.numpy())


def test_topk_on_long_rows_runs_compiled_and_matches_torch() -> None:
    logits = np.random.default_rng(0).standard_normal((2, 3000)).astype(np.float32)
    with tg.device("cpu"):
        values, indices = tg.tensor(logits).topk(50)
        got_values, got_indices = values.numpy(), indices.numpy()
    want = torch.tensor(logits).topk(50)
    np.testing.assert_array_equal(got_values, want.values.numpy())
    np.testing.assert_array_equal(got_indices, want.indices.numpy())


@pytest.mark.parametrize("largest", [True, False])
@pytest.mark.parametrize("dtype", ["float32", "int32"])
def test_topk_of_long_rows_with_ties_and_nans_is_chunked_and_keeps_torchs_order(largest: bool, dtype: str) -> None:
    """Rows longer than 2 * TOPK_CHUNK take the top k per chunk, then of the candidates: ties and NaN
    (and the padding of the last chunk) must come out as a stable sort of the whole row orders them."""
    rng = np.random.default_rng(2)
    pool = TIES_AND_NANS if dtype == "float32" else np.arange(-2, 3)
    data = rng.choice(pool, (2, 2 * sorting.TOPK_CHUNK + 37)).astype(dtype)
    values, indices = tg.topk(tg.tensor(data), 40, largest=largest)
    want = torch.sort(torch.tensor(data), descending=largest, stable=True)
    np.testing.assert_array_equal(indices.numpy(), want.indices[:, :40].numpy())
    np.testing.assert_array_equal(values.numpy(), want.values[:, :40].numpy())


def top_k_filter(lib, logits: object, k: int) -> object:
    """nanoGPT's sampling crop: logits below the k-th largest become -inf."""
    values, _ = lib.topk(logits, k)
    return logits.masked_fill(logits < values[:, -1:], float("-inf")).softmax(-1)


def test_top_k_sampling_crop_matches_torch_eager_and_compiled() -> None:
    rng = np.random.default_rng(1)
    batches = [rng.standard_normal((3, 65)).astype(np.float32) for _ in range(2)]
    compiled = tg.compile(lambda logits: top_k_filter(tg, logits, 10))
    for logits in batches:
        want = top_k_filter(torch, torch.tensor(logits), 10).numpy()
        np.testing.assert_allclose(top_k_filter(tg, tg.tensor(logits), 10).numpy(), want, rtol=1e-6)
        np.testing.assert_allclose(compiled(tg.tensor(logits)).numpy(), want, rtol=1e-6)
    assert sum(len(traces) for traces in compiled.traces.values()) == 1


def test_sort_gradient_reaches_the_sorted_positions() -> None:
    data = np.array([[0.5, -1.0, 2.0], [3.0, 1.0, -2.0]], np.float32)
    mine, theirs = tg.tensor(data, requires_grad=True), torch.tensor(data, requires_grad=True)
    weights = np.array([1.0, 10.0, 100.0], np.float32)
    (tg.sort(mine, descending=True).values * tg.tensor(weights)).sum().backward()
    (torch.sort(theirs, descending=True).values * torch.tensor(weights)).sum().backward()
    np.testing.assert_array_equal(mine.grad.numpy(), theirs.grad.numpy())


def test_bad_k_raises_at_the_call() -> None:
    with pytest.raises(ArgumentError, match=r"topk.*k \(4\) is out of range.*size 3.*test_sorting.py"):
        tg.topk(tg.ones(3), 4)
    with pytest.raises(ArgumentError, match="out of range"):
        tg.ones(2, 3).topk(-1, dim=0)
