"""An activation after a residual add (a ResNet block's relu(conv(...) + bn + x)) fused into the conv or product
call's epilogue (gemm.h's TG_ACT_AFTER_RESIDUAL, `extern.ACTIVATION_AFTER_RESIDUAL`): values against torch, and the
structure (the relu is no pass of its own), so it cannot silently regress."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tensorgraphs as tg
import tensorgraphs.nn.functional as F
from tensorgraphs.codegen.loop_ir import ConvCall, GemmCall, Let, walk
from tensorgraphs.graph.ops import Op
from tensorgraphs.schedule import convolution, extern
from tensorgraphs.schedule.extern import ACTIVATION_AFTER_RESIDUAL, gemm_enabled
from tensorgraphs.schedule.fusion import schedule_kernels

pytestmark = pytest.mark.skipif(not gemm_enabled(), reason="the fused epilogues need the GEMM library")


def _floats(shape: tuple[int, ...], seed: int, scale: float = 1.0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape, dtype=np.float32) * np.float32(scale)


def _calls(kernels: list, kind: type) -> list:
    return [s for kernel in kernels for s in walk(kernel.body) if isinstance(s, kind)]


def _relu_passes(kernels: list) -> int:
    """Kernels that compute a relu themselves (a compare in generated loops)."""
    return sum(any(isinstance(s, Let) and s.op == Op.CMPLT for s in walk(k.body)) for k in kernels)


@pytest.fixture
def without_fusion_after_residual(monkeypatch: pytest.MonkeyPatch):
    """Schedules as before the activation could follow the residual: the rules of that stage dropped."""

    def rules_before(rules):
        return lambda *args, **kwargs: [r for r in rules(*args, **kwargs) if r.stage != ACTIVATION_AFTER_RESIDUAL]

    def apply() -> None:
        monkeypatch.setattr(extern, "epilogue_rules", rules_before(extern.epilogue_rules))
        monkeypatch.setattr(convolution, "epilogue_rules", rules_before(convolution.epilogue_rules))

    return apply


def _batch_norm(x: tg.Tensor, channels: int, seed: int) -> tg.Tensor:
    rng = np.random.default_rng(seed)
    mean, bias = (tg.tensor(rng.standard_normal(channels).astype(np.float32) * 0.1) for _ in range(2))
    var, weight = (tg.tensor(rng.uniform(0.5, 1.5, channels).astype(np.float32)) for _ in range(2))
    return F.batch_norm(x, mean, var, weight, bias, training=False)


def _torch_batch_norm(x: torch.Tensor, channels: int, seed: int) -> torch.Tensor:
    rng = np.random.default_rng(seed)
    mean, bias = (torch.from_numpy(rng.standard_normal(channels).astype(np.float32) * 0.1) for _ in range(2))
    var, weight = (torch.from_numpy(rng.uniform(0.5, 1.5, channels).astype(np.float32)) for _ in range(2))
    return torch.nn.functional.batch_norm(x, mean, var, weight, bias, training=False)


def _block(nn, conv, batch_norm, x, weights: dict[str, object], bottleneck: bool):
    """torchvision's BasicBlock (two 3x3 convs) or Bottleneck (1x1, 3x3 at stride 2, 1x1, a projected shortcut), in
    eval mode, written once for tensorgraphs (nn = F) and torch (nn = torch.nn.functional)."""
    if not bottleneck:
        h = nn.relu(batch_norm(conv(x, weights["conv1"], padding=1), 8, 1))
        return nn.relu(batch_norm(conv(h, weights["conv2"], padding=1), 8, 2) + x)
    h = nn.relu(batch_norm(conv(x, weights["conv1"]), 4, 1))
    h = nn.relu(batch_norm(conv(h, weights["conv2"], stride=2, padding=1), 4, 2))
    h = batch_norm(conv(h, weights["conv3"]), 16, 3)
    return nn.relu(h + batch_norm(conv(x, weights["shortcut"], stride=2), 16, 4))


BLOCK_WEIGHTS = {
    False: {"conv1": (8, 8, 3, 3), "conv2": (8, 8, 3, 3)},
    True: {"conv1": (4, 8, 1, 1), "conv2": (4, 4, 3, 3), "conv3": (16, 4, 1, 1), "shortcut": (16, 8, 1, 1)},
}


def _tg_block(x: np.ndarray, bottleneck: bool) -> tg.Tensor:
    weights = {name: tg.tensor(_floats(shape, i, 0.3)) for i, (name, shape) in enumerate(
        BLOCK_WEIGHTS[bottleneck].items())}
    return _block(F, F.conv2d, _batch_norm, tg.tensor(x), weights, bottleneck)


def _torch_block(x: np.ndarray, bottleneck: bool) -> torch.Tensor:
    weights = {name: torch.from_numpy(_floats(shape, i, 0.3)) for i, (name, shape) in enumerate(
        BLOCK_WEIGHTS[bottleneck].items())}
    return _block(torch.nn.functional, torch.nn.functional.conv2d, _torch_batch_norm, torch.from_numpy(x), weights,
                  bottleneck)


@pytest.mark.parametrize("bottleneck", [False, True], ids=["basic", "bottleneck"])
@pytest.mark.parametrize("shape", [(4, 8, 8, 8), (1, 8, 36, 36)], ids=["merged", "large"])
def test_resnet_block_relu_after_the_shortcut_is_the_last_convs_epilogue(
        bottleneck: bool, shape: tuple[int, ...], without_fusion_after_residual) -> None:
    """Each relu runs in a conv's epilogue, the one after the shortcut's add too: the block's kernels are its convs
    and the batch norms' weight scalings, one kernel (the relu pass over the block's output) fewer than before."""
    x = _floats(shape, 9)
    out = _tg_block(x, bottleneck)
    kernels = schedule_kernels([out.node]).kernels
    convs = _calls(kernels, ConvCall)
    assert len(convs) == len(BLOCK_WEIGHTS[bottleneck]) and _relu_passes(kernels) == 0, kernels
    last = next(c for c in convs if c.residual is not None)
    assert last.activation == "relu" and last.activation_after_residual, last
    assert sum(c.activation == "relu" and not c.activation_after_residual for c in convs) == (2 if bottleneck else 1)
    np.testing.assert_allclose(out.numpy(), _torch_block(x, bottleneck).numpy(), rtol=1e-4, atol=1e-4)
    without_fusion_after_residual()
    before = schedule_kernels([_tg_block(x, bottleneck).node]).kernels
    assert len(before) == len(kernels) + 1 and _relu_passes(before) == 1


def test_training_step_matches_torch_and_keeps_the_pre_activation_for_relus_backward() -> None:
    """relu's gradient reads its input, the block's sum: in a training step that sum is stored, so the relu is not
    the conv's epilogue (it reads the sum's buffer); values and gradients as torch's."""
    x = _floats((2, 8, 6, 6), 3)
    weights = {name: tg.tensor(_floats(shape, i, 0.3), requires_grad=True)
               for i, (name, shape) in enumerate(BLOCK_WEIGHTS[False].items())}
    out = _block(F, F.conv2d, _batch_norm, tg.tensor(x), weights, False)
    loss = (out * out).mean()
    grads = tg.grad(loss, list(weights.values()))
    kernels = schedule_kernels([loss.node, *(g.node for g in grads)]).kernels
    assert not any(c.activation_after_residual for c in _calls(kernels, ConvCall))
    reference = {name: torch.from_numpy(_floats(shape, i, 0.3)).requires_grad_()
                 for i, (name, shape) in enumerate(BLOCK_WEIGHTS[False].items())}
    expected = _block(torch.nn.functional, torch.nn.functional.conv2d, _torch_batch_norm, torch.from_numpy(x),
                      reference, False)
    (expected * expected).mean().backward()
    np.testing.assert_allclose(loss.item(), (expected * expected).mean().item(), rtol=1e-5)
    for grad, name in zip(grads, reference, strict=True):
        np.testing.assert_allclose(grad.numpy(), reference[name].grad.numpy(), rtol=1e-4, atol=1e-5, err_msg=name)


