"""linear, embedding and dropout against torch."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as TF
from functional_check import check, normal

import tensorgraphs as tg
import tensorgraphs.nn.functional as F


@pytest.mark.parametrize("x_shape,w_shape,bias", [((3, 7), (5, 7), True), ((1, 3), (1, 3), False),
                                                   ((2, 3, 7), (4, 7), True), ((7,), (3, 7), True),
                                                   ((2, 7), (7,), False)])
def test_linear_matches_torch(x_shape: tuple, w_shape: tuple, bias: bool) -> None:
    inputs = [normal(1, *x_shape), normal(2, *w_shape)] + ([normal(3, w_shape[0])] if bias else [])
    check(F.linear, TF.linear, inputs, grad=range(len(inputs)), name="linear")


def test_linear_shape_error_names_both_shapes() -> None:
    with pytest.raises(tg.ShapeError, match=r"\(2, 3\).*\(4, 5\)"):
        F.linear(tg.randn(2, 3), tg.randn(4, 5))


@pytest.mark.parametrize("index_shape", [(7,), (1,), (2, 3)])
@pytest.mark.parametrize("padding_idx", [None, 2, -1])
def test_embedding_matches_torch(index_shape: tuple, padding_idx: int | None) -> None:
    index = np.random.default_rng(4).integers(0, 5, index_shape)
    index.flat[0] = 2
    index.flat[-1] = 4
    check(lambda i, w: F.embedding(i, w, padding_idx), lambda i, w: TF.embedding(i, w, padding_idx),
          [index, normal(5, 5, 3)], grad=[1], name="embedding")


def test_embedding_rejects_float_indices() -> None:
    with pytest.raises(tg.DTypeError, match="embedding"):
        F.embedding(tg.randn(3), tg.randn(5, 2))


def test_dropout_is_reproducible_and_scaled() -> None:
    x = tg.ones(64, 64, requires_grad=True)
    tg.manual_seed(3)
    first = F.dropout(x, 0.25)
    tg.manual_seed(3)
    second = F.dropout(x, 0.25)
    a = first.detach().numpy()
    np.testing.assert_array_equal(a, second.detach().numpy())
    assert set(np.unique(a)) == {0.0, np.float32(1 / 0.75)}
    assert abs((a == 0).mean() - 0.25) < 0.03
    (grad,) = tg.grad(first.sum(), [x])
    np.testing.assert_allclose(grad.numpy(), a)


def test_dropout_off_cases_match_torch() -> None:
    x = normal(6, 3, 7)
    check(lambda t: F.dropout(t, 0.5, training=False), lambda t: TF.dropout(t, 0.5, training=False), [x], grad=[0])
    check(lambda t: F.dropout(t, 0.0), lambda t: TF.dropout(t, 0.0), [x], grad=[0])
    check(lambda t: F.dropout(t, 1.0), lambda t: TF.dropout(t, 1.0), [x], grad=[0])


def test_dropout_keeps_nan_and_checks_p() -> None:
    tg.manual_seed(0)
    out = F.dropout(tg.full((100,), float("nan")), 0.5).numpy()
    assert np.isnan(out).all()
    with pytest.raises(tg.ArgumentError, match="between 0 and 1"):
        F.dropout(tg.randn(3), 1.5)
    assert torch.isnan(TF.dropout(torch.full((100,), float("nan")), 0.5)).all()


@pytest.mark.parametrize("name,shape,spatial", [("dropout1d", (8, 16, 5), 1), ("dropout1d", (16, 5), 1),
                                                ("dropout2d", (8, 16, 3, 4), 2), ("dropout2d", (16, 3, 4), 1),
                                                ("dropout3d", (4, 16, 2, 3, 2), 3), ("dropout3d", (16, 2, 3, 2), 3)])
def test_channel_dropout_zeroes_whole_channels_as_torch(name: str, shape: tuple, spatial: int) -> None:
    """Random draws differ from torch's; what torch guarantees is checked on both: each channel of each sample
    is all zero or all scaled by 1 / (1 - p), about a fraction p of them zero, and the gradient is that mask."""
    x = np.ones(shape, np.float32)
    tg.manual_seed(4)
    torch.manual_seed(4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # dropout2d's warning about 3-d inputs, given by both
        ours_t = tg.tensor(x, requires_grad=True)
        ours = getattr(F, name)(ours_t, 0.4)
        theirs = getattr(TF, name)(torch.tensor(x), 0.4).numpy()
    (grad,) = tg.grad(ours.sum(), [ours_t])
    np.testing.assert_allclose(grad.numpy(), ours.detach().numpy())
    for values in (ours.detach().numpy(), theirs):
        per_channel = values.reshape(-1, int(np.prod(shape[len(shape) - spatial:])))
        assert (per_channel == per_channel[:, :1]).all(), "a channel is partly dropped"
        assert set(np.unique(per_channel)) <= {0.0, np.float32(1 / 0.6)}
        assert 0.1 < (per_channel[:, 0] == 0).mean() < 0.7


def test_dropout2d_of_a_3d_input_warns_as_torch() -> None:
    with pytest.warns(UserWarning, match="dropout1d"):
        TF.dropout2d(torch.ones(2, 3, 4))
    with pytest.warns(UserWarning, match="dropout1d") as record:
        F.dropout2d(tg.ones(2, 3, 4))
    assert record[0].filename == __file__


def test_channel_dropout_off_cases_match_torch_and_checks_the_rank() -> None:
    x = normal(7, 2, 3, 4)
    for p, training in [(0.5, False), (0.0, True), (1.0, True)]:
        check(lambda t: F.dropout1d(t, p, training), lambda t: TF.dropout1d(t, p, training), [x], grad=[0])
    with pytest.raises(tg.ShapeError, match="dropout3d"):
        F.dropout3d(tg.ones(2, 3))


@pytest.mark.parametrize("shape1,shape2,bias", [((4, 3), (4, 5), True), ((2, 3, 3), (2, 3, 5), False),
                                                ((3,), (5,), True)])
def test_bilinear_matches_torch(shape1: tuple, shape2: tuple, bias: bool) -> None:
    inputs = [normal(20, *shape1), normal(21, *shape2), normal(22, 6, 3, 5)] + ([normal(23, 6)] if bias else [])
    check(F.bilinear, TF.bilinear, inputs, grad=list(range(len(inputs))), rtol=1e-5, atol=1e-5, name="bilinear")
