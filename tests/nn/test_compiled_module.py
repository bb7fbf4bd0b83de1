"""tg.compile(module): a module whose forward is compiled and differentiable, trained like the module itself."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import pytest
import torch

import tensorgraphs as tg
import tensorgraphs.nn.functional as F


def mlp(nn: Any) -> Any:
    return nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 3))


def cnn(nn: Any) -> Any:
    return nn.Sequential(nn.Conv2d(2, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                         nn.Linear(4 * 3 * 3, 3))


def copy_of(reference: torch.nn.Module, build: Callable[[Any], Any]) -> tg.nn.Module:
    model = build(tg.nn)
    model.load_state_dict({k: v.detach().numpy() for k, v in reference.state_dict().items()})
    return model


def batches(shape: tuple[int, ...], count: int = 3) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(0)
    return [(rng.standard_normal(shape, dtype=np.float32), rng.integers(0, 3, shape[0])) for _ in range(count)]


@pytest.mark.parametrize("build, shape, optimizer", [(mlp, (5, 8), "Adam"), (cnn, (4, 2, 6, 6), "SGD")],
                         ids=["mlp-adam", "cnn-sgd-momentum"])
def test_training_a_compiled_module_matches_torch(build: Callable[[Any], Any], shape: tuple[int, ...],
                                                  optimizer: str) -> None:
    """Forward compiled, then the loss, backward() and step() outside it, as in eager code."""
    torch.manual_seed(0)
    reference = build(torch.nn)
    compiled = tg.compile(copy_of(reference, build))
    options = {"lr": 0.01} if optimizer == "Adam" else {"lr": 0.1, "momentum": 0.9}
    torch_optimizer = getattr(torch.optim, optimizer)(reference.parameters(), **options)
    tg_optimizer = getattr(tg.optim, optimizer)(compiled.parameters(), **options)
    for x, y in batches(shape):
        tg_optimizer.zero_grad()
        loss = F.cross_entropy(compiled(tg.tensor(x)), tg.tensor(y))
        loss.backward()
        tg_optimizer.step()
        torch_optimizer.zero_grad()
        expected = torch.nn.functional.cross_entropy(reference(torch.from_numpy(x)), torch.from_numpy(y))
        expected.backward()
        torch_optimizer.step()
        np.testing.assert_allclose(loss.item(), expected.item(), rtol=1e-5)
    got, wanted = compiled.state_dict(), reference.state_dict()
    assert list(got) == ["_orig_mod." + k for k in wanted]  # torch's OptimizedModule names
    for key, value in wanted.items():
        np.testing.assert_allclose(got["_orig_mod." + key].numpy(), value.numpy(), rtol=1e-4, atol=1e-6,
                                   err_msg=key)
    assert sum(len(t) for t in compiled.compiled_forward.traces.values()) == 1


def test_gradients_flow_into_inputs_that_require_grad() -> None:
    torch.manual_seed(0)
    reference = mlp(torch.nn)
    compiled = tg.compile(copy_of(reference, mlp))
    (x, _), = batches((5, 8), 1)
    scale = np.float32(1.5)
    leaf, torch_leaf = tg.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    weight, torch_weight = tg.tensor(scale, requires_grad=True), torch.tensor(scale, requires_grad=True)
    (compiled(leaf * weight) ** 2).sum().backward()  # a leaf, and a value computed from one
    (reference(torch_leaf * torch_weight) ** 2).sum().backward()
    np.testing.assert_allclose(leaf.grad.numpy(), torch_leaf.grad.numpy(), rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(weight.grad.numpy(), torch_weight.grad.numpy(), rtol=1e-4)
    for (name, p), q in zip(compiled.named_parameters(), reference.parameters()):
        np.testing.assert_allclose(p.grad.numpy(), q.grad.numpy(), rtol=1e-4, atol=1e-6, err_msg=name)


def test_eval_and_train_switch_dropout_like_the_eager_module() -> None:
    def build() -> tg.nn.Module:
        tg.manual_seed(0)
        return tg.nn.Sequential(tg.nn.Linear(8, 16), tg.nn.Dropout(0.5), tg.nn.Linear(16, 3))

    eager, compiled = build(), tg.compile(build())
    x = tg.tensor(batches((5, 8), 1)[0][0])
    for mode in ("train", "eval", "train"):
        getattr(eager, mode)(), getattr(compiled, mode)()
        assert compiled.training == eager.training == (mode == "train")
        tg.manual_seed(1)
        expected = eager(x)
        tg.manual_seed(1)
        got = compiled(x)
        np.testing.assert_allclose(got.detach().numpy(), expected.detach().numpy(), rtol=1e-5, atol=1e-6)
        (got ** 2).sum().backward()
        (expected ** 2).sum().backward()
    for (name, p), q in zip(compiled.named_parameters(), eager.parameters()):
        np.testing.assert_allclose(p.grad.numpy(), q.grad.numpy(), rtol=1e-5, atol=1e-6, err_msg=name)
    assert sum(len(t) for t in compiled.compiled_forward.traces.values()) == 2  # one per mode


def test_without_grad_the_results_are_plain_values() -> None:
    compiled = tg.compile(mlp(tg.nn))
    x = tg.tensor(batches((5, 8), 1)[0][0])
    with tg.no_grad():
        out = compiled(x)
    assert not out.requires_grad
    np.testing.assert_allclose(out.numpy(), compiled(x).detach().numpy(), rtol=1e-6)


def test_the_wrapper_reads_and_loads_like_the_module() -> None:
    torch.manual_seed(0)
    reference = mlp(torch.nn)
    module = mlp(tg.nn)
    compiled = tg.compile(module)
    compiled.load_state_dict({k: v.detach().numpy() for k, v in reference.state_dict().items()})  # unprefixed
    x = batches((5, 8), 1)[0][0]
    np.testing.assert_allclose(compiled(tg.tensor(x)).detach().numpy(),
                               reference(torch.from_numpy(x)).detach().numpy(), rtol=1e-5, atol=1e-6)
    assert [p is q for p, q in zip(compiled.parameters(), module.parameters())] == [True] * 4
    module.vocabulary = 7
    assert compiled.vocabulary == 7 and compiled._orig_mod is module  # other attributes are the module's
    compiled.eval()
    assert not module.training and not module[0].training


def test_a_compiled_module_is_part_of_a_compiled_step() -> None:
    torch.manual_seed(0)
    reference = mlp(torch.nn)
    eager, compiled = copy_of(reference, mlp), tg.compile(copy_of(reference, mlp))
    optimizers = [tg.optim.SGD(m.parameters(), lr=0.1) for m in (eager, compiled)]

    def step(model: tg.nn.Module, optimizer: tg.optim.Optimizer, x: tg.Tensor, y: tg.Tensor) -> tg.Tensor:
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        return loss.detach()

    compiled_step = tg.compile(lambda x, y: step(compiled, optimizers[1], x, y))
    for x, y in batches((5, 8)):
        expected = step(eager, optimizers[0], tg.tensor(x), tg.tensor(y)).item()
        np.testing.assert_allclose(compiled_step(tg.tensor(x), tg.tensor(y)).item(), expected, rtol=1e-5)


def test_keyword_arguments_and_torch_compile_options() -> None:
    class Scaled(tg.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = tg.nn.Linear(4, 2)

        def forward(self, x: tg.Tensor, scale: float = 1.0) -> tg.Tensor:
            return self.linear(x) * scale

    module = Scaled()
    compiled = tg.compile(module, mode="max-autotune", fullgraph=True)
    x = tg.ones(3, 4)
    with tg.no_grad():
        for scale in (1.0, 3.0):
            np.testing.assert_allclose(compiled(x, scale=scale).numpy(), module(x, scale=scale).numpy(), rtol=1e-6)
    assert sum(len(t) for t in compiled.compiled_forward.traces.values()) == 1
    assert tg.compile(module, disable=True) is module
    assert isinstance(tg.compile(fullgraph=True)(module), tg.CompiledModule)
    with pytest.raises(tg.ArgumentError, match=r"unknown option.*test_compiled_module.py"):
        tg.compile(module, fast=True)


@pytest.mark.long
def test_a_compiled_transformer_with_dropout_trains_like_the_eager_one() -> None:
    """Dropout in several places (attention, feed-forward, residuals): the compiled forward draws the same masks
    as eager code under the same seed, and backward reuses them."""
    def build() -> tg.nn.Module:
        tg.manual_seed(0)
        layer = tg.nn.TransformerEncoderLayer(8, 2, 16, dropout=0.2, batch_first=True)
        return tg.nn.Sequential(tg.nn.TransformerEncoder(layer, 2), tg.nn.Flatten(), tg.nn.Linear(7 * 8, 3))

    eager, compiled = build(), tg.compile(build())
    optimizers = [tg.optim.Adam(m.parameters(), lr=1e-3) for m in (eager, compiled)]
    for seed, (x, y) in enumerate(batches((4, 7, 8))):
        losses = []
        for model, optimizer in zip((eager, compiled), optimizers):
            tg.manual_seed(seed)
            optimizer.zero_grad()
            loss = F.cross_entropy(model(tg.tensor(x)), tg.tensor(y))
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        np.testing.assert_allclose(losses[1], losses[0], rtol=1e-5)
    for (name, p), q in zip(compiled.named_parameters(), eager.parameters()):
        np.testing.assert_allclose(p.detach().numpy(), q.detach().numpy(), rtol=1e-4, atol=1e-6, err_msg=name)
