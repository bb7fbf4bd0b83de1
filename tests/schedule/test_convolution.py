"""conv2d run by the GEMM library's conv kernels from generated C (schedule.convolution): the candidates, one kernel
call per convolution with its epilogue fused, and values and gradients of compiled conv nets against torch."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tensorgraphs as tg
import tensorgraphs.nn.functional as F
from tensorgraphs.backends.cpu import CPU
from tensorgraphs.codegen.loop_ir import ConvCall, GemmCall, walk
from tensorgraphs.kernels import blas, gemm
from tensorgraphs.plan.choices import (
    DECOMPOSE,
    candidates_of,
    code_hash,
    collecting,
    compiled_planner,
    forced,
    kernel_id,
    route_of,
    untuned,
)
from tensorgraphs.plan.signature import signature_of
from tensorgraphs.schedule import convolution as conv
from tensorgraphs.schedule.extern import gemm_enabled

pytestmark = pytest.mark.skipif(not gemm_enabled(), reason="the conv kernels need AVX-512F and a C compiler")


def _floats(shape: tuple[int, ...], seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape, dtype=np.float32)


def _calls(roots: list[tg.Tensor], kind: type) -> list:
    program, _ = CPU.program([r.node for r in roots])
    return [s for kernel in program.kernels for s in walk(kernel.body) if isinstance(s, kind)]


def _candidate_names(out: tg.Tensor) -> list[str]:
    return [c.name for c in candidates_of(out.node)]


def test_candidates_by_geometry() -> None:
    x = tg.tensor(_floats((2, 4, 9, 9), 0))
    three, five = tg.tensor(_floats((6, 4, 3, 3), 1)), tg.tensor(_floats((6, 4, 5, 5), 2))
    im2col = [conv.IM2COL] if blas.conv_available() else []  # test_convolution_im2col.py tests where it applies
    assert _candidate_names(F.conv2d(x, three, padding=1)) == ["implicit_gemm", "winograd", *im2col, DECOMPOSE]
    assert _candidate_names(F.conv2d(x, three, stride=2)) == ["implicit_gemm", *im2col, DECOMPOSE]
    assert _candidate_names(F.conv2d(x, three, dilation=2)) == ["implicit_gemm", *im2col, DECOMPOSE]
    assert _candidate_names(F.conv2d(x, five)) == ["implicit_gemm", *im2col, DECOMPOSE]
    grouped = tg.tensor(_floats((6, 2, 3, 3), 3))
    assert _candidate_names(F.conv2d(x, grouped, groups=2)) == [DECOMPOSE]
    even = tg.tensor(_floats((6, 4, 2, 2), 4))  # "same" pads an even kernel unequally: the kernels take one pad
    assert _candidate_names(F.conv2d(x, even, padding="same")) == [DECOMPOSE]
    double = F.conv2d(x.double(), three.double())
    assert _candidate_names(double) == [DECOMPOSE]
    # few input channels, a window over 1x1 and output rows of 16 or more: the direct conv too
    wide = tg.tensor(_floats((1, 16, 5, 17), 5))
    direct = ["implicit_gemm", "direct"]
    assert _candidate_names(F.conv2d(wide, tg.tensor(_floats((6, 16, 3, 3), 6)), padding=1)) == [
        *direct, "winograd", *im2col, DECOMPOSE]
    assert _candidate_names(F.conv2d(wide, tg.tensor(_floats((6, 16, 1, 3), 6)), stride=(2, 1), padding=(0, 1))) == [
        *direct, *im2col, DECOMPOSE]
    assert _candidate_names(F.conv2d(wide, tg.tensor(_floats((6, 16, 1, 1), 6)))) == [
        "implicit_gemm", *im2col, DECOMPOSE]  # 1x1
    # ...on AVX-512 with 32 taps or more: a 3-channel 3x3 stem's 27 run the implicit GEMM (of many output channels
    # or of few), a 7x7 stem's 147 not
    stem = tg.tensor(_floats((1, 3, 9, 40), 12))
    short = ["implicit_gemm"] if gemm.avx512() else direct
    assert _candidate_names(F.conv2d(stem, tg.tensor(_floats((64, 3, 3, 3), 13)), stride=2)) == [
        *short, *im2col, DECOMPOSE]
    assert _candidate_names(F.conv2d(stem, tg.tensor(_floats((24, 3, 3, 3), 13)), stride=2)) == [
        *short, *im2col, DECOMPOSE]
    assert _candidate_names(F.conv2d(stem, tg.tensor(_floats((64, 3, 7, 7), 13)), stride=2, padding=3)) == [
        *direct, *im2col, DECOMPOSE]
    assert _candidate_names(F.conv2d(wide, tg.tensor(_floats((6, 16, 3, 3), 6)))) == [
        *direct, "winograd", *im2col, DECOMPOSE]  # output rows of 15: as few output channels at stride 1
    many = tg.tensor(_floats((1, 17, 5, 17), 7))
    assert _candidate_names(F.conv2d(many, tg.tensor(_floats((33, 17, 3, 3), 8)), padding=1)) == [
        "implicit_gemm", "winograd", *im2col, DECOMPOSE]
    # many input channels, few output channels on rows of 28 or more (DenseNet's 3x3 layers): the direct conv too
    many_wide = tg.tensor(_floats((1, 40, 3, 28), 9))
    assert _candidate_names(F.conv2d(many_wide, tg.tensor(_floats((32, 40, 3, 3), 10)), padding=1)) == [
        *direct, "winograd", *im2col, DECOMPOSE]
    assert _candidate_names(F.conv2d(many_wide, tg.tensor(_floats((33, 40, 3, 3), 10)), padding=1)) == [
        "implicit_gemm", "winograd", *im2col, DECOMPOSE]
    # ...on rows of 14 at stride 1 (its tiles run across rows), not strided
    many_narrow = tg.tensor(_floats((1, 40, 4, 14), 11))
    assert _candidate_names(F.conv2d(many_narrow, tg.tensor(_floats((32, 40, 3, 3), 10)), padding=1)) == [
        *direct, "winograd", *im2col, DECOMPOSE]
    assert _candidate_names(F.conv2d(many_wide, tg.tensor(_floats((32, 40, 3, 3), 10)), stride=2, padding=1)) == [
        "implicit_gemm", *im2col, DECOMPOSE]


def test_bias_and_relu_fuse_into_one_call_per_conv() -> None:
    x, w1, b1 = tg.tensor(_floats((2, 3, 12, 10), 0)), tg.tensor(_floats((8, 3, 3, 3), 1)), tg.tensor(_floats((8,), 2))
    w2 = tg.tensor(_floats((8, 8, 1, 1), 3))
    h = F.relu(F.conv2d(x, w1, b1, padding=1))
    out = F.conv2d(h, w2) * 0.5 + h
    program, _ = CPU.program([out.node])
    assert len(program.kernels) == 2, program.kernels
    first, second = (call for kernel in program.kernels for call in kernel.body)
    assert isinstance(first, ConvCall) and first.bias is not None and first.activation == "relu"
    assert isinstance(second, ConvCall) and second.alpha == 0.5 and second.residual is not None
    with tg.device("numpy"):
        expected = (F.conv2d(F.relu(F.conv2d(x, w1, b1, padding=1)), w2) * 0.5 + h).numpy()
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-4, atol=1e-4)


class _Block(torch.nn.Module):
    """A small ResNet-style net: a strided stem, a residual 3x3 block, a 1x1 projection, on 1-D inputs a conv1d."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = torch.nn.Conv2d(3, 8, 3, stride=2, padding=1)
        self.conv1 = torch.nn.Conv2d(8, 8, 3, padding=1, bias=False)
        self.conv2 = torch.nn.Conv2d(8, 8, 3, padding=1)
        self.project = torch.nn.Conv2d(8, 5, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.stem(x))
        h = torch.relu(self.conv2(torch.relu(self.conv1(h))) + h)
        return self.project(h)


