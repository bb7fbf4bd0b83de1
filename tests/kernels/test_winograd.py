"""conv2d by Winograd F(4x4, 3x3) (winograd.c) against torch.nn.functional.conv2d in float64, with the weights'
transform made in the call or once (`gemm.winograd_weights`, passed as `prepared`)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tensorgraphs.errors import ArgumentError, ShapeError
from tensorgraphs.kernels import gemm

pytestmark = pytest.mark.skipif(not gemm.available(), reason="needs AVX-512F and a C compiler")

# (batch, cin, h, w, cout, padding): sizes not multiples of the 4x4 output tile nor of 16 channels
CASES = [
    (1, 3, 5, 7, 5, 0),
    (2, 17, 13, 11, 19, 1),
    (3, 5, 9, 6, 33, 1),
    (1, 1, 3, 3, 1, 0),  # one output element
    (2, 20, 7, 7, 40, (1, 0)),  # ResNet's last stage shape, rectangular padding
    (1, 4, 30, 2, 3, 1),  # a tall strip: more tiles than one 16-tile vector in one image column
    # tile rows loaded as rows (winograd.c, tile_rows_per_vector): one a vector, 16, 12, 17 (a second vector of one
    # tile), 10 and 8 tiles, padding 0 and rectangular
    (2, 3, 6, 62, 5, 1),
    (1, 2, 9, 45, 3, 1),
    (2, 3, 5, 68, 4, 1),
    (1, 2, 10, 40, 17, 0),
    (3, 2, 4, 30, 3, (2, 1)),
    # two a vector: 5 tiles in 3 rows (the last one alone), 5 in 6, 7 in 3 over 3 images with rectangular padding
    (2, 3, 9, 17, 4, 1),
    (1, 5, 24, 22, 6, 0),
    (3, 2, 11, 23, 3, (1, 2)),
    # images taken in groups (winograd.c, GROUP_TILES): one image of 256 tiles a group, and groups of 16 images of
    # 16 tiles with a shorter last one
    (3, 4, 62, 62, 5, 1),
    (20, 3, 13, 13, 4, 1),
    # at most 4 tiles in all (winograd.c, FEW_TILES: M's rows are tiles), 7x7 as ResNet's last stage at batch 1
    (1, 40, 7, 7, 35, 1),
    # either side of winograd.c's tiles_as_rows: 98 tiles (two 7x7-tile images) as rows of 31 channels' columns (a
    # partial vector of channels); the same with 31 input channels (a short reduction), and 16 tiles against 48
    # channels, as columns
    (2, 33, 26, 26, 31, 1),
    (2, 31, 26, 26, 31, 1),
    (1, 32, 14, 14, 48, 1),
]
TOLERANCE = 3e-5
"""Largest error relative to the largest |output| (F(4x4, 3x3) in float32 loses about 10x the precision of the
direct sum: its transforms scale by up to 8 and cancel)."""


G = np.array([[1 / 4, 0, 0], [-1 / 6, -1 / 6, -1 / 6], [-1 / 6, 1 / 6, -1 / 6], [1 / 24, 1 / 12, 1 / 6],
              [1 / 24, -1 / 12, 1 / 6], [0, 0, 1]])
"""F(4x4, 3x3)'s weight transform: U = G g G^T for each 3x3 kernel g."""


def random(shape: tuple[int, ...], seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape, dtype=np.float32)


def reference(x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None, padding: int | tuple) -> torch.Tensor:
    return torch.nn.functional.conv2d(torch.from_numpy(x).double(), torch.from_numpy(weight).double(),
                                      None if bias is None else torch.from_numpy(bias).double(), padding=padding)


def winograd(x: np.ndarray, weight: np.ndarray, *args, prepared: bool, **kwargs) -> np.ndarray:
    """The Winograd conv, with the weights' transform made in the call or beforehand."""
    u = gemm.winograd_weights(weight) if prepared else None
    return gemm.conv2d(x, weight, *args, algorithm="winograd", prepared=u, **kwargs)


@pytest.mark.parametrize("prepared", [False, True], ids=["in_call", "prepared"])
@pytest.mark.parametrize("case", CASES, ids=str)
@pytest.mark.parametrize("epilogue", ["plain", "bias_relu", "residual", "residual_then_relu"])
def test_winograd_agrees_with_float64_torch(case, epilogue, prepared):
    batch, cin, h, w, cout, padding = case
    x, weight, bias = random((batch, cin, h, w), 1), random((cout, cin, 3, 3), 2), random((cout,), 3)
    arguments: dict = {}
    if epilogue == "bias_relu":
        expected, arguments = torch.relu(reference(x, weight, bias, padding)), dict(bias=bias, activation="relu")
    else:
        expected = reference(x, weight, None, padding)
    if epilogue == "residual":
        residual = random(tuple(expected.shape), 4)
        expected, arguments = 0.5 * expected + torch.from_numpy(residual), dict(residual=residual, alpha=0.5)
    if epilogue == "residual_then_relu":  # a ResNet block's relu after its skip connection
        residual = random(tuple(expected.shape), 4)
        expected = torch.relu(reference(x, weight, bias, padding) + torch.from_numpy(residual))
        arguments = dict(bias=bias, residual=residual, activation="relu", activation_after_residual=True)
    actual = winograd(x, weight, padding=padding, prepared=prepared, **arguments)
    error = np.abs(actual - expected.numpy()).max() / np.abs(expected.numpy()).max()
    assert error < TOLERANCE, f"{case} {epilogue} prepared={prepared}: relative error {error}"


