"""conv2d kernels against torch.nn.functional.conv2d in float64, with fused epilogues: the implicit-im2col GEMM
(conv.c, AVX-512 or AVX2), the direct conv (direct.c, the same machines) and the explicit-im2col kernel on OpenBLAS
(im2col.c, portable), case by case."""

from __future__ import annotations

import ctypes
import functools
import mmap

import numpy as np
import pytest
import torch

from tensorgraphs.errors import ArgumentError, ShapeError
from tensorgraphs.kernels import blas, gemm

AVX512 = pytest.mark.skipif(not gemm.available(), reason="needs AVX-512F and a C compiler")
KERNELS = {
    "implicit_gemm": pytest.param(gemm.conv2d, marks=AVX512),
    "direct": pytest.param(functools.partial(gemm.conv2d, algorithm="direct"), marks=AVX512),
    "im2col": pytest.param(
        blas.conv2d,
        marks=pytest.mark.skipif(not blas.conv_available(), reason="needs scipy-openblas32 and a C compiler"),
    ),
}
kernels = pytest.mark.parametrize("conv2d", list(KERNELS.values()), ids=list(KERNELS))
LIBC = ctypes.CDLL(None, use_errno=True)

# (batch, cin, h, w, cout, kernel, stride, padding, dilation)
CASES = [
    (2, 3, 9, 11, 5, (3, 3), 1, 1, 1),
    (2, 3, 9, 11, 5, (3, 3), 2, 1, 1),  # stride 2, odd sizes
    (1, 3, 23, 21, 8, (7, 7), 2, 3, 1),  # ResNet stem
    (2, 3, 75, 71, 8, (7, 7), 2, 3, 1),  # the same over 256 positions (im2col: blocks of output rows)
    (3, 4, 8, 8, 7, (1, 1), 2, 0, 1),  # downsample
    (2, 5, 10, 13, 3, (2, 3), (1, 2), (0, 1), 1),  # rectangular everything
    (1, 2, 12, 12, 4, (3, 3), 1, 2, 2),  # dilated
    (4, 33, 7, 7, 40, (3, 3), 1, 1, 1),  # K and M across register tiles; images merged into one GEMM
    (2, 1, 4, 4, 2, (3, 3), 3, 4, 1),  # padding wider than the kernel
    (2, 3, 34, 32, 4, (3, 3), 1, 1, 1),  # images large enough to run one GEMM each (others merge images)
    (3, 4, 16, 16, 6, (3, 3), 1, 1, 1),  # ...from 256 positions (conv.c, MERGE_IMAGES_BELOW)
    (3, 20, 14, 14, 24, (1, 1), 1, 0, 1),  # a 1x1 kernel's images from 128 (each a plain matrix)
    (3, 20, 11, 11, 24, (1, 1), 1, 0, 1),  # ...merged below
    (2, 40, 16, 17, 70, (1, 1), 1, 0, 1),  # ...whole panels of the image read in place at any M (gemm.c)
    (1, 400, 9, 15, 45, (1, 1), 1, 0, 1),  # ...across K blocks
    (2, 64, 40, 37, 4, (3, 3), 1, 1, 1),  # im2col: blocks of 6 output rows, the last one of 4
    (2, 16, 66, 63, 5, (3, 3), (2, 3), (2, 1), (1, 2)),  # im2col: blocks, strides 2 and 3, dilation
    (2, 6, 33, 40, 3, (1, 1), 1, 0, 1),  # a 1x1 kernel over 256 positions (im2col: the image is the columns)
    (1, 1024, 20, 20, 3, (1, 1), 1, 0, 1),  # ...in blocks of 6 output rows
    # a 1x1 kernel multiplies the image as a strided matrix: K over a cache block (partial sums in C), rows and
    # columns past whole register tiles, A read in place (under 256 columns) or packed, two images one GEMM each
    (1, 400, 9, 21, 13, (1, 1), 1, 0, 1),
    (2, 390, 32, 33, 7, (1, 1), 1, 0, 1),
    (10, 512, 7, 7, 3, (3, 3), 1, 1, 1),  # im2col: small images merged in two chunks (9 images, then 1)
    (12, 512, 13, 13, 3, (3, 3), 2, 1, 1),  # small strided images merged (AVX2's explicit columns: in chunks, 3 of 4)
    (1, 1, 1, 1, 1, (1, 1), 1, 0, 1),  # one of everything
    (2, 3, 9, 35, 4, (3, 3), 2, 1, 1),  # stride 2, rows of 18: segments wholly inside the image, then past its edge
    (2, 5, 6, 34, 3, (1, 1), 2, 0, 1),  # ...and a 1x1 whose second load ends one column past the row
    # stride 1 and "same" width pack by shifting whole images (a vector straddles two images)...
    (3, 4, 5, 6, 6, (3, 1), 1, 0, 1),  # ...with fewer output rows than input rows
    (2, 3, 6, 9, 5, (1, 5), 1, (0, 2), 1),  # ...with a wide kernel
    (8, 16, 7, 7, 40, (3, 3), 1, 1, 1),  # ...in column bands, whose last partial vector the threads split by rows
    (5, 3, 3, 3, 4, (3, 3), 1, 1, 1),  # images under 16 positions pack row segment by row segment
    # the direct conv's tiles run along output rows: rows of 16 and more with a partial last tile (of over and of
    # at most 8 columns), tasks of a few rows (a band each) with a shorter last one, phase rows of strides 2 and 3
    # with dilation, output channels across register tiles
    (3, 3, 45, 71, 13, (3, 3), 2, 0, 1),
    (2, 1, 30, 52, 7, (5, 3), (1, 3), (2, 1), (2, 2)),
    (1, 16, 29, 40, 20, (3, 3), 1, 1, 1),
    # strided bands of 64K floats (4 of 8, 8, 8, 7 output rows, whatever the threads), each panel of output
    # channels over a whole band before the next, the last panel of 1 channel
    (1, 16, 61, 230, 9, (3, 3), 2, 1, 1),
    # at stride 1 its tiles run across rows (through the padded rows' edges): vectors over three rows of 7 (4
    # panels of 8 output channels), bands of 29 and 28 rows with a last panel of 5 channels, a dilated 3x2 kernel
    # on rows of 4 (7 apart in the padded copy), padded rows whose first vectors are all padding
    (1, 128, 7, 7, 32, (3, 3), 1, 1, 1),
    (2, 40, 57, 30, 13, (3, 3), 1, 1, 1),
    (1, 3, 6, 5, 9, (3, 2), 1, (2, 1), (2, 3)),
    (2, 2, 3, 4, 3, (3, 3), 1, (1, 18), 1),
    # 16 or 32 output channels on rows of at most 14 (AVX-512): channels in the lanes, rows of 11 in tiles of 14,
    # of 3 in tiles of 7 with 45 taps (a partial block of the weights' transpose), a dilated kernel
    (2, 20, 12, 11, 16, (3, 3), 1, 1, 1),
    (1, 5, 4, 3, 32, (3, 3), 1, 1, 1),
    (1, 6, 9, 10, 16, (3, 3), 1, 2, 2),
    # stride 2 on AVX-512 multiplies phase planes (conv.c, phase_planes_fit): a 5x5 kernel whose last taps read
    # the planes' last row, a 1x1 with padding (one phase plane, the odd one), a 1x1 without (the image subsampled,
    # read in place across K blocks), a 3x3 without padding whose last tap reads past the planes (explicit columns
    # instead), a 2x2 patch kernel
    (1, 4, 11, 13, 6, (5, 5), 2, 2, 1),
    (2, 3, 10, 9, 4, (1, 1), 2, 1, 1),
    (1, 400, 30, 34, 9, (1, 1), 2, 0, 1),
    (1, 5, 20, 20, 7, (3, 3), 2, 0, 1),
    (2, 6, 16, 12, 5, (2, 2), 2, 0, 1),
]