PRODUCT_CASES = {
    "relu(linear + residual)": (lambda nn, x, w, b, r: nn.relu(nn.linear(x, w, b) + r), "relu", True),
    "relu(residual + linear)": (lambda nn, x, w, b, r: nn.relu(r + nn.linear(x, w, b)), "relu", True),
    "relu(linear) + residual": (lambda nn, x, w, b, r: nn.relu(nn.linear(x, w, b)) + r, "relu", False),
    "gelu(linear + residual)": (lambda nn, x, w, b, r: nn.gelu(nn.linear(x, w, b) + r, approximate="tanh"),
                                "gelu_tanh", True),
}


@pytest.mark.parametrize("case", PRODUCT_CASES)
@pytest.mark.parametrize("rows", [3, 40])  # the few-row kernel, the blocked one
def test_product_with_the_activation_before_or_after_the_residual_is_one_kernel(case: str, rows: int) -> None:
    """relu(x @ w.T + b + r) and relu(x @ w.T + b) + r: one call each, the relu in the epilogue in the graph's order;
    NaN, infinities and signed zeros in the residual give torch's values (relu(NaN) is NaN)."""
    build, activation, after = PRODUCT_CASES[case]
    x, w, b, r = _floats((rows, 24), 0), _floats((20, 24), 1), _floats((20,), 2), _floats((rows, 20), 3)
    r[0, :5] = [np.nan, np.inf, -np.inf, -0.0, 0.0]
    out = build(F, *map(tg.tensor, (x, w, b, r)))
    kernels = schedule_kernels([out.node]).kernels
    (call,) = _calls(kernels, GemmCall)
    assert len(kernels) == 1 and call.epilogue.residual is not None, kernels
    assert (call.epilogue.activation, call.epilogue.activation_after_residual) == (activation, after)
    expected = build(torch.nn.functional, *map(torch.from_numpy, (x, w, b, r))).numpy()
    got = out.numpy()
    np.testing.assert_array_equal(np.isnan(got), np.isnan(expected))
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_sum_needed_elsewhere_keeps_the_activation_a_pass() -> None:
    """The sum before the relu is also returned: the call adds the residual, the relu reads its buffer."""
    x, w, r = _floats((9, 12), 3), _floats((10, 12), 4), _floats((9, 10), 5)
    total = F.linear(tg.tensor(x), tg.tensor(w)) + tg.tensor(r)
    kernels = schedule_kernels([total.node, F.relu(total).node]).kernels
    (call,) = _calls(kernels, GemmCall)
    assert call.epilogue.residual is not None and call.epilogue.activation == "none" and len(kernels) == 2


def test_a_second_activation_after_the_residual_stays_a_pass() -> None:
    """relu(relu(conv + b) + r): the epilogue applies one activation, the first; the second is a pass."""
    x, w, b, r = _floats((2, 4, 7, 7), 6), _floats((5, 4, 3, 3), 7), _floats((5,), 8), _floats((2, 5, 7, 7), 9)
    out = F.relu(F.relu(F.conv2d(*map(tg.tensor, (x, w, b)), padding=1)) + tg.tensor(r))
    kernels = schedule_kernels([out.node]).kernels
    (call,) = _calls(kernels, ConvCall)
    assert call.activation == "relu" and not call.activation_after_residual and _relu_passes(kernels) == 1
    t = torch.nn.functional
    expected = t.relu(t.relu(t.conv2d(*map(torch.from_numpy, (x, w, b)), padding=1)) + torch.from_numpy(r))
    np.testing.assert_allclose(out.numpy(), expected.numpy(), rtol=1e-5, atol=1e-5)