def _tg_block(reference: _Block) -> tg.nn.Module:
    convs = {}
    for name, layer in reference.named_children():
        convs[name] = tg.nn.Conv2d(layer.in_channels, layer.out_channels, layer.kernel_size, layer.stride,
                                   layer.padding, bias=layer.bias is not None)
    model = tg.nn.Module()
    for name, layer in convs.items():
        setattr(model, name, layer)
    model.load_state_dict({k: tg.tensor(v.detach().numpy()) for k, v in reference.state_dict().items()})

    def forward(x: tg.Tensor) -> tg.Tensor:
        h = F.relu(model.stem(x))
        h = F.relu(model.conv2(F.relu(model.conv1(h))) + h)
        return model.project(h)

    model.forward = forward
    return model


SHAPES = {"narrow": (2, 3, 17, 15), "wide": (2, 3, 40, 34)}
"""Inputs of `_Block`: on narrow images its convs run the implicit GEMM; on wide ones those of few input channels
and a 3x3 window run the direct conv (`conv._direct_fits`: output rows of 20 and 17), but for the stem's 27 taps on
AVX-512 (`conv.DIRECT_MIN_TAPS_AVX512`)."""
_STEM = "tg_conv2d_f32" if gemm.avx512() else "tg_conv2d_direct_f32"
FUNCTIONS = {"narrow": ["tg_conv2d_f32"] * 4, "wide": [_STEM] + ["tg_conv2d_direct_f32"] * 2 + ["tg_conv2d_f32"]}


