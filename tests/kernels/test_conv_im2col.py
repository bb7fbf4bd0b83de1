"""conv2d by explicit im2col and OpenBLAS sgemm (im2col.c) against torch.nn.functional.conv2d in float64, with
fused epilogues, on both of its paths: blocks of output rows (images of at least 1024 positions) and small images
merged into one product."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tensorgraphs.errors import ArgumentError, ShapeError
from tensorgraphs.kernels import blas

pytestmark = pytest.mark.skipif(not blas.conv_available(), reason="needs scipy-openblas32 and a C compiler")

# (batch, cin, h, w, cout, kernel, stride, padding, dilation)
CASES = [
    (2, 3, 9, 11, 5, (3, 3), 2, 1, 1),  # stride 2, odd sizes: merged images
    (1, 3, 47, 45, 8, (7, 7), 2, 3, 1),  # a ResNet stem: 24x23 positions, merged
    (2, 3, 75, 71, 8, (7, 7), 2, 3, 1),  # the same over 1024 positions: blocks of output rows
    (3, 4, 8, 8, 7, (1, 1), 2, 0, 1),  # downsample
    (2, 5, 10, 13, 3, (2, 3), (1, 2), (0, 1), 1),  # rectangular everything
    (1, 2, 12, 12, 4, (3, 3), 1, 2, 2),  # dilated
    (2, 1, 4, 4, 2, (3, 3), 3, 4, 1),  # padding wider than the kernel: whole rows of zeros
    (2, 64, 40, 37, 4, (3, 3), 1, 1, 1),  # blocks of 6 output rows, the last one of 4
    (2, 16, 66, 63, 5, (3, 3), (2, 3), (2, 1), (1, 2)),  # blocks, with strides 2 and 3 and dilation
    (2, 6, 33, 40, 3, (1, 1), 1, 0, 1),  # 1x1 stride 1 over 1024 positions: the image is its own columns
    (1, 1, 1, 1, 1, (1, 1), 1, 0, 1),  # one of everything
    (5, 33, 7, 7, 40, (3, 3), 1, 1, 1),  # small images merged into one product
]


def random(shape: tuple[int, ...], seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape, dtype=np.float32)


def _expected(x, weight, bias, stride, padding, dilation) -> torch.Tensor:
    return torch.nn.functional.conv2d(
        *(None if a is None else torch.from_numpy(a).double() for a in (x, weight, bias)),
        stride=stride,
        padding=padding,
        dilation=dilation,
    )


@pytest.mark.parametrize("case", CASES, ids=str)
@pytest.mark.parametrize("epilogue", ["plain", "bias_relu", "residual", "scaled_gelu"])
def test_im2col_conv2d_agrees_with_torch(case, epilogue):
    batch, cin, h, w, cout, kernel, stride, padding, dilation = case
    x, weight, bias = random((batch, cin, h, w), 1), random((cout, cin, *kernel), 2), random((cout,), 3)
    expected = _expected(x, weight, bias if epilogue == "bias_relu" else None, stride, padding, dilation)
    arguments = {}
    if epilogue == "bias_relu":
        expected, arguments = torch.relu(expected), dict(bias=bias, activation="relu")
    if epilogue == "residual":
        residual = random(tuple(expected.shape), 4)
        expected, arguments = expected + torch.from_numpy(residual), dict(residual=residual)
    if epilogue == "scaled_gelu":
        expected = torch.nn.functional.gelu(0.5 * expected, approximate="tanh")
        arguments = dict(alpha=0.5, activation="gelu_tanh")
    actual = blas.conv2d(x, weight, stride=stride, padding=padding, dilation=dilation, **arguments)
    np.testing.assert_allclose(
        actual, expected.numpy(), rtol=1e-5, atol=1e-5 * np.sqrt(cin * np.prod(kernel)), err_msg=f"{case} {epilogue}"
    )


def test_non_contiguous_operands_are_read_as_their_values():
    x, weight = random((3, 9, 20, 14), 5).transpose(0, 1, 3, 2)[:, ::2], random((4, 5, 3, 3), 6)[..., ::-1]
    expected = _expected(np.ascontiguousarray(x), np.ascontiguousarray(weight), None, 2, 1, 1)
    np.testing.assert_allclose(blas.conv2d(x, weight, stride=2, padding=1), expected.numpy(), rtol=1e-5, atol=1e-4)


def test_nan_propagates_only_to_the_outputs_that_read_it():
    x, weight = random((1, 2, 9, 9), 7), random((3, 2, 3, 3), 8)
    x[0, 1, 4, 4] = np.nan
    actual = blas.conv2d(x, weight, stride=2, padding=1, activation="relu")
    expected = torch.relu(_expected(x, weight, None, 2, 1, 1)).numpy()
    np.testing.assert_array_equal(np.isnan(actual), np.isnan(expected))
    assert np.isnan(actual).sum() == 3  # only output (2, 2) of each channel reads input (4, 4)
    np.testing.assert_allclose(actual[~np.isnan(actual)], expected[~np.isnan(expected)], rtol=1e-5, atol=1e-5)


def test_bad_arguments_are_refused():
    with pytest.raises(ShapeError, match="conv2d"):
        blas.conv2d(random((1, 1, 2, 2), 0), random((1, 1, 5, 5), 0))
    with pytest.raises(ArgumentError, match="stride"):  # the kernel's status for a negative padding
        blas.conv2d(random((1, 1, 6, 6), 0), random((1, 1, 3, 3), 0), padding=-1)
