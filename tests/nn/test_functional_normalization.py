"""layer_norm, rms_norm, group_norm and batch_norm against torch."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as TF
from functional_check import check, normal, uniform

import tensorgraphs as tg
import tensorgraphs.nn.functional as F


@pytest.mark.parametrize("shape,normalized", [((3, 7), (7,)), ((1, 3), (3,)), ((2, 3, 7), (3, 7)), ((7,), (7,))])
@pytest.mark.parametrize("affine", [True, False])
def test_layer_norm_matches_torch(shape: tuple, normalized: tuple, affine: bool) -> None:
    inputs = [normal(1, *shape, scale=3.0)] + ([normal(2, *normalized), normal(3, *normalized)] if affine else [])
    check(lambda x, *wb: F.layer_norm(x, normalized, *wb, eps=1e-5),
          lambda x, *wb: TF.layer_norm(x, normalized, *wb, eps=1e-5), inputs, grad=range(len(inputs)),
          rtol=1e-4, atol=1e-5, name="layer_norm")


def test_layer_norm_is_a_composite_and_checks_shapes() -> None:
    assert F.layer_norm(tg.randn(2, 5), [5]).node.op.name == "layer_norm"
    with pytest.raises(tg.ShapeError, match=r"normalized_shape=\[4\].*\[2, 3\]"):
        F.layer_norm(tg.randn(2, 3), [4])


@pytest.mark.parametrize("shape,normalized", [((3, 7), (7,)), ((2, 3, 7), (3, 7)), ((1, 1), (1,))])
@pytest.mark.parametrize("eps", [None, 1e-3])
def test_rms_norm_matches_torch(shape: tuple, normalized: tuple, eps: float | None) -> None:
    inputs = [normal(4, *shape), normal(5, *normalized)]
    check(lambda x, w: F.rms_norm(x, normalized, w, eps), lambda x, w: TF.rms_norm(x, normalized, w, eps), inputs,
          grad=[0, 1], rtol=1e-4, atol=1e-5, name="rms_norm")


@pytest.mark.parametrize("shape,groups", [((2, 6, 5), 3), ((1, 4, 3, 3), 2), ((3, 3), 1), ((2, 3, 7), 3)])
@pytest.mark.parametrize("affine", [True, False])
def test_group_norm_matches_torch(shape: tuple, groups: int, affine: bool) -> None:
    channels = shape[1]
    inputs = [normal(6, *shape, scale=2.0)] + ([normal(7, channels), normal(8, channels)] if affine else [])
    check(lambda x, *wb: F.group_norm(x, groups, *wb), lambda x, *wb: TF.group_norm(x, groups, *wb), inputs,
          grad=range(len(inputs)), rtol=1e-4, atol=1e-5, name="group_norm")


def test_group_norm_rejects_indivisible_channels() -> None:
    with pytest.raises(tg.ShapeError, match="divisible by num_groups"):
        F.group_norm(tg.randn(2, 6, 4), 4)


@pytest.mark.parametrize("shape", [(4, 3), (2, 3, 5), (3, 2, 3, 3), (1, 3, 7)])
@pytest.mark.parametrize("training", [True, False])
def test_batch_norm_matches_torch_and_updates_running_stats(shape: tuple, training: bool) -> None:
    channels = shape[1]
    mean0, var0 = normal(9, channels), uniform(10, channels, low=0.5, high=2.0)
    ours_stats = [tg.tensor(mean0), tg.tensor(var0)]
    theirs_stats = [torch.tensor(mean0), torch.tensor(var0)]
    check(lambda x, w, b: F.batch_norm(x, *ours_stats, w, b, training=training, momentum=0.3),
          lambda x, w, b: TF.batch_norm(x, *theirs_stats, w, b, training=training, momentum=0.3),
          [normal(11, *shape, scale=2.0), normal(12, channels), normal(13, channels)], grad=[0, 1, 2],
          rtol=1e-4, atol=1e-5, name="batch_norm")
    for ours, theirs in zip(ours_stats, theirs_stats):
        np.testing.assert_allclose(ours.numpy(), theirs.numpy(), rtol=1e-5, atol=1e-6)


def test_batch_norm_without_running_stats_and_errors() -> None:
    x = normal(14, 4, 3)
    check(lambda t: F.batch_norm(t, None, None, training=True), lambda t: TF.batch_norm(t, None, None, training=True),
          [x], grad=[0], rtol=1e-4, atol=1e-5)
    with pytest.raises(tg.ArgumentError, match="more than 1 value per channel"):
        F.batch_norm(tg.randn(1, 3), None, None, training=True)
    with pytest.raises(tg.ShapeError, match="running_mean"):
        F.batch_norm(tg.randn(2, 3), tg.zeros(4), tg.ones(3))


@pytest.mark.parametrize("shape", [(2, 3, 5), (3, 2, 3, 3), (1, 3, 7)])
@pytest.mark.parametrize("running,affine,use_input_stats", [(False, False, True), (True, True, True),
                                                            (True, True, False)])
def test_instance_norm_matches_torch_and_updates_running_stats(shape: tuple, running: bool, affine: bool,
                                                               use_input_stats: bool) -> None:
    channels = shape[1]
    mean0, var0 = normal(16, channels), uniform(17, channels, low=0.5, high=2.0)
    ours_stats = [tg.tensor(mean0), tg.tensor(var0)] if running else [None, None]
    theirs_stats = [torch.tensor(mean0), torch.tensor(var0)] if running else [None, None]
    params = [normal(18, channels), normal(19, channels)] if affine else []
    check(lambda x, *wb: F.instance_norm(x, *ours_stats, *wb, use_input_stats=use_input_stats, momentum=0.3),
          lambda x, *wb: TF.instance_norm(x, *theirs_stats, *wb, use_input_stats=use_input_stats, momentum=0.3),
          [normal(20, *shape, scale=2.0)] + params, grad=list(range(1 + len(params))), rtol=1e-4, atol=1e-5,
          name="instance_norm")
    for ours, theirs in zip(ours_stats, theirs_stats):
        if ours is not None:
            np.testing.assert_allclose(ours.numpy(), theirs.numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("shape,size", [((2, 5, 4), 3), ((1, 6, 3, 3), 2), ((2, 3, 2, 2, 2), 5), ((2, 4, 3), 1)])
def test_local_response_norm_matches_torch(shape: tuple, size: int) -> None:
    check(lambda t: F.local_response_norm(t, size, alpha=0.1, beta=0.6, k=1.5),
          lambda t: TF.local_response_norm(t, size, alpha=0.1, beta=0.6, k=1.5), [normal(21, *shape, scale=2.0)],
          grad=[0], rtol=1e-5, atol=1e-6, name="local_response_norm")


def test_normalization_propagates_nan() -> None:
    x = normal(15, 2, 4, 3)
    x[0, 1, 2] = math.nan
    for ours, theirs in [(lambda t: F.layer_norm(t, [3]), lambda t: TF.layer_norm(t, [3])),
                         (lambda t: F.group_norm(t, 2), lambda t: TF.group_norm(t, 2)),
                         (lambda t: F.rms_norm(t, [3]), lambda t: TF.rms_norm(t, [3]))]:
        check(ours, theirs, [x], rtol=1e-4, atol=1e-5)
