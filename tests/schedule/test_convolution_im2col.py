"""conv2d run by the im2col kernel (explicit im2col and OpenBLAS sgemm, schedule.convolution's "im2col"
candidate) from generated C: where it applies, one call per convolution with its epilogue fused, operands that are
views, and values and gradients of compiled conv nets against torch."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import numpy as np
import pytest
import torch

import tensorgraphs as tg
import tensorgraphs.nn.functional as F
from tensorgraphs.backends.cpu import CPU
from tensorgraphs.codegen.loop_ir import ConvCall, walk
from tensorgraphs.graph.node import toposort
from tensorgraphs.kernels import blas
from tensorgraphs.plan.choices import (
    ALL_FEATURES,
    DECOMPOSE,
    OPENBLAS,
    candidates_of,
    code_hash,
    compiled_planner,
    forced,
    kernel_id,
    route_of,
    targeting,
)
from tensorgraphs.plan.signature import signature_of
from tensorgraphs.schedule import convolution as conv

pytestmark = pytest.mark.skipif(not blas.conv_available(), reason="the im2col kernel needs scipy-openblas32")


def _floats(shape: tuple[int, ...], seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape, dtype=np.float32)


def _conv_nodes(*outs: tg.Tensor) -> list:
    return [n for n in toposort([o.node for o in outs]) if n.op.name == conv.CONV2D]


@contextlib.contextmanager
def _by_im2col(*outs: tg.Tensor) -> Iterator[None]:
    """Programs built inside run every conv of `outs` (and any conv of the same signature) by the im2col kernel."""
    with forced({signature_of(n): conv.IM2COL for n in _conv_nodes(*outs)}):
        yield


def _conv_calls(roots: list[tg.Tensor]) -> list[ConvCall]:
    program, _ = CPU.program([r.node for r in roots])
    return [s for kernel in program.kernels for s in walk(kernel.body) if isinstance(s, ConvCall)]


def _names(out: tg.Tensor) -> list[str]:
    return [c.name for c in candidates_of(_conv_nodes(out)[0])]


def test_where_the_im2col_kernel_applies() -> None:
    x = tg.tensor(_floats((2, 4, 9, 9), 0))
    three = tg.tensor(_floats((6, 4, 3, 3), 1))
    for out in (
        F.conv2d(x, three, stride=2, padding=1),
        F.conv2d(x, three, dilation=2),
        F.conv2d(x, tg.tensor(_floats((6, 4, 1, 1), 2)), stride=2),
    ):
        assert conv.IM2COL in _names(out) and _names(out)[-1] == DECOMPOSE
    grouped = F.conv2d(x, tg.tensor(_floats((6, 2, 3, 3), 3)), groups=2)
    uneven = F.conv2d(x, tg.tensor(_floats((6, 4, 2, 2), 4)), padding="same")  # pads 0 before, 1 after
    for out in (grouped, uneven, F.conv2d(x.double(), three.double())):
        assert _names(out) == [DECOMPOSE]
    with targeting(ALL_FEATURES - {OPENBLAS}):  # what tg.export plans for: a library that cannot link OpenBLAS
        assert conv.IM2COL not in _names(F.conv2d(x, three, stride=2))


def test_it_runs_where_measured_faster(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Unmeasured, a conv without another kernel decomposes (the prior puts im2col after it); rows in the kernel
    database (as `tg tune` writes them) that measure im2col fastest make compiled functions call it."""
    monkeypatch.setenv("TG_CACHE_DIR", str(tmp_path / "cache"))  # a kernel database of its own
    x, weight = _floats((2, 6, 11, 9), 0), _floats((7, 6, 3, 3), 1)
    (node,) = _conv_nodes(F.conv2d(tg.tensor(x), tg.tensor(weight), stride=2))
    sig, planner = signature_of(node), compiled_planner()
    names = [c.name for c in candidates_of(node)]
    assert route_of(node) == (names[0] if names[0] != conv.IM2COL else DECOMPOSE)
    for candidate in names:
        planner.cost_model.db.record(
            planner.cost_model.fingerprint,
            kernel_id(sig, candidate),
            code_hash(),
            sig.dtype_key,
            sig.shape_key,
            sig.flops,
            sig.bytes,
            [1e-6 if candidate == conv.IM2COL else 1.0],
        )
    convolve = tg.compile(lambda a, b: F.conv2d(a, b, stride=2).relu())
    out = convolve(tg.tensor(x), tg.tensor(weight))
    (trace,) = [t for traces in convolve.traces.values() for t in traces]
    calls = [s for kernel in trace.program.kernels for s in walk(kernel.body) if isinstance(s, ConvCall)]
    assert [call.function for call in calls] == [blas.CONV_FUNCTION]
    expected = torch.relu(torch.nn.functional.conv2d(torch.from_numpy(x), torch.from_numpy(weight), stride=2))
    np.testing.assert_allclose(out.numpy(), expected.numpy(), rtol=1e-5, atol=1e-5)


