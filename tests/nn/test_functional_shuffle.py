"""pixel_shuffle, pixel_unshuffle and channel_shuffle against torch (pure rearrangements: exact)."""

from __future__ import annotations

import pytest
import torch.nn.functional as TF
from functional_check import check, normal

import tensorgraphs as tg
import tensorgraphs.nn.functional as F


@pytest.mark.parametrize("shape,factor", [((1, 8, 2, 3), 2), ((2, 3, 9, 4, 4), 3), ((4, 1, 1), 2), ((1, 5, 2, 2), 1)])
def test_pixel_shuffle_matches_torch(shape: tuple, factor: int) -> None:
    check(lambda t: F.pixel_shuffle(t, factor), lambda t: TF.pixel_shuffle(t, factor), [normal(1, *shape)],
          grad=[0], rtol=0, atol=0, name="pixel_shuffle")


@pytest.mark.parametrize("shape,factor", [((1, 2, 4, 6), 2), ((2, 3, 1, 6, 3), 3), ((4, 2, 2), 2)])
def test_pixel_unshuffle_matches_torch(shape: tuple, factor: int) -> None:
    check(lambda t: F.pixel_unshuffle(t, factor), lambda t: TF.pixel_unshuffle(t, factor), [normal(2, *shape)],
          grad=[0], rtol=0, atol=0, name="pixel_unshuffle")


@pytest.mark.parametrize("shape,groups", [((2, 6, 3), 2), ((1, 6, 2, 2), 3), ((2, 4, 1, 1, 2), 4)])
def test_channel_shuffle_matches_torch(shape: tuple, groups: int) -> None:
    check(lambda t: F.channel_shuffle(t, groups), lambda t: TF.channel_shuffle(t, groups), [normal(3, *shape)],
          grad=[0], rtol=0, atol=0, name="channel_shuffle")
    check(lambda t: F.native_channel_shuffle(t, groups), lambda t: TF.native_channel_shuffle(t, groups),
          [normal(3, *shape)], rtol=0, atol=0, name="native_channel_shuffle")


@pytest.mark.parametrize("call", [lambda: F.pixel_shuffle(tg.ones(1, 3, 2, 2), 2),
                                  lambda: F.pixel_unshuffle(tg.ones(1, 3, 3, 2), 2),
                                  lambda: F.channel_shuffle(tg.ones(1, 4, 3), 3),
                                  lambda: F.pixel_shuffle(tg.ones(4, 2), 2)])
def test_sizes_that_do_not_divide_are_shape_errors(call) -> None:
    with pytest.raises(tg.ShapeError):
        call()