@pytest.mark.parametrize("shape", [(1, 1), (5, 3), (19, 17), (32, 48)], ids=str)
def test_weights_transform_is_g_g_gt(shape):
    """tg_winograd_weights_f32 lays out G g G^T point-major, each point a (cout, cin) matrix, then the flag 1."""
    weight = random((*shape, 3, 3), 2)
    u = gemm.winograd_weights(weight)
    expected = np.einsum("xk,oikl,nl->xnoi", G, weight.astype(np.float64), G).reshape(36, *shape)
    assert u.shape == (36 * shape[0] * shape[1] + 1,) and u[-1] == 1
    error = np.abs(u[:-1].reshape(36, *shape) - expected).max() / np.abs(expected).max()
    assert error < 1e-6, f"weight {shape}: relative error {error}"


@pytest.mark.parametrize("value", [np.inf, -np.inf, np.nan])
def test_weights_transform_flags_a_non_finite_weight(value):
    weight = random((20, 18, 3, 3), 2)
    weight[17, 3, 2, 1] = value  # in the second vector of input channels
    assert gemm.winograd_weights(weight)[-1] == 0


def test_prepared_weights_are_checked():
    x, weight = random((1, 3, 8, 8), 1), random((4, 3, 3, 3), 2)
    with pytest.raises(ShapeError, match="prepared"):
        gemm.conv2d(x, weight, algorithm="winograd", prepared=gemm.winograd_weights(weight[:, :2]))
    with pytest.raises(ArgumentError, match="prepared"):
        gemm.conv2d(x, weight, prepared=gemm.winograd_weights(weight))


def test_other_geometries_run_the_implicit_gemm():
    x, weight = random((2, 3, 9, 9), 1), random((4, 3, 3, 3), 2)
    for stride, dilation, kernel in ((2, 1, 3), (1, 2, 3), (1, 1, 5)):
        w = random((4, 3, kernel, kernel), 2)
        expected = gemm.conv2d(x, w, stride=stride, padding=1, dilation=dilation)
        actual = gemm.conv2d(x, w, stride=stride, padding=1, dilation=dilation, algorithm="winograd")
        np.testing.assert_array_equal(actual, expected)
        if kernel == 3:  # the prepared conv reads the weights themselves there
            actual = winograd(x, w, stride=stride, padding=1, dilation=dilation, prepared=True)
            np.testing.assert_array_equal(actual, expected)
    with pytest.raises(ArgumentError, match="algorithm"):
        gemm.conv2d(x, weight, algorithm="fft")


@pytest.mark.parametrize(("h", "w", "kernel"), [(2, 16, (1, 1)), (1, 10, (1, 7)), (9, 2, (3, 1))])
def test_images_too_small_for_a_3x3_tile_run_the_implicit_gemm(h, w, kernel):
    """A conv Winograd does not take on images under 3 rows or columns has no 3x3 tiles (dividing by their count
    raised SIGFPE before the geometry was refused): torch's values, bit for bit the implicit GEMM's."""
    x, weight = random((2, 3, h, w), 5), random((4, 3, *kernel), 6)
    actual = gemm.conv2d(x, weight, stride=(1, 2), algorithm="winograd")
    expected = torch.nn.functional.conv2d(torch.from_numpy(x).double(), torch.from_numpy(weight).double(),
                                          stride=(1, 2))
    np.testing.assert_allclose(actual, expected.numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(actual, gemm.conv2d(x, weight, stride=(1, 2)))


@pytest.mark.parametrize("prepared", [False, True], ids=["in_call", "prepared"])
@pytest.mark.parametrize("width", [9, 40])
@pytest.mark.parametrize("where", ["input", "weight"])
def test_nan_and_inf_propagate_as_in_torch(where, width, prepared):
    """A NaN or infinity reaches exactly the outputs whose windows hold it, as in the direct sum (the transforms
    alone would spread it over the whole tile: inf - inf); in short and long tile rows."""
    x, weight = random((2, 4, 10, width), 1), random((6, 4, 3, 3), 2)
    if where == "input":
        x[0, 1, 3, 4], x[1, 2, 7, 0], x[1, 0, 0, 8] = np.nan, np.inf, -np.inf
    else:
        weight[2, 1, 0, 0], weight[4, 3, 2, 1] = np.nan, np.inf
    expected = reference(x, weight, None, 1).numpy()
    actual = winograd(x, weight, padding=1, prepared=prepared)
    np.testing.assert_array_equal(np.isnan(actual), np.isnan(expected))
    np.testing.assert_array_equal(np.isinf(actual), np.isinf(expected))
    finite = np.isfinite(expected)
    np.testing.assert_allclose(actual[finite], expected[finite], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("prepared", [False, True], ids=["in_call", "prepared"])
def test_images_from_a_group_with_a_non_finite_input_run_the_implicit_gemm(prepared):
    """Images are taken in groups (winograd.c, GROUP_TILES: 16 images of 13x13); an infinity in the second group
    sends that group and the ones after it to the implicit GEMM (the direct sum's infinities), each image with its
    own input, output and residual, while the first group stays Winograd's."""
    x, weight, bias = random((36, 3, 13, 13), 1), random((4, 3, 3, 3), 2), random((4,), 3)
    x[20, 1, 6, 6] = np.inf
    expected = reference(x, weight, bias, 1)
    residual = random(tuple(expected.shape), 4)
    expected = torch.relu(expected + torch.from_numpy(residual)).numpy()
    actual = winograd(x, weight, bias, padding=1, residual=residual, activation="relu",
                      activation_after_residual=True, prepared=prepared)
    np.testing.assert_array_equal(np.isinf(actual), np.isinf(expected))
    finite = np.isfinite(expected)
    assert np.abs(actual[finite] - expected[finite]).max() < TOLERANCE * np.abs(expected[finite]).max()
