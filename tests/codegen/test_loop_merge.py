"""Merging loops that every index walks as one (codegen.loop_merge): which nests merge, and that the values do not
change (torch is the oracle)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tensorgraphs as tg
import tensorgraphs.nn.functional as F
from tensorgraphs.codegen.loop_ir import Loop, walk
from tensorgraphs.schedule import schedule_kernels

pytestmark = pytest.mark.device("cpu", compile=True)


def loop_extents(tensor: tg.Tensor) -> list[list[int]]:
    """Each kernel's loop extents, outermost first."""
    return [
        [s.var.extent for s in walk(k.body) if isinstance(s, Loop)]
        for k in schedule_kernels([tensor.node]).kernels
        if k.body
    ]


def random(*shape: int) -> np.ndarray:
    return np.random.default_rng(0).standard_normal(shape).astype(np.float32)


def test_a_window_over_channels_walks_each_image_plane_as_one_loop() -> None:
    x = random(2, 12, 5, 55)
    out = F.local_response_norm(tg.tensor(x), 5)
    assert loop_extents(out) == [[2, 12, 5 * 55]]  # the channel window's checks stay per channel
    expected = torch.nn.functional.local_response_norm(torch.from_numpy(x), 5)
    np.testing.assert_allclose(out.numpy(), expected.numpy(), rtol=1e-5, atol=1e-6)


def test_a_window_along_the_rows_keeps_its_row_and_column_loops() -> None:
    x = random(2, 3, 7, 7)
    out = F.avg_pool2d(tg.tensor(x), 3, 1, 1) * 2  # the padding checks differ along each row
    assert all(len(extents) >= 4 for extents in loop_extents(out))
    expected = torch.nn.functional.avg_pool2d(torch.from_numpy(x), 3, 1, 1) * 2
    np.testing.assert_allclose(out.numpy(), expected.numpy(), rtol=1e-5, atol=1e-6)


def test_a_transposed_read_keeps_its_loops() -> None:
    x = random(3, 6, 10)
    out = (tg.tensor(x).permute(0, 2, 1) * 2).contiguous()
    assert max(len(extents) for extents in loop_extents(out)) >= 2
    np.testing.assert_array_equal(out.numpy(), np.transpose(x, (0, 2, 1)) * 2)


def test_an_image_slice_merges_only_the_contiguous_columns() -> None:
    x = random(2, 4, 6, 9)
    out = tg.tensor(x)[:, :, 1:5, 2:8].exp()  # rows 9 apart, 6 columns each: not one run
    assert [6] == [extents[-1] for extents in loop_extents(out)]
    np.testing.assert_allclose(out.numpy(), np.exp(x[:, :, 1:5, 2:8]), rtol=1e-6)


def test_a_sum_over_image_planes_walks_each_plane_as_one_loop() -> None:
    """A global average pool's reduction over 13x13 planes: one run of 169, long enough for partial results per
    lane (rows of 13 were not), the values torch's."""
    x = random(2, 40, 13, 13)
    out = tg.tensor(x).mean((2, 3))
    assert loop_extents(out) == [[2, 40, 13 * 13]]
    np.testing.assert_allclose(out.numpy(), x.mean((2, 3)), rtol=1e-5, atol=1e-6)