def test_without_the_libraries_convs_decompose(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TG_GEMM", "0")
    out = F.conv2d(tg.tensor(_floats((1, 2, 8, 8), 0)), tg.tensor(_floats((3, 2, 3, 3), 1)), stride=2)
    assert route_of(_conv_nodes(out)[0]) == DECOMPOSE


# (batch, cin, h, w, cout, kernel, stride, padding, dilation)
GEOMETRIES = [
    (2, 5, 13, 11, 7, 3, 2, 1, 1),  # a strided 3x3, odd sizes
    (1, 3, 37, 35, 8, 7, 2, 3, 1),  # a stem
    (3, 6, 9, 10, 4, 1, 2, 0, 1),  # a downsample
    (2, 3, 12, 9, 4, (3, 2), (1, 2), (2, 0), (2, 1)),  # rectangular, dilated
    (1, 8, 36, 34, 3, 3, 1, 1, 1),  # over 256 positions: blocks of output rows
]


@pytest.mark.parametrize("geometry", GEOMETRIES, ids=str)
def test_bias_relu_and_residual_fuse_into_the_call(geometry: tuple) -> None:
    batch, cin, h, w, cout, kernel, stride, padding, dilation = geometry
    kernel = (kernel, kernel) if isinstance(kernel, int) else kernel
    x, weight, bias = _floats((batch, cin, h, w), 0), _floats((cout, cin, *kernel), 1), _floats((cout,), 2)
    expected = torch.relu(
        torch.nn.functional.conv2d(
            *(torch.from_numpy(a).double() for a in (x, weight, bias)),
            stride=stride,
            padding=padding,
            dilation=dilation,
        )
    )
    residual = _floats(tuple(expected.shape), 3)
    out = F.relu(F.conv2d(tg.tensor(x), tg.tensor(weight), tg.tensor(bias), stride, padding, dilation))
    out = out + tg.tensor(residual)
    with _by_im2col(out):
        (call,) = _conv_calls([out])
        assert (call.function, call.activation, call.bias is not None, call.residual is not None) == (
            blas.CONV_FUNCTION,
            "relu",
            True,
            True,
        )
        got = out.numpy()
    np.testing.assert_allclose(got, expected.numpy() + residual, rtol=1e-5, atol=1e-5 * np.sqrt(cin * 9))


@pytest.mark.parametrize("view", ["transposed", "expanded", "channel_slice", "batch_slice"])
def test_operands_that_are_views(view: str) -> None:
    """Views in another order are copied into NCHW first, a slice of the batch is read in place."""
    x, weight = _floats((3, 6, 9, 7), 0), _floats((4, 3, 3, 3), 1)
    views = {
        "transposed": lambda a: a[:, :3].transpose(2, 3),
        "expanded": lambda a: a[:1, :1].expand(2, 3, 9, 7),
        "channel_slice": lambda a: a[:, 2:5],
        "batch_slice": lambda a: a.reshape(6, 3, 9, 7)[2:5],
    }
    out = F.conv2d(views[view](tg.tensor(x)), tg.tensor(weight), stride=2, padding=1)
    with _by_im2col(out):
        convolve = tg.compile(lambda a, b: F.conv2d(views[view](a), b, stride=2, padding=1))
        got = convolve(tg.tensor(x), tg.tensor(weight)).numpy()
    expected = torch.nn.functional.conv2d(
        views[view](torch.from_numpy(x)), torch.from_numpy(weight), stride=2, padding=1
    )
    np.testing.assert_allclose(got, expected.numpy(), rtol=1e-4, atol=1e-5)
    (trace,) = [t for traces in convolve.traces.values() for t in traces]
    calls = [s for kernel in trace.program.kernels for s in walk(kernel.body) if isinstance(s, ConvCall)]
    assert [c.function for c in calls] == [blas.CONV_FUNCTION]
    assert calls[0].x_offset == (2 * 3 * 9 * 7 if view == "batch_slice" else 0), calls


def test_compiled_training_step_matches_torch() -> None:
    """A strided stem, a 1x1 strided projection and a 3x3 conv by the kernel; their gradients (decomposed into
    matrix products) are untouched by the choice."""
    torch.manual_seed(0)
    stem, project, conv3 = torch.nn.Conv2d(3, 8, 5, 2, 2), torch.nn.Conv2d(8, 6, 1, 2), torch.nn.Conv2d(6, 6, 3, 1, 1)
    references = (stem, project, conv3)
    params = [tg.tensor(p.detach().numpy(), requires_grad=True) for layer in references for p in layer.parameters()]
    x = _floats((2, 3, 19, 17), 5)

    def forward(inputs: tg.Tensor) -> tg.Tensor:
        h = F.relu(F.conv2d(inputs, params[0], params[1], stride=2, padding=2))
        h = F.conv2d(h, params[2], params[3], stride=2)
        return F.conv2d(F.relu(h), params[4], params[5], padding=1) + h

    @tg.compile
    def step(inputs: tg.Tensor) -> tg.Tensor:
        out = forward(inputs)
        loss = (out * out).mean()
        loss.backward()
        return loss

    with _by_im2col(forward(tg.tensor(x))):
        loss = step(tg.tensor(x))
        (trace,) = [t for traces in step.traces.values() for t in traces]
    calls = [s for kernel in trace.program.kernels for s in walk(kernel.body) if isinstance(s, ConvCall)]
    assert [c.function for c in calls] == [blas.CONV_FUNCTION] * 3
    h = torch.relu(stem(torch.from_numpy(x)))
    h = project(h)
    expected = conv3(torch.relu(h)) + h
    expected_loss = (expected * expected).mean()
    expected_loss.backward()
    np.testing.assert_allclose(loss.item(), expected_loss.item(), rtol=1e-5)
    reference_params = [p for layer in references for p in layer.parameters()]
    for index, (param, reference) in enumerate(zip(params, reference_params, strict=True)):
        np.testing.assert_allclose(
            param.grad.numpy(), reference.grad.numpy(), rtol=1e-4, atol=1e-5, err_msg=f"parameter {index}"
        )
