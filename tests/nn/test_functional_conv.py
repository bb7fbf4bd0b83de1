"""conv1d, conv2d, conv_transpose2d and pooling against torch: values and gradients."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as TF
from functional_check import check, normal

import tensorgraphs as tg
import tensorgraphs.nn.functional as F
from tensorgraphs.nn.functional import conv, pooling

CONV2D_CASES = [  # input shape, weight shape, keyword arguments
    ((2, 3, 7, 7), (4, 3, 3, 3), {}),
    ((1, 1, 5, 3), (2, 1, 1, 1), {"stride": 2}),
    ((2, 4, 7, 6), (6, 2, 3, 2), {"stride": (2, 1), "padding": (1, 2), "dilation": (1, 2), "groups": 2}),
    ((1, 3, 6, 7), (3, 1, 3, 3), {"padding": "same", "groups": 3}),
    ((2, 2, 6, 7), (3, 2, 4, 2), {"padding": "same", "dilation": 2}),
    ((1, 2, 5, 5), (2, 2, 3, 3), {"padding": "valid", "stride": 3}),
    ((3, 7, 7), (2, 3, 3, 3), {"stride": 2, "padding": 1, "groups": 1}),
    ((2, 3, 7, 6), (6, 1, 3, 3), {"stride": 2, "padding": 1, "groups": 3}),  # depthwise, two outputs per channel
    ((2, 8, 5, 4), (12, 2, 1, 1), {"groups": 4}),  # grouped 1x1: its columns are the input itself
]


def _conv_inputs(x_shape: tuple, w_shape: tuple, out_channels: int) -> list[np.ndarray]:
    return [normal(1, *x_shape), normal(2, *w_shape), normal(3, out_channels)]


@pytest.mark.parametrize("x_shape,w_shape,kwargs", CONV2D_CASES)
def test_conv2d_matches_torch(x_shape: tuple, w_shape: tuple, kwargs: dict) -> None:
    if x_shape[-3] != w_shape[1] * kwargs.get("groups", 1):
        x_shape = x_shape[:-3] + (w_shape[1] * kwargs.get("groups", 1),) + x_shape[-2:]
    check(lambda x, w, b: F.conv2d(x, w, b, **kwargs), lambda x, w, b: TF.conv2d(x, w, b, **kwargs),
          _conv_inputs(x_shape, w_shape, w_shape[0]), grad=[0, 1, 2], rtol=1e-4, atol=1e-4, name="conv2d")


@pytest.mark.parametrize("x_shape,w_shape,kwargs", [
    ((2, 3, 7), (4, 3, 3), {}),
    ((1, 4, 9), (2, 2, 3), {"stride": 2, "padding": 1, "dilation": 2, "groups": 2}),
    ((3, 5), (2, 3, 4), {"padding": "same"}),
])
def test_conv1d_matches_torch(x_shape: tuple, w_shape: tuple, kwargs: dict) -> None:
    check(lambda x, w, b: F.conv1d(x, w, b, **kwargs), lambda x, w, b: TF.conv1d(x, w, b, **kwargs),
          _conv_inputs(x_shape, w_shape, w_shape[0]), grad=[0, 1, 2], rtol=1e-4, atol=1e-4, name="conv1d")


@pytest.mark.parametrize("x_shape,w_shape,kwargs", [
    ((2, 3, 4, 5), (3, 2, 3, 3), {}),
    ((1, 2, 3, 3), (2, 3, 3, 2), {"stride": 2, "padding": 1, "output_padding": 1}),
    ((2, 4, 3, 4), (4, 1, 2, 3), {"stride": (2, 3), "padding": (0, 2), "dilation": (2, 1), "groups": 2,
                                  "output_padding": (1, 2)}),
    ((3, 5, 5), (3, 2, 1, 1), {"stride": 3}),
])
def test_conv_transpose2d_matches_torch(x_shape: tuple, w_shape: tuple, kwargs: dict) -> None:
    out_channels = w_shape[1] * kwargs.get("groups", 1)
    check(lambda x, w, b: F.conv_transpose2d(x, w, b, **kwargs),
          lambda x, w, b: TF.conv_transpose2d(x, w, b, **kwargs),
          _conv_inputs(x_shape, w_shape, out_channels), grad=[0, 1, 2], rtol=1e-4, atol=1e-4,
          name="conv_transpose2d")


LONG_CONV_CASES = [  # dims, input shape, weight shape, keyword arguments: more than LONG_WINDOW_TAPS taps
    (1, (2, 3, 400), (4, 3, 251), {"padding": 125}),
    (1, (1, 2, 300), (3, 2, 70), {"stride": 3, "dilation": 2, "padding": 7}),
    (1, (1, 2, 500), (2, 2, 70), {"stride": 150}),  # stride beyond the window: unfolded rows padded
    (2, (2, 4, 13, 12), (6, 2, 9, 8), {"stride": (2, 1), "padding": (4, 3), "groups": 2}),
    (2, (1, 3, 12, 12), (3, 1, 9, 9), {"padding": "same", "groups": 3}),  # depthwise
]


@pytest.mark.parametrize("dims,x_shape,w_shape,kwargs", LONG_CONV_CASES)
def test_convs_of_long_windows_match_torch(dims: int, x_shape: tuple, w_shape: tuple, kwargs: dict) -> None:
    name = f"conv{dims}d"
    check(lambda x, w, b: getattr(F, name)(x, w, b, **kwargs), lambda x, w, b: getattr(TF, name)(x, w, b, **kwargs),
          _conv_inputs(x_shape, w_shape, w_shape[0]), grad=[0, 1, 2], rtol=1e-4, atol=1e-4, name=name)


@pytest.mark.parametrize("x_shape,w_shape,kwargs", CONV2D_CASES)
def test_unfolded_windows_equal_the_window_views(monkeypatch: pytest.MonkeyPatch, x_shape: tuple, w_shape: tuple,
                                                 kwargs: dict) -> None:
    """Every conv taken by movement alone (the long windows' columns), against torch."""
    monkeypatch.setattr(conv, "LONG_WINDOW_TAPS", 0)
    test_conv2d_matches_torch(x_shape, w_shape, kwargs)


def test_a_long_conv_and_its_gradient_take_a_constant_number_of_operations() -> None:
    """251 taps: a view per tap would be a 251-piece concatenation whose lowering and gradient took about a
    minute; float64 is interpreted, where each piece was padded to the whole columns. Folding 200 taps: a sum of
    200 shifted blocks before."""
    from tensorgraphs.graph.node import toposort

    x, w = tg.tensor(normal(3, 2, 3, 400), requires_grad=True), tg.tensor(normal(4, 4, 3, 251), requires_grad=True)
    out = F.conv1d(x, w, padding=125)
    gx, gw = tg.grad(out, [x, w], grad_outputs=tg.ones(*out.shape))
    assert len(toposort([out.node, gx.node, gw.node])) < 60
    windows = conv.unfolded_windows(tg.tensor(normal(5, 1, 1, 40, 50)), (9, 8), (2, 3), (1, 2))
    assert len(toposort([windows.node])) < 30
    folded = F.fold(tg.tensor(normal(7, 1, 3 * 200, 91)), (1, 1000), (1, 200), stride=(1, 10), padding=(0, 50))
    assert len(toposort([folded.node])) < 30
    xd, wd = normal(5, 1, 2, 300).astype(np.float64), normal(6, 3, 2, 200).astype(np.float64)
    np.testing.assert_allclose(F.conv1d(tg.tensor(xd), tg.tensor(wd), padding=20).numpy(),
                               TF.conv1d(torch.tensor(xd), torch.tensor(wd), padding=20).numpy(), rtol=1e-10)


def test_conv_graph_keeps_the_composite_and_differentiates_to_matmuls() -> None:
    from tensorgraphs.graph.node import toposort

    x, w = tg.randn(1, 2, 5, 5, requires_grad=True), tg.randn(3, 2, 3, 3, requires_grad=True)
    out = F.conv2d(x, w)
    assert out.node.op.name == "conv2d"
    assert F.conv1d(tg.randn(1, 2, 5), tg.randn(3, 2, 3)).node.src[0].op.name == "conv2d"
    gx, gw = tg.grad(out, [x, w], grad_outputs=tg.randn(*out.shape))
    for g in (gx, gw):
        names = {getattr(n.op, "name", None) for n in toposort([g.node])}
        assert "matmul" in names


def test_grouped_and_depthwise_convs_run_without_transposes() -> None:
    """The decomposition's product is kernels @ columns in the output's layout; with the GEMM library a grouped 1x1
    conv compiles to the weights scaled per output channel and one product per image reading the input where it
    lies, the relu its epilogue (schedule.convolution's "grouped_gemm"); a depthwise conv (one input channel per
    group) to one elementwise loop with no product."""
    from tensorgraphs.backends.cpu import CPU
    from tensorgraphs.codegen.loop_ir import GemmCall, walk
    from tensorgraphs.schedule.extern import gemm_enabled

    x, scale = tg.tensor(normal(33, 1, 8, 5, 4)), tg.tensor(normal(34, 12, 1, 1))
    grouped = F.relu(F.conv2d(x, tg.tensor(normal(35, 12, 2, 1, 1)), groups=4) * scale)
    program, _ = CPU.program([grouped.node])
    calls = [[isinstance(s, GemmCall) for s in walk(k.body)] for k in program.kernels]
    assert len(calls) == 2 and (calls[1] == [True] or not gemm_enabled()), [k.name for k in program.kernels]
    depthwise = F.conv2d(tg.tensor(normal(36, 2, 6, 9, 9)), tg.tensor(normal(37, 6, 1, 3, 3)), stride=2, padding=1,
                         groups=6)
    program, _ = CPU.program([depthwise.node])
    assert len(program.kernels) == 1, [k.name for k in program.kernels]
    assert not [s for k in program.kernels for s in walk(k.body) if isinstance(s, GemmCall)]


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_depthwise_conv_sums_in_float32(dtype: str) -> None:
    """Summed in float16 a 5x5 depthwise window would round 25 times; summed in float32 and rounded once it is
    the float64 result of the rounded operands rounded once (one step off where the float32 sum lands on a
    rounding boundary)."""
    import torch

    x, w = normal(31, 2, 4, 9, 9), normal(32, 4, 1, 5, 5)
    half = getattr(torch, dtype)
    tx, tw = (torch.from_numpy(a).to(half).double() for a in (x, w))
    expected = TF.conv2d(tx, tw, padding=2, groups=4).to(half).double().numpy()
    out = F.conv2d(tg.tensor(x).to(getattr(tg, dtype)), tg.tensor(w).to(getattr(tg, dtype)), padding=2, groups=4)
    value = out.double().numpy()
    assert np.mean(value != expected) < 0.01
    np.testing.assert_allclose(value, expected, rtol=2**-7 if dtype == "bfloat16" else 2**-10, atol=1e-6)


def test_conv_errors_name_the_shapes() -> None:
    with pytest.raises(tg.ShapeError, match=r"weight of size \(8, 3, 3, 3\).*\(2, 4, 5, 5\).*3 channels.*4 channels"):
        F.conv2d(tg.randn(2, 4, 5, 5), tg.randn(8, 3, 3, 3))
    with pytest.raises(tg.ArgumentError, match="strided"):
        F.conv2d(tg.randn(1, 1, 5, 5), tg.randn(1, 1, 3, 3), stride=2, padding="same")
    with pytest.raises(tg.ShapeError, match="too small"):
        F.conv2d(tg.randn(1, 1, 2, 2), tg.randn(1, 1, 3, 3))
    with pytest.raises(tg.ArgumentError, match="stride must be at least 1"):
        F.conv2d(tg.randn(1, 1, 3, 3), tg.randn(1, 1, 3, 3), stride=(1, 0))
    with pytest.raises(tg.DTypeError, match="conv2d"):
        F.conv2d(tg.randn(1, 1, 3, 3), tg.randn(1, 1, 3, 3, dtype=tg.float64))


def test_conv_propagates_nan_only_through_its_windows() -> None:
    x = normal(4, 1, 1, 6, 6)
    x[0, 0, 0, 0] = math.nan
    check(lambda a, w: F.conv2d(a, w), lambda a, w: TF.conv2d(a, w), [x, normal(5, 1, 1, 2, 2)], name="conv2d")


POOL_CASES = [  # input shape, keyword arguments
    ((2, 3, 7, 7), {"kernel_size": 3}),
    ((1, 1, 5, 6), {"kernel_size": 2, "stride": 1}),
    ((2, 2, 7, 5), {"kernel_size": (3, 2), "stride": (2, 1), "padding": (1, 1)}),
    ((1, 2, 7, 7), {"kernel_size": 3, "stride": 2, "padding": 1, "ceil_mode": True}),
    ((3, 6, 5), {"kernel_size": 2, "ceil_mode": True}),
    ((1, 1, 1, 1), {"kernel_size": 1}),
]


@pytest.mark.parametrize("x_shape,kwargs", POOL_CASES)
def test_max_pool2d_matches_torch(x_shape: tuple, kwargs: dict) -> None:
    check(lambda x: F.max_pool2d(x, **kwargs), lambda x: TF.max_pool2d(x, **kwargs), [normal(6, *x_shape)], grad=[0],
          name="max_pool2d")


def test_max_pool2d_dilation_indices_and_nan() -> None:
    x = normal(7, 2, 2, 7, 7)
    x[0, 0, 3, 3] = math.nan
    kwargs = {"kernel_size": 3, "stride": 2, "padding": 1, "dilation": 2, "return_indices": True}
    check(lambda t: F.max_pool2d(t, **kwargs), lambda t: TF.max_pool2d(t, **kwargs), [x], name="max_pool2d")


def test_max_pool2d_gradient_goes_to_the_first_of_tied_maxima() -> None:
    x = np.zeros((1, 2, 5, 5), np.float32)
    x[0, 1, 1:3, 1:3] = 2.0
    check(lambda t: F.max_pool2d(t, 3, stride=2, padding=1), lambda t: TF.max_pool2d(t, 3, stride=2, padding=1), [x],
          grad=[0], name="max_pool2d")


LONG_POOL_CASES = [  # dims, input shape, keyword arguments: windows of more than LONG_WINDOW_TAPS taps (doubling)
    (1, (1, 2, 300), {"kernel_size": 70, "stride": 10, "padding": 30}),
    (2, (2, 12, 13), {"kernel_size": (9, 8), "stride": (2, 3), "padding": (4, 2), "ceil_mode": True}),
    (2, (2, 1, 11, 11), {"kernel_size": 11, "stride": 1, "padding": 5}),
]


@pytest.mark.parametrize("dims,x_shape,kwargs", LONG_POOL_CASES)
def test_pooling_of_long_windows_matches_torch(dims: int, x_shape: tuple, kwargs: dict) -> None:
    """Values and gradients, max pooling's indices (with tied maxima: the first in the window's row-major order
    wins, and dilated windows) and a NaN."""
    x = np.round(normal(15, *x_shape) * 2) / 2
    x.reshape(-1)[5] = math.nan
    dilated = [(f"max_pool{dims}d", {"return_indices": True, "dilation": 3})] if dims == 1 else []
    for name, options in [(f"max_pool{dims}d", {"return_indices": True}), *dilated, (f"avg_pool{dims}d", {}),
                          (f"avg_pool{dims}d", {"count_include_pad": False})]:
        args = dict(kwargs, **options)
        check(lambda t: getattr(F, name)(t, **args), lambda t: getattr(TF, name)(t, **args), [x], grad=[0],
              name=name)


@pytest.mark.parametrize("x_shape,kwargs", POOL_CASES)
def test_max_pool_by_doubling_matches_torch(monkeypatch: pytest.MonkeyPatch, x_shape: tuple,
                                                         kwargs: dict) -> None:
    x = np.round(normal(16, *x_shape) * 2) / 2
    monkeypatch.setattr(conv, "LONG_WINDOW_TAPS", 0)
    check(lambda t: F.max_pool2d(t, return_indices=True, **kwargs),
          lambda t: TF.max_pool2d(t, return_indices=True, **kwargs), [x], grad=[0], name="max_pool2d")


@pytest.mark.parametrize("kwargs", [
    {"kernel_size": 3, "stride": 1, "padding": 1},
    {"kernel_size": 3, "stride": 2, "ceil_mode": True},
    {"kernel_size": (2, 3), "stride": (1, 2), "padding": (1, 1), "dilation": (2, 1)},
    {"kernel_size": (3, 1), "stride": 1},
])
def test_max_pool2d_without_a_gradient_matches_torch(kwargs: dict) -> None:
    """Without a gradient or indices the windows combine by `larger` (the plain maximum): the same values, NaN and
    infinities included, over a transposed (non-contiguous) input and dims of size 1."""
    x = np.round(normal(21, 2, 3, 9, 8) * 2) / 2
    x[0, 0, 2, 3], x[0, 1, 4, 4], x[1, 2, 0, 0] = math.nan, math.inf, -math.inf
    x[1, 0] = -math.inf
    for shape in [x.shape, (1, 1, 9, 8)]:
        check(lambda t: F.max_pool2d(t.transpose(-1, -2), **kwargs),
              lambda t: TF.max_pool2d(t.transpose(-1, -2), **kwargs), [x[: shape[0], : shape[1]]], name="max_pool2d")


def _temporaries(out: tg.Tensor) -> tuple[int, list[tuple[str, tuple[int, ...]]]]:
    from tensorgraphs.schedule import schedule_kernels

    schedule = schedule_kernels([out.node])
    return len(schedule.kernels), [(b.node.dtype.name, b.node.shape) for b in schedule.buffers if b.role == "temp"]


def test_pool_windows_structure() -> None:
    """A separable window (3 x 3, overlapping along the rows) of a plain maximum or a sum is one kernel: its column
    results (`STORED_WINDOWS`: kh taps down each column at the row stride) staged a plane at a time in an array of
    the kernel's own, which it combines along the rows at the column stride (`lower.Lowering._staged_block`);
    `first_maximum`'s row results (its taps in row-major order) are given a buffer by the scheduler. A small or
    non-overlapping window stays one kernel of kh * kw inline taps."""
    x = tg.tensor(normal(22, 2, 4, 12, 13))
    grad = tg.tensor(normal(22, 2, 4, 12, 13), requires_grad=True)
    for out, columns in [(F.max_pool2d(x, 3, 1, 1), 12 * 15), (F.avg_pool2d(x, 3, 1, 1), 12 * 15),
                         (F.max_pool2d(x, 3, 2), 5 * 13)]:  # windows down each of the (padded) columns
        assert _temporaries(out) == (1, []) and _locals(out) == [columns]
    rows = ("float32", (2, 4, 14, 13))  # 13 windows along each of the 12 + 2 padded rows
    assert _temporaries(F.max_pool2d(grad, 3, 1, 1)) == (2, [rows])
    assert _temporaries(F.max_pool2d(grad, 3, 2)) == (2, [("float32", (2, 4, 11, 6))])
    indices = F.max_pool2d(x, 3, 1, 1, return_indices=True)[1]
    assert _temporaries(indices) == (3, [rows, ("int64", (2, 4, 14, 13))])
    for out in [F.max_pool2d(x, 2, 1), F.avg_pool2d(x, (3, 2), (3, 1)), F.max_pool2d(grad, 2, 2)]:
        assert _temporaries(out) == (1, []) and _locals(out) == []


def _locals(out: tg.Tensor) -> list[int]:
    from tensorgraphs.codegen.loop_ir import Local, walk
    from tensorgraphs.schedule import schedule_kernels

    return [s.size for k in schedule_kernels([out.node]).kernels for s in walk(k.body) if isinstance(s, Local)]


@pytest.mark.parametrize("x_shape,kwargs", POOL_CASES + [
    ((2, 3, 9, 8), {"kernel_size": 2, "stride": 1, "padding": 1, "dilation": (2, 1)}),
    ((1, 2, 8, 9), {"kernel_size": (2, 3), "stride": (1, 2), "ceil_mode": True}),
])
def test_separable_windows_match_torch(monkeypatch: pytest.MonkeyPatch, x_shape: tuple, kwargs: dict) -> None:
    """Every window that overlaps along its rows separable (SEPARABLE_MIN_TAPS 0): max pooling's values (with and
    without a gradient, ties, NaN and infinity, a transposed input), indices, and average pooling with its counts."""
    monkeypatch.setattr(pooling, "SEPARABLE_MIN_TAPS", 0)
    x = np.round(normal(23, *x_shape) * 2) / 2
    flat = x.reshape(-1)
    flat[3 % flat.size], flat[-1] = math.nan, math.inf
    check(lambda t: F.max_pool2d(t, **kwargs), lambda t: TF.max_pool2d(t, **kwargs), [x], grad=[0], name="max_pool2d")
    check(lambda t: F.max_pool2d(t.transpose(-1, -2), **kwargs), lambda t: TF.max_pool2d(t.transpose(-1, -2), **kwargs),
          [x], name="max_pool2d")
    check(lambda t: F.max_pool2d(t, return_indices=True, **kwargs),
          lambda t: TF.max_pool2d(t, return_indices=True, **kwargs), [x], name="max_pool2d")
    average = {k: v for k, v in kwargs.items() if k != "dilation"}
    for include in (True, False):
        check(lambda t: F.avg_pool2d(t, count_include_pad=include, **average),
              lambda t: TF.avg_pool2d(t, count_include_pad=include, **average), [normal(24, *x_shape)], grad=[0],
              name="avg_pool2d")


def test_a_long_window_takes_logarithmically_many_operations() -> None:
    """200 taps: stacked views would be a term per tap, whose loop gcc compiles in minutes."""
    x = tg.randn(1, 1, 4000)
    assert len(F.max_pool1d(x, 200, stride=10, padding=100, dilation=10).node.toposort()) < 200
    assert len(F.avg_pool1d(x, 200, stride=10, padding=100).node.toposort()) < 200


@pytest.mark.parametrize("x_shape,kwargs", POOL_CASES)
@pytest.mark.parametrize("count_include_pad", [True, False])
def test_avg_pool2d_matches_torch(x_shape: tuple, kwargs: dict, count_include_pad: bool) -> None:
    kwargs = dict(kwargs, count_include_pad=count_include_pad)
    check(lambda x: F.avg_pool2d(x, **kwargs), lambda x: TF.avg_pool2d(x, **kwargs), [normal(8, *x_shape)], grad=[0],
          name="avg_pool2d")


def test_avg_pool2d_divisor_override_and_errors() -> None:
    check(lambda x: F.avg_pool2d(x, 2, divisor_override=3), lambda x: TF.avg_pool2d(x, 2, divisor_override=3),
          [normal(9, 1, 2, 4, 4)], grad=[0])
    with pytest.raises(tg.ArgumentError, match="at most half"):
        F.avg_pool2d(tg.randn(1, 1, 5, 5), 2, padding=2)


@pytest.mark.parametrize("x_shape,output_size", [((2, 3, 7, 7), 1), ((1, 2, 7, 5), (3, 2)), ((3, 6, 6), (4, None)),
                                                  ((1, 1, 3, 3), (5, 7)), ((2, 2, 8, 4), (4, 2))])
def test_adaptive_avg_pool2d_matches_torch(x_shape: tuple, output_size: object) -> None:
    x = normal(10, *x_shape)
    x.reshape(-1)[1] = math.nan
    check(lambda t: F.adaptive_avg_pool2d(t, output_size), lambda t: TF.adaptive_avg_pool2d(t, output_size), [x],
          grad=[0], name="adaptive_avg_pool2d")


POOL_1D_CASES = [  # input shape, keyword arguments
    ((2, 3, 9), {"kernel_size": 3}),
    ((3, 8), {"kernel_size": 2, "stride": 1}),
    ((1, 2, 7), {"kernel_size": (3,), "stride": (2,), "padding": (1,)}),
    ((2, 2, 8), {"kernel_size": 3, "stride": 2, "padding": 1, "ceil_mode": True}),
]


@pytest.mark.parametrize("x_shape,kwargs", POOL_1D_CASES)
def test_1d_pooling_matches_torch(x_shape: tuple, kwargs: dict) -> None:
    x = normal(13, *x_shape)
    x.reshape(-1)[2] = math.nan
    for name, options in [("max_pool1d", {}), ("max_pool1d", {"dilation": 2, "return_indices": True}),
                          ("avg_pool1d", {}), ("avg_pool1d", {"count_include_pad": False})]:
        args = dict(kwargs, **options)
        check(lambda t: getattr(F, name)(t, **args), lambda t: getattr(TF, name)(t, **args), [x], grad=[0], name=name)


@pytest.mark.parametrize("x_shape,output_size", [((2, 3, 7), 1), ((3, 5), 3), ((1, 2, 3), 5), ((2, 2, 8), (4,))])
def test_adaptive_avg_pool1d_matches_torch(x_shape: tuple, output_size: object) -> None:
    check(lambda t: F.adaptive_avg_pool1d(t, output_size), lambda t: TF.adaptive_avg_pool1d(t, output_size),
          [normal(14, *x_shape)], grad=[0], name="adaptive_avg_pool1d")


def test_1d_pooling_errors_name_the_op() -> None:
    with pytest.raises(tg.ShapeError, match="max_pool1d.*2D or 3D"):
        F.max_pool1d(tg.randn(1, 1, 4, 4), 2)
    with pytest.raises(tg.ArgumentError, match="avg_pool1d.*one int"):
        F.avg_pool1d(tg.randn(1, 1, 4), (2, 2))


@pytest.mark.parametrize("norm_type", [2.0, 1.5, math.inf, -math.inf])
@pytest.mark.parametrize("ceil_mode", [False, True])
def test_lp_pool_matches_torch(norm_type: float, ceil_mode: bool) -> None:
    x = np.abs(normal(15, 2, 3, 7, 6)) + 0.1  # positive: a fractional power of a negative mean is NaN in both
    check(lambda t: F.lp_pool2d(t, norm_type, (3, 2), 2, ceil_mode),
          lambda t: TF.lp_pool2d(t, norm_type, (3, 2), 2, ceil_mode), [x], grad=[0], rtol=1e-5, atol=1e-5,
          name="lp_pool2d")
    check(lambda t: F.lp_pool1d(t, norm_type, 3, None, ceil_mode),
          lambda t: TF.lp_pool1d(t, norm_type, 3, None, ceil_mode), [x[:, :, 0]], grad=[0], rtol=1e-5, atol=1e-5,
          name="lp_pool1d")


@pytest.mark.parametrize("x_shape,w_shape,kwargs", [
    ((2, 4, 5), (4, 3, 3), {}),
    ((1, 4, 6), (4, 2, 2), {"stride": 2, "padding": 1, "output_padding": 1, "groups": 2}),
    ((4, 5), (4, 3, 3), {"dilation": 2, "padding": 2}),
])
def test_conv_transpose1d_matches_torch(x_shape: tuple, w_shape: tuple, kwargs: dict) -> None:
    check(lambda x, w, b: F.conv_transpose1d(x, w, b, **kwargs),
          lambda x, w, b: TF.conv_transpose1d(x, w, b, **kwargs),
          [normal(16, *x_shape), normal(17, *w_shape), normal(18, w_shape[1] * kwargs.get("groups", 1))],
          grad=[0, 1, 2], rtol=1e-4, atol=1e-5, name="conv_transpose1d")


@pytest.mark.parametrize("x_shape,kwargs", [
    ((2, 3, 5, 4), {"kernel_size": 2}),
    ((1, 2, 6, 7), {"kernel_size": (3, 2), "stride": (2, 1), "padding": 1, "dilation": (1, 2)}),
    ((3, 4, 4), {"kernel_size": 3, "padding": (1, 0)}),
    ((1, 2, 12, 13), {"kernel_size": (9, 8), "stride": (2, 3), "padding": 2, "dilation": (1, 2)}),  # long window
])
def test_unfold_matches_torch(x_shape: tuple, kwargs: dict) -> None:
    check(lambda x: F.unfold(x, **kwargs), lambda x: TF.unfold(x, **kwargs), [normal(19, *x_shape)], grad=[0],
          rtol=0, atol=0, grad_rtol=1e-6, grad_atol=1e-6, name="unfold")


FOLD_CASES = [  # input shape, keyword arguments
    ((2, 3 * 4, 12), {"output_size": (4, 5), "kernel_size": 2}),
    ((1, 2 * 6, 21), {"output_size": (6, 7), "kernel_size": (3, 2), "stride": (2, 1), "padding": 1,
                     "dilation": (1, 2)}),
    ((3 * 9, 4), {"output_size": 4, "kernel_size": 3, "padding": (1, 0), "stride": (1, 2)}),
    ((1, 2 * 72, 4), {"output_size": (12, 13), "kernel_size": (9, 8), "stride": (2, 3), "padding": 2,
                      "dilation": (1, 2)}),  # long windows: folded by movement
    ((2, 3 * 70, 30), {"output_size": (1, 300), "kernel_size": (1, 70), "stride": (1, 10), "padding": (0, 30)}),
]


@pytest.mark.parametrize("x_shape,kwargs", FOLD_CASES)
def test_fold_matches_torch(x_shape: tuple, kwargs: dict) -> None:
    """fold sums the windows unfold took apart: both against torch."""
    check(lambda x: F.fold(x, **kwargs), lambda x: TF.fold(x, **kwargs), [normal(20, *x_shape)], grad=[0],
          rtol=1e-6, atol=1e-6, name="fold")


@pytest.mark.parametrize("x_shape,kwargs", FOLD_CASES)
def test_fold_by_movement_matches_torch(monkeypatch: pytest.MonkeyPatch, x_shape: tuple, kwargs: dict) -> None:
    """Every window folded as the long ones are (`conv.folded_windows`, threshold 0)."""
    monkeypatch.setattr(conv, "LONG_WINDOW_TAPS", 0)
    test_fold_matches_torch(x_shape, kwargs)


def test_fold_rejects_a_column_count_that_does_not_fit() -> None:
    with pytest.raises(tg.ShapeError, match="fold"):
        F.fold(tg.ones(1, 4, 11), (4, 5), 2)


@pytest.mark.parametrize("x_shape,output_size", [((2, 3, 7, 7), 1), ((1, 2, 7, 5), (3, 2)), ((3, 6, 6), (4, None)),
                                                  ((1, 1, 3, 3), (5, 7))])
def test_adaptive_max_pool_matches_torch(x_shape: tuple, output_size: object) -> None:
    x = normal(22, *x_shape)
    x.reshape(-1)[1] = math.nan
    check(lambda t: F.adaptive_max_pool2d(t, output_size), lambda t: TF.adaptive_max_pool2d(t, output_size), [x],
          grad=[0], name="adaptive_max_pool2d")
    size_1d = output_size if isinstance(output_size, int) else output_size[0]
    check(lambda t: F.adaptive_max_pool1d(t, size_1d), lambda t: TF.adaptive_max_pool1d(t, size_1d), [x[..., 0]],
          grad=[0], name="adaptive_max_pool1d")
    with pytest.raises(tg.UnsupportedError, match="return_indices"):
        F.adaptive_max_pool2d(tg.tensor(x), output_size, return_indices=True)


def test_float64_conv2d_and_pooling_are_exact() -> None:
    x, w = normal(11, 2, 3, 6, 5).astype(np.float64), normal(12, 4, 3, 3, 2).astype(np.float64)
    check(lambda a, b: F.conv2d(a, b, stride=2, padding=1), lambda a, b: TF.conv2d(a, b, stride=2, padding=1), [x, w],
          grad=[0, 1], rtol=1e-12, atol=1e-12, name="conv2d float64")
    check(lambda a: F.avg_pool2d(a, 3, 2, 1), lambda a: TF.avg_pool2d(a, 3, 2, 1), [x], grad=[0], rtol=1e-12,
          atol=1e-12, name="avg_pool2d float64")


CONVS_WITH_BIAS = {  # name: (our call, torch's call, input, weight, bias)
    "conv1d": (F.conv1d, TF.conv1d, normal(21, 2, 8, 12), normal(22, 16, 8, 3), normal(23, 16, scale=3.0)),
    "conv2d": (F.conv2d, TF.conv2d, normal(24, 2, 8, 9, 9), normal(25, 16, 8, 3, 3), normal(26, 16, scale=3.0)),
    "conv_transpose2d": (F.conv_transpose2d, TF.conv_transpose2d, normal(27, 2, 8, 6, 6), normal(28, 8, 16, 3, 3),
                         normal(29, 16, scale=3.0)),
}


@pytest.mark.parametrize("device", ["numpy", "cpu"])
@pytest.mark.parametrize("name", list(CONVS_WITH_BIAS))
def test_autocast_conv_with_bias_rounds_once(name: str, device: str) -> None:
    """Under bfloat16 autocast, a convolution and its bias are summed in float32 and rounded once (as torch's cpu
    convolutions): the expected value is the float64 convolution of the bfloat16-rounded operands, rounded once
    to bfloat16. Rounding the product and then the sum with the bias disagreed with it on ~30% of the elements.
    Elsewhere float32 and float64 summation orders may differ by one bfloat16 step. The cpu device runs it on
    the bfloat16 GEMM with a float32 result (tg_gemm_bf16_f32)."""
    import torch

    from tensorgraphs.backends.cpu import CPU

    ours, theirs, *arrays = CONVS_WITH_BIAS[name]
    x, w, b = (torch.from_numpy(a).bfloat16().double() for a in arrays)
    expected = theirs(x, w, b).bfloat16().double().numpy()
    with tg.device(device), tg.autocast("cpu", dtype=tg.bfloat16):
        out = ours(*(tg.tensor(a) for a in arrays))
    assert out.dtype is tg.bfloat16
    if device == "cpu":
        assert "tg_gemm_bf16_f32(" in CPU.program([out.node])[0].source
    value = out.double().numpy()
    mismatched = np.mean(value != expected)
    assert mismatched < 0.01, f"{name} on {device}: {mismatched:.1%} of the elements differ from one rounding"
    np.testing.assert_allclose(value, expected, rtol=2**-7, atol=0, err_msg=f"{name} on {device}")