@pytest.mark.parametrize("shape", SHAPES)
def test_compiled_training_step_matches_torch(shape: str) -> None:
    """Values and gradients of a compiled step (forward convs by the kernel, their gradients decomposed)."""
    torch.manual_seed(0)
    reference = _Block()
    model = _tg_block(reference)
    x = _floats(SHAPES[shape], 5)

    @tg.compile
    def step(inputs: tg.Tensor) -> tg.Tensor:
        out = model(inputs)
        loss = (out * out).mean()
        loss.backward()
        return loss

    loss = step(tg.tensor(x))
    expected = reference(torch.from_numpy(x))
    expected_loss = (expected * expected).mean()
    expected_loss.backward()
    np.testing.assert_allclose(loss.item(), expected_loss.item(), rtol=1e-5)
    grads = dict(model.named_parameters())
    for name, parameter in reference.named_parameters():
        np.testing.assert_allclose(grads[name].grad.numpy(), parameter.grad.numpy(), rtol=1e-4, atol=1e-5,
                                   err_msg=name)


@pytest.mark.parametrize("shape", SHAPES)
def test_training_step_calls_the_kernel_once_per_conv(shape: str) -> None:
    torch.manual_seed(0)
    model = _tg_block(_Block())
    out = model(tg.tensor(_floats(SHAPES[shape], 5)))
    loss = (out * out).mean()
    params = list(model.parameters())
    roots = [loss, *tg.grad(loss, params)]
    calls = _calls(roots, ConvCall)
    assert [call.function for call in calls] == FUNCTIONS[shape], calls
    assert _calls(roots, GemmCall)  # the gradients: matrix products of the decomposition


def test_winograd_matches_float64_torch_when_chosen() -> None:
    x, weight, bias = _floats((3, 5, 13, 11), 0), _floats((19, 5, 3, 3), 1), _floats((19,), 2)
    out = F.relu(F.conv2d(tg.tensor(x), tg.tensor(weight), tg.tensor(bias), padding=1))
    (node,) = _conv_nodes(out)
    with forced({signature_of(node): conv.WINOGRAD}):
        assert route_of(node) == conv.WINOGRAD
        calls = _calls([out], ConvCall)
        # with the weights' transform made by a kernel of its own (`schedule.prepared`)
        assert [(call.function, call.activation) for call in calls] == [("tg_conv2d_winograd_prepared_f32", "relu")]
        got = out.numpy()
    expected = torch.relu(torch.nn.functional.conv2d(*(torch.from_numpy(a).double() for a in (x, weight, bias)),
                                                     padding=1)).numpy()
    assert np.abs(got - expected).max() < 3e-5 * np.abs(expected).max()


