"""Grouped pointwise convs run as one batched product per image (schedule.convolution's "grouped_gemm"): which
convs take it, values and gradients against torch, and the batch norm, bias, relu and residual fused into the
call instead of passes over its result."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tensorgraphs as tg
import tensorgraphs.nn.functional as F
from tensorgraphs.backends.cpu import CPU
from tensorgraphs.codegen.loop_ir import GemmCall, walk
from tensorgraphs.plan.choices import DECOMPOSE, candidates_of
from tensorgraphs.schedule.extern import gemm_enabled

pytestmark = pytest.mark.skipif(not gemm_enabled(), reason="the grouped conv calls the GEMM library")

EPS = 1e-5


def _floats(shape: tuple[int, ...], seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape, dtype=np.float32)


def _candidates(x: tuple[int, ...], w: tuple[int, ...], **conv) -> list[str]:
    out = F.conv2d(tg.tensor(_floats(x, 0)), tg.tensor(_floats(w, 1)), **conv)
    return [c.name for c in candidates_of(out.node)]


def test_only_grouped_pointwise_convs_take_the_batched_product() -> None:
    assert _candidates((2, 8, 5, 5), (6, 4, 1, 1), groups=2) == ["grouped_gemm", DECOMPOSE]
    assert _candidates((2, 8, 5, 5), (6, 4, 3, 3), groups=2, padding=1) == [DECOMPOSE]  # a window
    assert _candidates((2, 8, 5, 5), (6, 4, 1, 1), groups=2, stride=2) == [DECOMPOSE]
    assert _candidates((2, 8, 5, 5), (6, 4, 1, 1), groups=2, padding=1) == [DECOMPOSE]
    assert _candidates((2, 8, 5, 5), (8, 1, 1, 1), groups=8) == [DECOMPOSE]  # depthwise: one channel per group
    assert "grouped_gemm" not in _candidates((2, 8, 5, 5), (6, 8, 1, 1))  # one group: the conv kernels
    assert _candidates((33, 8, 2, 2), (6, 4, 1, 1), groups=2) == [DECOMPOSE]  # a call per image: batches bounded


def _batch_norm(out: torch.Tensor, seed: int) -> tuple[torch.Tensor, list[np.ndarray]]:
    """out through an inference batch norm with seeded statistics; the statistics (mean, var, weight, bias)."""
    channels = out.shape[1]
    stats = [_floats((channels,), seed + i) for i in range(4)]
    stats[1] = np.abs(stats[1]) + 0.5
    mean, var, weight, bias = (torch.from_numpy(s).reshape(channels, 1, 1) for s in stats)
    return (out - mean) / torch.sqrt(var + EPS) * weight + bias, stats


def _tg_batch_norm(out: tg.Tensor, stats: list[np.ndarray]) -> tg.Tensor:
    return F.batch_norm(out, *(tg.tensor(s) for s in stats), eps=EPS)


# (batch, groups, in channels, out channels, height, width): rows per group of 7 and 5 fill no 6-row tile, 35 and
# 3 positions no 16-column one, and one row per group
SHAPES = [(1, 4, 12, 28, 5, 7), (3, 3, 15, 15, 1, 3), (2, 2, 34, 10, 6, 6), (2, 4, 8, 4, 3, 5)]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("bias", [False, True])
def test_batch_norm_and_relu_fuse_into_the_product(shape: tuple[int, ...], bias: bool) -> None:
    n, groups, cin, cout, h, w = shape
    x, weight, b = _floats((n, cin, h, w), 1), _floats((cout, cin // groups, 1, 1), 2), _floats((cout,), 3)
    conv = torch.nn.functional.conv2d(
        torch.from_numpy(x), torch.from_numpy(weight), torch.from_numpy(b) if bias else None, groups=groups
    )
    normed, stats = _batch_norm(conv, 4)
    expected = torch.relu(normed)
    out = F.relu(
        _tg_batch_norm(F.conv2d(tg.tensor(x), tg.tensor(weight), tg.tensor(b) if bias else None, groups=groups), stats)
    )
    program, _ = CPU.program([out.node])
    products = [kernel for kernel in program.kernels if any(isinstance(s, GemmCall) for s in walk(kernel.body))]
    assert len(products) == 1, program.kernels
    calls = [s for s in walk(products[0].body) if isinstance(s, GemmCall)]
    assert len(calls) == n and all(c.batch == groups and c.epilogue.activation == "relu" for c in calls), calls
    assert all(c.epilogue.bias is not None for c in calls), calls
    # nothing after the product: every other kernel works on the weights and the channel vectors
    assert all(p.size <= weight.size for k in program.kernels if k is not products[0] for p in k.buffers), (
        program.kernels
    )
    np.testing.assert_allclose(out.numpy(), expected.numpy(), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("shape", SHAPES)
def test_a_residual_fuses_into_the_product(shape: tuple[int, ...]) -> None:
    n, groups, cin, cout, h, w = shape
    x, weight, residual = (
        _floats((n, cin, h, w), 1),
        _floats((cout, cin // groups, 1, 1), 2),
        _floats((n, cout, h, w), 3),
    )
    expected = torch.nn.functional.conv2d(
        torch.from_numpy(x), torch.from_numpy(weight), groups=groups
    ) * 0.5 + torch.from_numpy(residual)
    out = F.conv2d(tg.tensor(x), tg.tensor(weight), groups=groups) * 0.5 + tg.tensor(residual)
    program, _ = CPU.program([out.node])
    assert len(program.kernels) == 1, program.kernels
    calls = list(walk(program.kernels[0].body))
    assert len(calls) == n and all(c.epilogue.alpha == 0.5 and c.epilogue.residual for c in calls), calls
    np.testing.assert_allclose(out.numpy(), expected.numpy(), rtol=1e-4, atol=1e-4)


def test_strided_views_of_the_input_are_read_where_they_are() -> None:
    """x a slice of a larger batch (an offset into its buffer) and the result a channel shuffle's input."""
    groups = 4
    whole, weight = _floats((3, 16, 4, 5), 1), _floats((8, 4, 1, 1), 2)
    conv = torch.nn.functional.conv2d(torch.from_numpy(whole[1:]), torch.from_numpy(weight), groups=groups)
    expected = conv.reshape(2, groups, 2, 4, 5).transpose(1, 2).reshape(2, 8, 4, 5)
    out = F.conv2d(tg.tensor(whole)[1:], tg.tensor(weight), groups=groups)
    shuffled = out.reshape(2, groups, 2, 4, 5).transpose(1, 2).reshape(2, 8, 4, 5)
    np.testing.assert_allclose(shuffled.numpy(), expected.numpy(), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("batch", [1, 3])
def test_compiled_training_step_matches_torch(batch: int) -> None:
    """A ShuffleNet-like unit: grouped 1x1, batch norm, relu, channel shuffle, depthwise 3x3 (stride 1 and 2),
    grouped 1x1 with a bias, residual; values and gradients (the forward convs by the kernel, their gradients
    decomposed)."""
    torch.manual_seed(0)
    groups, channels = 3, 12
    reference = torch.nn.ModuleDict(
        {
            "reduce": torch.nn.Conv2d(channels, 9, 1, groups=groups, bias=False),
            "norm": torch.nn.BatchNorm2d(9).eval(),
            "depthwise": torch.nn.Conv2d(9, 9, 3, padding=1, groups=9),
            "strided": torch.nn.Conv2d(9, 9, 3, stride=2, padding=1, groups=9, bias=False),
            "expand": torch.nn.Conv2d(9, channels, 1, groups=groups),
        }
    )
    with torch.no_grad():
        reference["norm"].running_mean.normal_()
        reference["norm"].running_var.uniform_(0.5, 2.0)
    x = _floats((batch, channels, 6, 7), 5)

    def unit(layers, functional, inputs):
        h = functional.relu(layers["norm"](layers["reduce"](inputs)))
        n, c, height, width = h.shape
        h = h.reshape(n, groups, c // groups, height, width).transpose(1, 2).reshape(n, c, height, width)
        out = layers["expand"](layers["depthwise"](h)) + inputs
        return functional.relu(out), layers["strided"](h)

    mine = tg.nn.ModuleDict(
        {
            "reduce": tg.nn.Conv2d(channels, 9, 1, groups=groups, bias=False),
            "norm": tg.nn.BatchNorm2d(9),
            "depthwise": tg.nn.Conv2d(9, 9, 3, padding=1, groups=9),
            "strided": tg.nn.Conv2d(9, 9, 3, stride=2, padding=1, groups=9, bias=False),
            "expand": tg.nn.Conv2d(9, channels, 1, groups=groups),
        }
    )
    mine.load_state_dict({k: tg.tensor(v.detach().numpy()) for k, v in reference.state_dict().items()})
    mine.eval()

    @tg.compile
    def step(inputs: tg.Tensor) -> tuple[tg.Tensor, tg.Tensor]:
        out, strided = unit(mine, F, inputs)
        loss = (out * out).mean() + (strided * strided).mean()
        loss.backward()
        return out, loss

    out, loss = step(tg.tensor(x))
    expected, strided = unit(reference, torch.nn.functional, torch.from_numpy(x))
    expected_loss = (expected * expected).mean() + (strided * strided).mean()
    expected_loss.backward()
    np.testing.assert_allclose(out.numpy(), expected.detach().numpy(), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(loss.item(), expected_loss.item(), rtol=1e-5)
    grads = dict(mine.named_parameters())
    for name, parameter in reference.named_parameters():
        np.testing.assert_allclose(grads[name].grad.numpy(), parameter.grad.numpy(), rtol=1e-4, atol=1e-5, err_msg=name)
