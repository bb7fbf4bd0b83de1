"""conv2d lowered to GEMM (implicit im2col) against torch.nn.functional.conv2d, with fused epilogues."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tensorgraphs.errors import ShapeError
from tensorgraphs.kernels import gemm

pytestmark = pytest.mark.skipif(not gemm.available(), reason="needs AVX-512F and a C compiler")

# (batch, cin, h, w, cout, kernel, stride, padding, dilation)
CASES = [
    (2, 3, 9, 11, 5, (3, 3), 1, 1, 1),
    (1, 3, 23, 21, 8, (7, 7), 2, 3, 1),  # ResNet stem
    (3, 4, 8, 8, 7, (1, 1), 2, 0, 1),  # downsample
    (2, 5, 10, 13, 3, (2, 3), (1, 2), (0, 1), 1),  # rectangular everything
    (1, 2, 12, 12, 4, (3, 3), 1, 2, 2),  # dilated
    (4, 33, 7, 7, 40, (3, 3), 1, 1, 1),  # K and M across register tiles; images merged into one GEMM
    (2, 1, 4, 4, 2, (3, 3), 3, 4, 1),  # padding wider than the kernel
    (2, 3, 34, 32, 4, (3, 3), 1, 1, 1),  # images large enough to run one GEMM each (others merge images)
    # stride 1 and "same" width pack by shifting whole images (a vector straddles two images)...
    (3, 4, 5, 6, 6, (3, 1), 1, 0, 1),  # ...with fewer output rows than input rows
    (2, 3, 6, 9, 5, (1, 5), 1, (0, 2), 1),  # ...with a wide kernel
    (8, 16, 7, 7, 40, (3, 3), 1, 1, 1),  # ...in column bands, whose last partial vector the threads split by rows
    (5, 3, 3, 3, 4, (3, 3), 1, 1, 1),  # images under 16 positions pack row segment by row segment
]


def random(shape: tuple[int, ...], seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape, dtype=np.float32)


@pytest.mark.parametrize("case", CASES, ids=str)
@pytest.mark.parametrize("epilogue", ["plain", "bias_relu", "residual"])
def test_conv2d_agrees_with_torch(case, epilogue):
    batch, cin, h, w, cout, kernel, stride, padding, dilation = case
    x, weight, bias = random((batch, cin, h, w), 1), random((cout, cin, *kernel), 2), random((cout,), 3)
    expected = torch.nn.functional.conv2d(
        torch.from_numpy(x).double(),
        torch.from_numpy(weight).double(),
        torch.from_numpy(bias).double() if epilogue == "bias_relu" else None,
        stride,
        padding,
        dilation,
    )
    arguments = {}
    if epilogue == "bias_relu":
        expected, arguments = torch.relu(expected), dict(bias=bias, activation="relu")
    if epilogue == "residual":
        residual = random(tuple(expected.shape), 4)
        expected, arguments = expected + torch.from_numpy(residual), dict(residual=residual)
    actual = gemm.conv2d(x, weight, stride=stride, padding=padding, dilation=dilation, **arguments)
    np.testing.assert_allclose(
        actual, expected.numpy(), rtol=1e-5, atol=1e-5 * np.sqrt(cin * np.prod(kernel)), err_msg=f"{case} {epilogue}"
    )


def test_kernel_larger_than_the_padded_input_raises():
    with pytest.raises(ShapeError, match="conv2d"):
        gemm.conv2d(random((1, 1, 2, 2), 0), random((1, 1, 5, 5), 0))


def test_conv1d_is_conv2d_over_a_row():
    x, weight, bias = random((2, 6, 40), 5), random((9, 6, 5), 6), random((9,), 7)
    expected = torch.nn.functional.conv1d(
        *(torch.from_numpy(v).double() for v in (x, weight, bias)), stride=2, padding=3, dilation=2
    )
    actual = gemm.conv1d(x, weight, bias, stride=2, padding=3, dilation=2)
    np.testing.assert_allclose(actual, expected.numpy(), rtol=1e-5, atol=1e-4)