@pytest.mark.parametrize(("x_shape", "out_channels", "by_isa"), [
    ((1, 64, 28, 28), 64, (conv.WINOGRAD, conv.WINOGRAD)),  # 49 tiles
    ((1, 64, 14, 14), 64, (conv.IMPLICIT_GEMM, conv.WINOGRAD)),  # 16 tiles: on AVX-512 with its kept transform
    ((4, 64, 14, 14), 64, (conv.WINOGRAD, conv.WINOGRAD)),  # 64 tiles over the batch, 196 of 256 outputs real
    ((4, 64, 13, 13), 64, (conv.IMPLICIT_GEMM, conv.WINOGRAD)),  # 169 of 256 real
    ((16, 64, 6, 6), 64, (conv.IMPLICIT_GEMM, conv.IMPLICIT_GEMM)),  # 36 of 64 real
    ((1, 32, 28, 28), 64, (conv.IMPLICIT_GEMM, conv.WINOGRAD)),  # 32 input channels: the tiles' transforms weigh
    ((1, 16, 28, 28), 64, (conv.DIRECT, conv.WINOGRAD)),  # ...16 (the direct conv's few input channels)
    ((1, 8, 28, 28), 64, (conv.DIRECT, conv.DIRECT)),  # ...8
    ((1, 64, 28, 28), 32, (conv.DIRECT, conv.WINOGRAD)),  # few output channels on rows of 28
    ((1, 64, 14, 14), 32, (conv.DIRECT, conv.WINOGRAD)),  # ...on 16 tiles: AVX2's direct conv (rows of 14)
    ((1, 64, 7, 7), 32, (conv.IMPLICIT_GEMM, conv.DIRECT)),  # ...on rows of 7: the direct conv's lanes (AVX-512)
    ((1, 64, 6, 6), 32, (conv.IMPLICIT_GEMM, conv.IMPLICIT_GEMM)),  # ...on rows of 6
    ((1, 64, 7, 7), 24, (conv.IMPLICIT_GEMM, conv.IMPLICIT_GEMM)),  # 24 output channels: not the lanes' counts
    ((1, 64, 56, 56), 16, (conv.DIRECT, conv.WINOGRAD)),  # 16 output channels
])
def test_unmeasured_winograd_runs_in_its_shape_class(x_shape: tuple[int, ...], out_channels: int,
                                                     by_isa: tuple[str, str], tmp_path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """With nothing measured, the priors decide by shape class (`conv._winograd_prior`, by instruction set: AVX2,
    AVX-512), untuned or not; a measurement (`tg tune`) still overrides them."""
    monkeypatch.setenv("TG_CACHE_DIR", str(tmp_path / "cache"))  # a kernel database of its own
    expected = by_isa[gemm.avx512()]
    x, weight = tg.tensor(_floats(x_shape, 0)), tg.tensor(_floats((out_channels, x_shape[1], 3, 3), 1))
    (node,) = _conv_nodes(F.conv2d(x, weight, padding=1))
    assert route_of(node) == expected
    with untuned():
        assert route_of(node) == expected
    sig, planner = signature_of(node), compiled_planner()
    for candidate in (c.name for c in candidates_of(node)):
        planner.cost_model.db.record(planner.cost_model.fingerprint, kernel_id(sig, candidate), code_hash(),
                                     sig.dtype_key, sig.shape_key, sig.flops, sig.bytes,
                                     [1e-6 if candidate != expected and candidate != DECOMPOSE else 1.0])
    assert route_of(node) not in (expected, DECOMPOSE)


def _conv_nodes(out: tg.Tensor) -> list:
    from tensorgraphs.graph.node import toposort

    return [n for n in toposort([out.node]) if n.op.name == "conv2d"]


def test_conv1d_and_transposed_conv_run_by_the_kernel() -> None:
    """conv1d (a conv2d of height 1, through reshapes) and conv_transpose2d (a conv2d of the zero-dilated, padded
    input) read their operands where their buffers hold them."""
    x1, w1 = tg.tensor(_floats((2, 3, 20), 0)), tg.tensor(_floats((4, 3, 5), 1))
    x2, w2 = tg.tensor(_floats((2, 4, 6, 5), 2)), tg.tensor(_floats((4, 3, 3, 3), 3))
    one, transposed = F.conv1d(x1, w1, padding=2), F.conv_transpose2d(x2, w2, stride=2, padding=1)
    assert len(_calls([one, transposed], ConvCall)) == 2
    torch_one = torch.nn.functional.conv1d(torch.from_numpy(x1.numpy()), torch.from_numpy(w1.numpy()), padding=2)
    torch_transposed = torch.nn.functional.conv_transpose2d(torch.from_numpy(x2.numpy()),
                                                            torch.from_numpy(w2.numpy()), stride=2, padding=1)
    np.testing.assert_allclose(one.numpy(), torch_one.numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(transposed.numpy(), torch_transposed.numpy(), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("view", ["transposed", "expanded", "channel_slice", "batch_slice"])
def test_operands_that_are_not_nchw_buffers_are_materialized_first(view: str) -> None:
    """The kernel reads x and the weight as contiguous NCHW arrays: views in another order (a transpose, a
    broadcast, a slice of channels) are copied into one first; a slice of the batch is read in place."""
    x, weight = _floats((3, 6, 9, 7), 0), _floats((4, 3, 3, 3), 1)
    views = {"transposed": lambda a: a[:, :3].transpose(2, 3), "expanded": lambda a: a[:1, :1].expand(2, 3, 9, 7),
             "channel_slice": lambda a: a[:, 2:5], "batch_slice": lambda a: a.reshape(6, 3, 9, 7)[2:5]}
    convolve = tg.compile(lambda a, b: F.conv2d(views[view](a), b, padding=1))
    out = convolve(tg.tensor(x), tg.tensor(weight))
    expected = torch.nn.functional.conv2d(views[view](torch.from_numpy(x)), torch.from_numpy(weight), padding=1)
    np.testing.assert_allclose(out.numpy(), expected.numpy(), rtol=1e-4, atol=1e-5)
    (trace,) = [t for traces in convolve.traces.values() for t in traces]
    calls = [s for kernel in trace.program.kernels for s in walk(kernel.body) if isinstance(s, ConvCall)]
    assert len(calls) == 1 and calls[0].x_offset == (2 * 3 * 9 * 7 if view == "batch_slice" else 0), calls


def test_without_the_gemm_library_convs_decompose(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TG_GEMM", "0")
    out = F.conv2d(tg.tensor(_floats((1, 2, 8, 8), 0)), tg.tensor(_floats((3, 2, 3, 3), 1)))
    assert route_of(out.node) == DECOMPOSE
    assert not _calls([out], ConvCall)


@pytest.mark.parametrize("chosen", [conv.IMPLICIT_GEMM, conv.DIRECT, conv.WINOGRAD, DECOMPOSE,
                                    *([conv.IM2COL] if blas.conv_available() else [])])
@pytest.mark.long
def test_the_algorithm_measured_fastest_is_what_a_compiled_function_runs(chosen: str, tmp_path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows in the kernel database decide (as `tg tune` writes them); winograd runs only where it measured faster."""
    monkeypatch.setenv("TG_CACHE_DIR", str(tmp_path / "cache"))  # a kernel database of its own
    x, weight = _floats((2, 6, 11, 17), 0), _floats((7, 6, 3, 3), 1)
    (node,) = _conv_nodes(F.conv2d(tg.tensor(x), tg.tensor(weight), padding=1))
    sig, planner = signature_of(node), compiled_planner()
    assert route_of(node) == conv.DIRECT  # nothing measured: the smallest prior
    relu_conv = lambda a, b: F.conv2d(a, b, padding=1).relu()  # noqa: E731
    with collecting() as found:  # the conv as the program uses it: with its relu, as `tg tune` times it
        tg.compile(relu_conv)(tg.tensor(x), tg.tensor(weight))
    (measured,) = [u.measured_as for uses in found.values() for u in uses if u.signature == sig]
    for candidate in (c.name for c in candidates_of(node)):
        planner.cost_model.db.record(planner.cost_model.fingerprint, kernel_id(sig, candidate), code_hash(),
                                     sig.dtype_key, measured.shape_key, sig.flops, sig.bytes,
                                     [1e-6 if candidate == chosen else 1.0])
    convolve = tg.compile(relu_conv)
    out = convolve(tg.tensor(x), tg.tensor(weight))
    (trace,) = [t for traces in convolve.traces.values() for t in traces]
    calls = [s for kernel in trace.program.kernels for s in walk(kernel.body) if isinstance(s, ConvCall)]
    assert [call.function for call in calls] == ([conv.C_FUNCTIONS[chosen]] if chosen != DECOMPOSE else [])
    expected = torch.relu(torch.nn.functional.conv2d(torch.from_numpy(x).double(), torch.from_numpy(weight).double(),
                                                     padding=1)).numpy()
    assert np.abs(out.numpy() - expected).max() < 3e-5 * np.abs(expected).max()
