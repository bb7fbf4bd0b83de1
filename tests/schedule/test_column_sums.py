"""Reductions over leading rows (every bias gradient's `grad.sum(0)`): values against float64 numpy and torch on the
compiled cpu device, and the loop structure that makes them run at memory speed on every thread (rows read
contiguously, the innermost loop along the kept columns, column blocks shared by threads), so it cannot silently
regress to walking each column with a stride of a row."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tensorgraphs as tg
from tensorgraphs import dtypes
from tensorgraphs.codegen import index as ix
from tensorgraphs.codegen.loop_ir import Load, Local, Loop, walk
from tensorgraphs.schedule import schedule_kernels

pytestmark = pytest.mark.device("cpu", compile=True)  # checks generated C, small graphs included


def _ulps_off(ours: np.ndarray, exact: np.ndarray) -> np.ndarray:
    """How many float32 ulps of the exact result `ours` is from it."""
    return np.abs(ours.astype(np.float64) - exact) / np.spacing(np.abs(exact).astype(np.float32)).astype(np.float64)


@pytest.mark.parametrize(
    "shape, dims",
    [
        ((700, 1000), 0),  # the LSTM LM decoder's bias gradient: 1000 columns, no power-of-two block
        ((1024, 768), 0),
        ((8 * 128, 1024), 0),
        ((4, 64, 48), (0, 1)),  # several leading dims
        ((300, 1009), 0),  # a prime above ROW_BLOCK_MAX: no block, columns reduced one by one
        ((96, 40), 0),
    ],
)
def test_column_sums_are_within_an_ulp_of_the_exact_sum_and_no_worse_than_torch(
    shape: tuple[int, ...], dims: int | tuple[int, ...]
) -> None:
    rng = np.random.default_rng(sum(shape))
    a = (1 + rng.standard_normal(shape)).astype(np.float32)  # an offset: float32 partial sums drift
    exact = a.astype(np.float64).sum(dims)
    ours = tg.tensor(a).sum(dims).numpy()
    theirs = torch.from_numpy(a).sum(dims).numpy()
    assert ours.dtype == np.float32 and ours.shape == exact.shape
    assert _ulps_off(ours, exact).max() <= 1  # summed in double, rounded once
    assert _ulps_off(ours, exact).max() <= max(_ulps_off(theirs, exact).max(), 0.5)


def test_mean_over_leading_dims_with_keepdim_matches_torch() -> None:
    a = np.random.default_rng(1).standard_normal((6, 50, 128)).astype(np.float32)
    ours = tg.tensor(a).mean((0, 1), keepdim=True).numpy()
    expected = torch.from_numpy(a).double().mean((0, 1), keepdim=True).numpy()
    assert ours.shape == (1, 1, 128)
    np.testing.assert_allclose(ours, expected, rtol=1e-6, atol=1e-7)


def test_a_middle_axis_sum_keeps_the_outer_axis_and_the_columns() -> None:
    a = np.random.default_rng(2).standard_normal((3, 200, 96)).astype(np.float32)
    ours = tg.tensor(a).sum(1, keepdim=True).numpy()
    np.testing.assert_allclose(ours, a.astype(np.float64).sum(1, keepdims=True), rtol=1e-6, atol=1e-5)


def test_nan_and_inf_propagate_column_by_column() -> None:
    a = np.random.default_rng(3).standard_normal((64, 256)).astype(np.float32)
    a[5, 0], a[7, 1], a[9, 2], a[10, 2] = np.nan, np.inf, np.inf, -np.inf
    for reduce in ("sum", "amax"):
        ours = getattr(tg.tensor(a), reduce)(0).numpy()
        expected = getattr(torch.from_numpy(a), reduce)(0).numpy()
        np.testing.assert_allclose(ours, expected, rtol=1e-6, atol=1e-5, equal_nan=True)


@pytest.mark.parametrize("shape", [(0, 64), (1, 256), (64, 1), (33, 0)])
def test_empty_and_unit_dims(shape: tuple[int, int]) -> None:
    a = np.random.default_rng(4).standard_normal(shape).astype(np.float32)
    np.testing.assert_allclose(tg.tensor(a).sum(0).numpy(), a.astype(np.float64).sum(0), rtol=1e-6, atol=1e-6)


def test_non_contiguous_and_fused_inputs() -> None:
    a = np.random.default_rng(5).standard_normal((256, 96)).astype(np.float32)
    t = tg.tensor(a)
    np.testing.assert_allclose(t.T.sum(0).numpy(), a.astype(np.float64).sum(1), rtol=1e-6, atol=1e-5)
    np.testing.assert_allclose(
        t[::2, 1::3].sum(0).numpy(), a[::2, 1::3].astype(np.float64).sum(0), rtol=1e-6, atol=1e-5
    )
    np.testing.assert_allclose((t * 2 + 1).sum(0).numpy(), (2 * a.astype(np.float64) + 1).sum(0), rtol=1e-6, atol=1e-5)


def test_integer_column_sums_stay_exact() -> None:
    a = np.random.default_rng(6).integers(-1000, 1000, (300, 64)).astype(np.int64)
    np.testing.assert_array_equal(tg.tensor(a).sum(0).numpy(), a.sum(0))


@pytest.mark.parametrize(
    "shape, dims, blocks",
    [
        ((700, 1000), 0, 2),
        ((1024, 768), 0, 2),
        ((8 * 128, 1024), 0, 2),
        ((256, 256), 0, 2),  # 256 columns: two blocks of 128, not one of 256 that one thread would take
        ((4, 64, 48), (0, 1), 2),
    ],
)
def test_column_sums_read_rows_contiguously_in_column_blocks_threads_share(
    shape: tuple[int, ...], dims: int | tuple[int, ...], blocks: int
) -> None:
    (kernel,) = schedule_kernels([tg.tensor(np.zeros(shape, np.float32)).sum(dims).node]).kernels
    (outer,) = [s for s in kernel.body if isinstance(s, Loop)]
    assert outer.var.name.startswith("blk") and outer.var.extent == blocks and outer.parallel is not None
    assert outer.parallel.work == np.prod(shape)  # the target splits it across threads from this work
    accumulators = [s for s in walk(outer.body) if isinstance(s, Local)]
    assert dtypes.float64 in {a.dtype for a in accumulators}  # float32 sums end in double
    source = [s for s in walk(outer.body) if isinstance(s, Load) and s.buffer not in {a.name for a in accumulators}]
    (inner,) = [s for s in walk(outer.body) if isinstance(s, Loop) and source[0] in s.body]
    rows = [s for s in walk(outer.body) if isinstance(s, Loop) and s.var.name.startswith("r") and inner in walk(s.body)]
    assert len(source) == 1 and rows  # rows outside, columns innermost
    assert ix.stride(source[0].index, inner.var) == 1
    assert all(ix.stride(source[0].index, r.var) % shape[-1] == 0 for r in rows)