def random(shape: tuple[int, ...], seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape, dtype=np.float32)


def _expected(x, weight, bias, stride, padding, dilation) -> torch.Tensor:
    operands = (None if a is None else torch.from_numpy(np.ascontiguousarray(a)).double() for a in (x, weight, bias))
    return torch.nn.functional.conv2d(*operands, stride=stride, padding=padding, dilation=dilation)


@kernels
@pytest.mark.parametrize("case", CASES, ids=str)
@pytest.mark.parametrize(
    "epilogue", ["plain", "bias_relu", "residual", "scaled_gelu", "relu_then_residual", "residual_then_relu"]
)
def test_conv2d_agrees_with_torch(conv2d, case, epilogue):
    """Every kernel on every path (merged small images, large ones one by one or in blocks of rows, AVX2's explicit
    columns for strided convs, 1x1 and 3x3...) with each epilogue, the relu before or after the residual (a ResNet
    block's) included."""
    batch, cin, h, w, cout, kernel, stride, padding, dilation = case
    x, weight, bias = random((batch, cin, h, w), 1), random((cout, cin, *kernel), 2), random((cout,), 3)
    expected = _expected(x, weight, bias if epilogue == "bias_relu" else None, stride, padding, dilation)
    arguments = {}
    if epilogue == "bias_relu":
        expected, arguments = torch.relu(expected), dict(bias=bias, activation="relu")
    if epilogue == "residual":
        residual = random(tuple(expected.shape), 4)
        expected, arguments = expected + torch.from_numpy(residual), dict(residual=residual)
    if epilogue in ("relu_then_residual", "residual_then_relu"):
        after = epilogue == "residual_then_relu"
        residual = torch.from_numpy(random(tuple(expected.shape), 4))
        expected = 0.5 * expected + torch.from_numpy(bias).double().reshape(-1, 1, 1)
        expected = torch.relu(expected + residual) if after else torch.relu(expected) + residual
        arguments = dict(
            alpha=0.5, bias=bias, residual=residual.numpy(), activation="relu", activation_after_residual=after
        )
    if epilogue == "scaled_gelu":
        expected = torch.nn.functional.gelu(0.5 * expected, approximate="tanh")
        arguments = dict(alpha=0.5, activation="gelu_tanh")
    actual = conv2d(x, weight, stride=stride, padding=padding, dilation=dilation, **arguments)
    np.testing.assert_allclose(
        actual, expected.numpy(), rtol=1e-5, atol=1e-5 * np.sqrt(cin * np.prod(kernel)), err_msg=f"{case} {epilogue}"
    )


