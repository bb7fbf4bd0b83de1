"""Depthwise convs (groups == channels) as one generated loop: values against torch on the compiled cpu device, and
the loop structure that makes them fast (every part of a padded window cut where its checks stop, the interior
innermost along the contiguous W axis), so it cannot silently regress."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as TF

import tensorgraphs as tg
import tensorgraphs.nn.functional as F
from tensorgraphs.codegen.index import Expr, Var
from tensorgraphs.codegen.loop_ir import Let, Load, Loop, Store, walk
from tensorgraphs.schedule import schedule_kernels

pytestmark = pytest.mark.device("cpu", compile=True)  # checks generated C, small graphs included

CHECKS = ("in_range", "zero_unless")


def _depthwise(x: np.ndarray, w: np.ndarray, b: np.ndarray, **kwargs) -> tuple[np.ndarray, np.ndarray]:
    """(tg's compiled result, torch's) of a depthwise conv2d with bias."""
    expected = TF.conv2d(torch.from_numpy(x), torch.from_numpy(w), torch.from_numpy(b), groups=x.shape[1], **kwargs)
    with tg.device("cpu"):
        ours = F.conv2d(tg.tensor(x), tg.tensor(w), tg.tensor(b), groups=x.shape[1], **kwargs).numpy()
    return ours, expected.numpy()


@pytest.mark.parametrize(
    "batch, channels, height, width, kernel, stride, padding",
    [
        (1, 3, 14, 14, 3, 1, 1),  # ShuffleNet's stride 1
        (2, 3, 14, 14, 3, 2, 1),  # and stride 2
        (1, 4, 7, 7, 3, 1, 1),  # interiors shorter than a vector
        (2, 5, 9, 13, 3, 2, 1),  # odd sizes: a stride-2 window ends inside the image on one side only
        (1, 2, 11, 6, 3, 1, 2),  # padding wider than the window's reach: whole rows and columns of padding only
        (1, 3, 8, 10, 5, 1, 2),
        (2, 3, 10, 9, 3, 1, 0),  # no padding: no cut
        (1, 2, 2, 3, 3, 1, 1),  # no interior at all
    ],
)
def test_depthwise_conv_matches_torch(
    batch: int, channels: int, height: int, width: int, kernel: int, stride: int, padding: int
) -> None:
    rng = np.random.default_rng(height * 100 + width * 10 + stride)
    x = rng.standard_normal((batch, channels, height, width), dtype=np.float32)
    w = rng.standard_normal((channels, 1, kernel, kernel), dtype=np.float32)
    b = rng.standard_normal(channels, dtype=np.float32)
    ours, expected = _depthwise(x, w, b, stride=stride, padding=padding)
    np.testing.assert_allclose(ours, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("stride", [1, 2])
def test_depthwise_conv_propagates_nan_as_torch(stride: int) -> None:
    """A NaN input spreads to exactly the outputs whose windows hold it (in the interior and at a border)."""
    rng = np.random.default_rng(stride)
    x = rng.standard_normal((2, 3, 9, 9), dtype=np.float32)
    w = rng.standard_normal((3, 1, 3, 3), dtype=np.float32)
    b = rng.standard_normal(3, dtype=np.float32)
    x[0, 0, 4, 4] = x[1, 1, 0, 8] = x[1, 2, 5, 0] = np.nan
    ours, expected = _depthwise(x, w, b, stride=stride, padding=1)
    assert np.isnan(expected).any()
    np.testing.assert_allclose(ours, expected, rtol=1e-5, atol=1e-5)  # NaN where torch's are, and only there


def _step(index: Expr, var: Var) -> int:
    """How far `index` moves per step of `var`."""
    return 1 if index == var else dict(getattr(index, "terms", ())).get(var, 0)


def _innermost_loops(body: list, trips: int = 1) -> list[tuple[Loop, int]]:
    """(loop, how often its body runs) for every loop without loops inside."""
    found = []
    for stmt in body:
        if isinstance(stmt, Loop):
            found += _innermost_loops(stmt.body, trips * stmt.var.extent) or [(stmt, trips * stmt.var.extent)]
    return found


@pytest.mark.parametrize("stride", [1, 2])
def test_every_part_of_a_padded_depthwise_window_reads_without_checks(stride: int) -> None:
    """A 3x3 window padded by 1: rows and columns are each cut into border, interior, border, in every part (the
    border rows' interior columns too), so no loop body clamps or selects; the interior is the innermost loop,
    over W, reading each tap contiguously along it and storing contiguously."""
    with tg.device("cpu"):
        x = tg.tensor(np.zeros((1, 8, 14, 14), np.float32))
        w = tg.tensor(np.zeros((8, 1, 3, 3), np.float32))
        out = F.conv2d(x, w, tg.tensor(np.zeros(8, np.float32)), stride=stride, padding=1, groups=8)
    (kernel,) = schedule_kernels([out.node]).kernels
    assert not any(isinstance(s, Let) and s.op in CHECKS for s in walk(kernel.body))
    loops = _innermost_loops(kernel.body)
    columns = out.shape[-1]
    interior, _ = max(loops, key=lambda loop_trips: loop_trips[1])
    assert interior.var.extent == columns - 1 - (stride == 1)  # the first column (and the last, at stride 1) cut
    assert len(loops) == (9 if stride == 1 else 4)  # rows x columns: border, interior, border (stride 2: no far one)
    taps = [s for s in walk(interior.body) if isinstance(s, Load)]  # the weights and bias are hoisted out of it
    assert len(taps) == 9 and all(_step(tap.index, interior.var) == stride for tap in taps)
    (store,) = [s for s in walk(interior.body) if isinstance(s, Store)]
    assert _step(store.index, interior.var) == 1