@kernels
def test_non_contiguous_operands_are_read_as_their_values(conv2d):
    x, weight = random((3, 9, 20, 14), 5).transpose(0, 1, 3, 2)[:, ::2], random((4, 5, 3, 3), 6)[..., ::-1]
    expected = _expected(x, weight, None, 2, 1, 1)
    np.testing.assert_allclose(conv2d(x, weight, stride=2, padding=1), expected.numpy(), rtol=1e-5, atol=1e-4)


@kernels
def test_nan_propagates_only_to_the_outputs_that_read_it(conv2d):
    x, weight = random((1, 2, 9, 9), 7), random((3, 2, 3, 3), 8)
    x[0, 1, 4, 4] = np.nan
    actual = conv2d(x, weight, stride=2, padding=1, activation="relu")
    expected = torch.relu(_expected(x, weight, None, 2, 1, 1)).numpy()
    np.testing.assert_array_equal(np.isnan(actual), np.isnan(expected))
    assert np.isnan(actual).sum() == 3  # only output (2, 2) of each channel reads input (4, 4)
    np.testing.assert_allclose(actual[~np.isnan(actual)], expected[~np.isnan(expected)], rtol=1e-5, atol=1e-5)


@kernels
@pytest.mark.parametrize(("kernel", "stride", "padding"), [((3, 3), 1, 1), ((1, 1), 1, 1), ((2, 2), 2, 0)], ids=str)
def test_no_input_channels_give_the_epilogue_of_zero(conv2d, kernel, stride, padding):
    """An empty sum: the implicit GEMM's explicit columns (a 1x1 kernel with padding, stride 2) and the direct conv
    sized their tasks by the columns per input channel, and divided by zero."""
    x, weight, bias = random((2, 0, 9, 8), 9), random((5, 0, *kernel), 10), random((5,), 11)
    oh, ow = ((size + 2 * padding - k) // stride + 1 for size, k in zip((9, 8), kernel, strict=True))
    residual = random((2, 5, oh, ow), 12)  # (torch gives no channels for no input channels)
    actual = conv2d(x, weight, bias, stride, padding, residual=residual, activation="relu")
    np.testing.assert_array_equal(actual, np.maximum(bias, 0)[:, None, None] + residual)


@kernels
def test_bad_arguments_are_refused(conv2d):
    with pytest.raises(ShapeError, match="conv2d"):
        conv2d(random((1, 1, 2, 2), 0), random((1, 1, 5, 5), 0))
    with pytest.raises(ArgumentError, match="stride"):  # the kernel's status for a negative padding
        conv2d(random((1, 1, 6, 6), 0), random((1, 1, 3, 3), 0), padding=-1)


@AVX512
def test_conv1d_is_conv2d_over_a_row():
    x, weight, bias = random((2, 6, 40), 5), random((9, 6, 5), 6), random((9,), 7)
    expected = torch.nn.functional.conv1d(
        *(torch.from_numpy(v).double() for v in (x, weight, bias)), stride=2, padding=3, dilation=2
    )
    actual = gemm.conv1d(x, weight, bias, stride=2, padding=3, dilation=2)
    np.testing.assert_allclose(actual, expected.numpy(), rtol=1e-5, atol=1e-4)


@kernels
def test_infinities_and_nan_reach_the_outputs_torch_gives_them(conv2d):
    """An infinite weight times a tap in the padding is NaN, as in torch (which multiplies the padding's zeros too);
    an infinite input reaches exactly the outputs whose windows hold it."""
    x, weight = random((2, 3, 11, 37), 9), random((8, 3, 3, 3), 10)
    x[0, 0, 0, 5], x[1, 2, 6, 36], x[1, 1, 10, 0] = np.inf, -np.inf, np.nan
    weight[3, 1, 0, 0] = np.inf
    for stride in (1, 2):
        actual = conv2d(x, weight, stride=stride, padding=1)
        expected = _expected(x, weight, None, stride, 1, 1).numpy()
        for where in (np.isnan, np.isposinf, np.isneginf):
            np.testing.assert_array_equal(where(actual), where(expected), err_msg=f"stride {stride} {where.__name__}")
        finite = np.isfinite(expected)
        np.testing.assert_allclose(actual[finite], expected[finite], rtol=1e-5, atol=1e-4)


@kernels
@pytest.mark.parametrize("shape", [(3, 4, 6, 5), (2, 4, 40, 37)], ids=["merged", "large"])
@pytest.mark.parametrize("stride", [1, 2])
def test_activation_after_the_residual_keeps_nan_inf_and_signed_zeros_like_torch(conv2d, shape, stride):
    """relu(conv + bias + residual) with NaN, infinities and zeros of both signs in the residual: relu(NaN) is NaN,
    relu(-inf) 0, relu(-0.0) -0.0 as in torch (zero weights times alpha -1 are -0.0, plus the -0.0 bias), on merged
    small images (the residual added by the scatter, so is the relu) and large ones; and gelu after the residual.
    (OpenBLAS's sgemm gives +0.0 for alpha -1 times a zero product: the im2col kernel's signs of zero are its
    product's.)"""
    x, weight = random(shape, 11), np.zeros((5, shape[1], 3, 3), np.float32)
    bias = np.full(5, -0.0, np.float32)
    expected = _expected(x, weight, bias, stride, 1, 1).neg()
    special = np.array([np.nan, np.inf, -np.inf, -0.0, 0.0, 1e30, -1e30, -3.0, 2.0], np.float32)
    residual = np.resize(special, tuple(expected.shape))
    actual = conv2d(
        x, weight, bias, stride, 1, alpha=-1.0, residual=residual, activation="relu", activation_after_residual=True
    )
    expected = torch.relu(expected + torch.from_numpy(residual)).numpy()
    np.testing.assert_array_equal(actual, expected.astype(np.float32))
    if conv2d is not blas.conv2d:
        np.testing.assert_array_equal(np.signbit(actual), np.signbit(expected))
    weight, residual = random(weight.shape, 12), random(residual.shape, 13)
    actual = conv2d(
        x, weight, bias, stride, 1, residual=residual, activation="gelu_tanh", activation_after_residual=True
    )
    expected = torch.nn.functional.gelu(
        _expected(x, weight, bias, stride, 1, 1) + torch.from_numpy(residual), approximate="tanh"
    )
    np.testing.assert_allclose(actual, expected.numpy(), rtol=1e-5, atol=1e-4)


# (batch, cin, h, w, cout, kernel, stride, padding): merged small images (7x7; 13x13 strided: phase planes, AVX2's
# explicit columns merged), large ones (one GEMM each; AVX2's column blocks of output rows), odd channel counts, one
# image
STRIDED_OUT_CASES = [
    (8, 16, 7, 7, 12, (3, 3), 1, 1),
    (3, 5, 9, 11, 7, (3, 3), 1, 1),
    (8, 8, 13, 13, 5, (1, 1), 2, 0),
    (2, 3, 34, 32, 5, (3, 3), 1, 1),
    (2, 16, 66, 63, 5, (3, 3), 2, 1),
    (1, 4, 7, 7, 3, (3, 3), 1, 1),
]


@pytest.mark.parametrize(
    "conv2d",
    [*KERNELS.values(), pytest.param(functools.partial(gemm.conv2d, algorithm="winograd"), marks=AVX512)],
    ids=[*KERNELS, "winograd"],
)
@pytest.mark.parametrize("case", STRIDED_OUT_CASES, ids=str)
def test_output_images_are_written_into_a_slice_of_the_channels(conv2d, case):
    """out= a slice of a concatenation along the channels (images `out_bs` floats apart, tg_conv2d_fn): every kernel
    writes its images there with the whole epilogue, the residual read contiguous, and nothing else of the buffer
    (NaN before, NaN after)."""
    batch, cin, h, w, cout, kernel, stride, padding = case
    x, weight, bias = random((batch, cin, h, w), 11), random((cout, cin, *kernel), 12), random((cout,), 13)
    expected = torch.relu(0.5 * _expected(x, weight, None, stride, padding, 1) + torch.from_numpy(bias)[:, None, None])
    residual = random(tuple(expected.shape), 14)
    concatenation = np.full((batch, cout + 9, *expected.shape[2:]), np.nan, np.float32)
    out = concatenation[:, 4 : 4 + cout]
    got = conv2d(x, weight, bias, stride, padding, residual=residual, activation="relu", alpha=0.5, out=out)
    assert got is out
    np.testing.assert_allclose(out, (expected + torch.from_numpy(residual)).numpy(), rtol=1e-5, atol=1e-4)
    assert np.isnan(np.delete(concatenation, np.s_[4 : 4 + cout], 1)).all(), f"{case}: wrote outside its slice"


# (batch, cin, h, w, cout, kernel, stride, padding, algorithm): the library's kernels with `out` the residual itself
# (gemm.h): a 1x1 whose K fits one cache block and one across blocks (partial sums in C: the residual copied
# first), a 3x3 across blocks, merged small images, Winograd (its fallback's implicit GEMM too), the direct conv
OVER_RESIDUAL_CASES = [
    (2, 64, 9, 10, 70, (1, 1), 1, 0, "implicit_gemm"),
    (1, 400, 9, 21, 13, (1, 1), 1, 0, "implicit_gemm"),
    (2, 48, 20, 19, 9, (3, 3), 1, 1, "implicit_gemm"),
    (4, 33, 7, 7, 40, (3, 3), 1, 1, "implicit_gemm"),
    (2, 45, 18, 17, 20, (3, 3), 1, 1, "winograd"),
    (1, 3, 23, 21, 8, (7, 7), 2, 3, "direct"),
]


@pytest.mark.skipif(not gemm.available(), reason="needs AVX-512F and a C compiler")
@pytest.mark.parametrize("after", [False, True], ids=["relu_then_residual", "residual_then_relu"])
@pytest.mark.parametrize("case", OVER_RESIDUAL_CASES, ids=str)
def test_the_output_may_be_the_residual(case, after):
    """out= the residual's own array: each element's residual is read before it is overwritten, also where the
    reduction spans K blocks."""
    batch, cin, h, w, cout, kernel, stride, padding, algorithm = case
    x, weight, bias = random((batch, cin, h, w), 21), random((cout, cin, *kernel), 22), random((cout,), 23)
    conv = _expected(x, weight, bias, stride, padding, 1)
    residual = random(tuple(conv.shape), 24)
    summed = conv + torch.from_numpy(residual)
    expected = torch.relu(summed) if after else torch.relu(conv) + torch.from_numpy(residual)
    got = gemm.conv2d(x, weight, bias, stride, padding, residual=residual, activation="relu",
                      activation_after_residual=after, out=residual, algorithm=algorithm)
    assert got is residual
    scale = float(expected.abs().max())  # Winograd's error is ~1e-5 of the largest output (test_winograd.py)
    np.testing.assert_allclose(got, expected.numpy(), rtol=1e-4, atol=3e-5 * scale)


def test_an_output_over_the_residual_is_refused_where_the_kernel_writes_it_first():
    """The BLAS kernel writes the product before it adds the residual: `out` may not be its residual."""
    x, weight = random((1, 3, 5, 5), 25), random((4, 3, 1, 1), 26)
    residual = random((1, 4, 5, 5), 27)
    with pytest.raises(ArgumentError, match="overlap"):
        gemm.call_conv(lambda *_: 0, x, weight, residual=residual, out=residual)


def test_overlapping_output_images_are_refused():
    x, weight = random((2, 3, 5, 5), 15), random((4, 3, 1, 1), 16)
    overlapping = np.lib.stride_tricks.as_strided(np.zeros(200, np.float32), (2, 4, 5, 5), (40, 100, 20, 4))
    with pytest.raises(ArgumentError, match="overlap"):
        gemm.call_conv(lambda *_: 0, x, weight, out=overlapping)
    out = np.empty((2, 4, 5, 5), np.float32)
    for function in [gemm._functions()[name] for name in gemm.CONV_ALGORITHMS.values()] if gemm.available() else []:
        geometry = (2, 3, 5, 5, 4, 1, 1, 1, 1, 0, 0, 1, 1)  # the kernel's own check: images 99 floats apart
        status = function(*geometry, x.ctypes.data, weight.ctypes.data, None, out.ctypes.data, 99, 1.0, None, 0)
        assert status == -1, function


@pytest.fixture
def unreadable_after():
    """fn(shape) -> a float32 array of `shape` whose last element ends where a page range with no access begins (as
    large as the array again): a masked-off lane there would fault, which a masked load suppresses, on some CPUs
    (Zen 4) by a slow microcode assist."""
    regions = []

    def make(shape: tuple[int, ...]) -> np.ndarray:
        size = int(np.prod(shape)) * 4
        pages = -(-size // mmap.PAGESIZE) * mmap.PAGESIZE
        region = mmap.mmap(-1, 2 * pages)
        guard = ctypes.addressof(ctypes.c_char.from_buffer(region)) + pages
        assert LIBC.mprotect(ctypes.c_void_p(guard), pages, 0) == 0  # PROT_NONE
        regions.append((region, guard, pages))
        return np.frombuffer(region, np.float32, int(np.prod(shape)), pages - size).reshape(shape)

    yield make
    for _region, start, length in regions:  # readable again, for the buffer's release
        LIBC.mprotect(ctypes.c_void_p(start), length, mmap.PROT_READ | mmap.PROT_WRITE)


@AVX512
@pytest.mark.parametrize("algorithm", ["implicit_gemm", "direct", "winograd"])
@pytest.mark.parametrize(("size", "kernel", "stride", "padding"),
                         [(32, 3, 1, 1), (32, 3, 2, 1), (14, 3, 2, 1), (32, 1, 1, 0), (33, 1, 2, 0), (16, 3, 1, 0)])
def test_nothing_is_read_past_the_input(unreadable_after, algorithm, size, kernel, stride, padding):
    """An input that ends where memory with no access begins: a read past it faults, a masked-off lane there does
    not (but one vector's load with no lane at all, past the image, took a slow assist on Zen 4: bench/NOTES.md).
    Every kernel and packing path: the shifted images, stride 2's phase planes, explicit columns, a 1x1 image as a
    matrix, "valid" padding; values against torch."""
    x = random((1, 32, size, size), 21)
    weight, bias = random((24, 32, kernel, kernel), 22), random((24,), 23)
    at_the_edge = unreadable_after(x.shape)
    at_the_edge[...] = x
    got = gemm.conv2d(at_the_edge, weight, bias, stride, padding, activation="relu", algorithm=algorithm)
    expected = torch.relu(_expected(x, weight, bias, stride, padding, 1)).numpy()
    tolerance = 1e-3 if algorithm == "winograd" else 1e-4  # Winograd's transforms round more
    np.testing.assert_allclose(got, expected, rtol=tolerance / 10, atol=tolerance)
