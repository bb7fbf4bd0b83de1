"""tg.optim against torch.optim: the same model, weights and data for 10 steps must give the same parameters."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import pytest
import torch

import tensorgraphs as tg
from tensorgraphs.graph.ops import Op
from tensorgraphs.optim.optimizer import commit
from tensorgraphs.rewrite.structural_hash import structural_hash

STEPS = 10


def build(nn: Any) -> Any:
    return nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 2))


def batches(seed: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal((5, 4)).astype(np.float32), rng.standard_normal((5, 2)).astype(np.float32))
            for _ in range(STEPS)]


def groups(model: Any, lrs: tuple[float, float] | None) -> Any:
    """All parameters, or two groups (one per Linear) with their own learning rates."""
    if lrs is None:
        return model.parameters()
    return [{"params": model[0].parameters(), "lr": lrs[0]}, {"params": model[2].parameters(), "lr": lrs[1]}]


OPTIMIZERS: dict[str, tuple[str, dict[str, Any], tuple[float, float] | None]] = {
    "SGD": ("SGD", {"lr": 0.1}, None),
    "SGD_momentum_dampening_wd": ("SGD", {"lr": 0.05, "momentum": 0.9, "dampening": 0.1, "weight_decay": 0.01}, None),
    "SGD_nesterov_groups": ("SGD", {"lr": 0.05, "momentum": 0.8, "nesterov": True}, (0.1, 0.02)),
    "SGD_maximize": ("SGD", {"lr": 0.01, "momentum": 0.5, "maximize": True}, None),
    "Adam": ("Adam", {"lr": 0.01}, None),
    "Adam_wd_amsgrad_groups": ("Adam", {"lr": 0.01, "betas": (0.8, 0.99), "weight_decay": 0.1, "amsgrad": True},
                               (0.02, 0.005)),
    "AdamW": ("AdamW", {"lr": 0.01, "foreach": False}, None),
    "AdamW_amsgrad": ("AdamW", {"lr": 0.02, "weight_decay": 0.5, "amsgrad": True, "eps": 1e-6}, None),
    "RMSprop": ("RMSprop", {"lr": 0.01}, None),
    "RMSprop_centered_momentum": ("RMSprop", {"lr": 0.005, "alpha": 0.9, "momentum": 0.5, "centered": True,
                                              "weight_decay": 0.01}, None),
    "Adagrad": ("Adagrad", {"lr": 0.1}, None),
    "Adagrad_decay": ("Adagrad", {"lr": 0.1, "lr_decay": 0.05, "weight_decay": 0.01,
                                  "initial_accumulator_value": 0.1}, None),
    "Adadelta": ("Adadelta", {}, None),
    "Adadelta_wd_groups": ("Adadelta", {"lr": 0.5, "rho": 0.8, "weight_decay": 0.05}, (1.0, 0.3)),
    "Adamax": ("Adamax", {"lr": 0.01}, None),
    "Adamax_wd_maximize": ("Adamax", {"lr": 0.02, "betas": (0.8, 0.9), "weight_decay": 0.1, "maximize": True}, None),
    "NAdam": ("NAdam", {"lr": 0.01}, None),
    "NAdam_wd": ("NAdam", {"lr": 0.01, "weight_decay": 0.1, "momentum_decay": 0.01}, None),
    "NAdam_decoupled": ("NAdam", {"lr": 0.02, "weight_decay": 0.1, "decoupled_weight_decay": True}, None),
    "RAdam": ("RAdam", {"lr": 0.01}, None),
    "RAdam_wd_groups": ("RAdam", {"lr": 0.01, "betas": (0.5, 0.8), "weight_decay": 0.1}, (0.02, 0.005)),
    "RAdam_decoupled": ("RAdam", {"lr": 0.01, "weight_decay": 0.1, "decoupled_weight_decay": True}, None),
}


def run(lib: Any, model: Any, optimizer: Any, data: list, steps: range, loss_fn: Callable[..., Any]) -> None:
    for step in steps:
        x, y = data[step]
        optimizer.zero_grad()
        loss_fn(model(lib.tensor(x)), lib.tensor(y)).backward()
        optimizer.step()


def compiled_step(model: tg.nn.Module, optimizer: tg.optim.Optimizer) -> Callable[[tg.Tensor, tg.Tensor], tg.Tensor]:
    """One training step on mse_loss, compiled whole (forward, backward, optimizer.step)."""

    @tg.compile
    def step(x: tg.Tensor, y: tg.Tensor) -> tg.Tensor:
        optimizer.zero_grad()
        loss = tg.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        return loss

    return step


def copy_weights(reference: torch.nn.Module, mine: tg.nn.Module) -> None:
    mine.load_state_dict({k: v.detach().numpy() for k, v in reference.state_dict().items()})


def assert_same_parameters(reference: torch.nn.Module, mine: tg.nn.Module, label: str) -> None:
    mine_params = dict(mine.named_parameters())
    for name, expected in reference.named_parameters():
        np.testing.assert_allclose(mine_params[name].detach().numpy(), expected.detach().numpy(), rtol=1e-5,
                                   atol=1e-6, err_msg=f"{label}: parameter {name}")


def trained_reference(label: str) -> tuple[torch.nn.Module, tg.nn.Module, tg.optim.Optimizer, list]:
    """torch's model after STEPS steps of optimizer `label`, and tg's model (same initial weights) and optimizer."""
    name, options, lrs = OPTIMIZERS[label]
    torch.manual_seed(0)
    reference, mine = build(torch.nn), build(tg.nn)
    copy_weights(reference, mine)
    data = batches()
    ref_opt = getattr(torch.optim, name)(groups(reference, lrs), **options)
    run(torch, reference, ref_opt, data, range(STEPS), torch.nn.functional.mse_loss)
    return reference, mine, getattr(tg.optim, name)(groups(mine, lrs), **options), data


@pytest.mark.parametrize("label", OPTIMIZERS)
def test_optimizer_matches_torch_over_ten_steps(label: str) -> None:
    reference, mine, my_opt, data = trained_reference(label)
    run(tg, mine, my_opt, data, range(STEPS), tg.nn.functional.mse_loss)
    assert_same_parameters(reference, mine, label)


@pytest.mark.parametrize("label", OPTIMIZERS)
def test_compiled_step_matches_eager_and_torch(label: str) -> None:
    """The whole step under tg.compile, traced at the first step: what the first step does differently (SGD's
    momentum buffer starts as the gradient) must be a graph value, not a branch fixed when traced."""
    name, options, lrs = OPTIMIZERS[label]
    torch.manual_seed(0)
    reference, eager, compiled = build(torch.nn), build(tg.nn), build(tg.nn)
    copy_weights(reference, eager)
    copy_weights(reference, compiled)
    data = batches()[:4]
    run(torch, reference, getattr(torch.optim, name)(groups(reference, lrs), **options), data, range(4),
        torch.nn.functional.mse_loss)
    run(tg, eager, getattr(tg.optim, name)(groups(eager, lrs), **options), data, range(4), tg.nn.functional.mse_loss)
    optimizer = getattr(tg.optim, name)(groups(compiled, lrs), **options)

    step = compiled_step(compiled, optimizer)

    for x, y in data:
        step(tg.tensor(x), tg.tensor(y))
    assert sum(len(t) for t in step.traces.values()) == 1
    assert_same_parameters(reference, eager, f"eager {label}")
    assert_same_parameters(reference, compiled, f"compiled {label}")


def test_compiled_sgd_momentum_takes_the_first_gradient_whole() -> None:
    """The issue's case: three steps with gradient 1 from 0 (torch: -1, -2.9, -5.61)."""
    expected = torch.zeros(1, requires_grad=True)
    reference = torch.optim.SGD([expected], lr=1.0, momentum=0.9)
    w = tg.zeros(1, requires_grad=True)
    optimizer = tg.optim.SGD([w], lr=1.0, momentum=0.9)

    @tg.compile
    def step(x: tg.Tensor) -> tg.Tensor:
        optimizer.zero_grad()
        loss = (w * x).sum()
        loss.backward()
        optimizer.step()
        return loss

    for _ in range(3):
        reference.zero_grad()
        expected.sum().backward()
        reference.step()
        step(tg.ones(1))
    np.testing.assert_allclose(w.detach().numpy(), expected.detach().numpy(), rtol=1e-6)


def test_state_dict_resumes_the_same_trajectory() -> None:
    """Stop after 4 steps, move the optimizer state to a fresh optimizer (through a safetensors file), go on."""
    torch.manual_seed(0)
    reference, mine = build(torch.nn), build(tg.nn)
    copy_weights(reference, mine)
    data = batches()
    ref_opt = torch.optim.Adam(reference.parameters(), lr=0.01, amsgrad=True)
    run(torch, reference, ref_opt, data, range(STEPS), torch.nn.functional.mse_loss)

    first = tg.optim.Adam(mine.parameters(), lr=0.01, amsgrad=True)
    run(tg, mine, first, data, range(4), tg.nn.functional.mse_loss)
    saved = first.state_dict()
    assert sorted(saved["state"][0]) == ["exp_avg", "exp_avg_sq", "max_exp_avg_sq", "step"]
    assert saved["param_groups"][0]["params"] == [0, 1, 2, 3]
    second = tg.optim.Adam(mine.parameters(), lr=0.5)
    second.load_state_dict(saved)
    assert second.param_groups[0]["lr"] == 0.01
    run(tg, mine, second, data, range(4, STEPS), tg.nn.functional.mse_loss)
    assert_same_parameters(reference, mine, "resumed Adam")


def test_zero_grad_keeps_zeros_when_not_set_to_none() -> None:
    model = tg.nn.Linear(2, 1)
    optimizer = tg.optim.SGD(model.parameters(), lr=0.1)
    model(tg.ones(3, 2)).sum().backward()
    optimizer.zero_grad(set_to_none=False)
    assert np.all(model.weight.grad.numpy() == 0)
    optimizer.zero_grad()
    assert model.weight.grad is None


def test_step_updates_are_lazy_graph_values() -> None:
    """step_updates() only builds the graph; nothing changes until commit."""
    model = tg.nn.Linear(2, 1)
    before = model.weight.detach().numpy()
    optimizer = tg.optim.SGD(model.parameters(), lr=0.5)
    model(tg.ones(1, 2)).sum().backward()
    updates = optimizer.step_updates()
    assert [id(target) for target, _ in updates] == [id(model.weight), id(model.bias)]
    np.testing.assert_array_equal(model.weight.detach().numpy(), before)
    np.testing.assert_allclose(updates[0][1].numpy(), before - 0.5, rtol=1e-6)


@pytest.mark.parametrize("name", ["SGD", "Adam", "AdamW", "RMSprop", "Adagrad", "Adadelta", "Adamax", "NAdam",
                                  "RAdam"])
def test_update_graph_keeps_its_structure_while_the_lr_changes(name: str) -> None:
    """State starts as buffers and lr is an input, so every step (a scheduler running) is one compiled program."""
    model = tg.nn.Linear(3, 2)
    optimizer = getattr(tg.optim, name)(model.parameters(), lr=0.1)
    scheduler = tg.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    keys = []
    for step in range(3):
        model(tg.ones(4, 3) * (step + 1)).sum().backward()
        updates = optimizer.step_updates()
        keys.append(structural_hash([value.node for _, value in updates]))
        commit(updates)
        optimizer.zero_grad()
        scheduler.step()
    assert keys[0] == keys[1] == keys[2]


def test_invalid_arguments_raise_like_torch() -> None:
    params = list(tg.nn.Linear(2, 2).parameters())
    with pytest.raises(ValueError, match="Invalid learning rate"):
        tg.optim.Adam(params, lr=-1.0)
    with pytest.raises(ValueError, match="Invalid beta parameter at index 1"):
        tg.optim.Adam(params, betas=(0.9, 1.0))
    with pytest.raises(ValueError, match="Nesterov"):
        tg.optim.SGD(params, lr=0.1, nesterov=True)
    with pytest.raises(ValueError, match="empty parameter list"):
        tg.optim.SGD([], lr=0.1)
    with pytest.raises(TypeError, match="unexpected keyword argument 'momentum'"):
        tg.optim.AdamW(params, momentum=0.9)
    with pytest.raises(ValueError, match="more than one parameter group"):
        tg.optim.SGD([{"params": params}, {"params": params[:1]}], lr=0.1)


@pytest.mark.parametrize("norm_type", [2.0, 1.0, float("inf")])
def test_clip_grad_norm_matches_torch(norm_type: float) -> None:
    torch.manual_seed(0)
    reference, mine = build(torch.nn), build(tg.nn)
    copy_weights(reference, mine)
    x, y = batches()[0]
    torch.nn.functional.mse_loss(reference(torch.tensor(x)), torch.tensor(y) * 10).backward()
    tg.nn.functional.mse_loss(mine(tg.tensor(x)), tg.tensor(y) * 10).backward()
    expected = torch.nn.utils.clip_grad_norm_(reference.parameters(), 0.5, norm_type)
    total = tg.nn.utils.clip_grad_norm_(mine.parameters(), 0.5, norm_type)
    assert total.item() == pytest.approx(expected.item(), rel=1e-5)
    for name, p in reference.named_parameters():
        np.testing.assert_allclose(mine.get_parameter(name).grad.numpy(), p.grad.numpy(), rtol=1e-5, atol=1e-7)


def test_clip_grad_norm_then_manual_updates_match_torch() -> None:
    """Clipping, then a hand-written SGD step in place: each clipped gradient is a value (a buffer), so updating one
    parameter computes that parameter only, not the norm over every gradient again."""
    torch.manual_seed(0)
    reference, mine = build(torch.nn), build(tg.nn)
    copy_weights(reference, mine)
    for step, (x, y) in enumerate(batches()[:3]):
        for lib, model in ((torch, reference), (tg, mine)):
            model.zero_grad()
            lib.nn.functional.mse_loss(model(lib.tensor(x)), lib.tensor(y) * 10).backward()
            lib.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
            if lib is tg:
                assert all(p.grad.node.op is Op.BUFFER for p in model.parameters()), step
            with lib.no_grad():
                for p in model.parameters():
                    p.add_(p.grad, alpha=-0.1)
    assert_same_parameters(reference, mine, "clipped manual SGD")


def test_clip_grad_value_matches_torch() -> None:
    torch.manual_seed(0)
    reference, mine = build(torch.nn), build(tg.nn)
    copy_weights(reference, mine)
    x, y = batches()[0]
    torch.nn.functional.mse_loss(reference(torch.tensor(x)), torch.tensor(y)).backward()
    tg.nn.functional.mse_loss(mine(tg.tensor(x)), tg.tensor(y)).backward()
    torch.nn.utils.clip_grad_value_(reference.parameters(), 0.05)
    tg.nn.utils.clip_grad_value_(mine.parameters(), 0.05)
    for name, p in reference.named_parameters():
        np.testing.assert_allclose(mine.get_parameter(name).grad.numpy(), p.grad.numpy(), rtol=1e-5, atol=1e-7)


def test_pre_ln_transformer_training_matches_torch() -> None:
    """The issue's benchmark model in miniature: pre-LN encoder layer, GELU-tanh, MSE loss, Adam, clipping, StepLR."""
    build_model = lambda nn: nn.Sequential(
        nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, activation=nn.GELU("tanh"), batch_first=True,
                                   norm_first=True), nn.Linear(8, 3))
    torch.manual_seed(0)
    reference, mine = build_model(torch.nn), build_model(tg.nn)
    copy_weights(reference, mine)
    rng = np.random.default_rng(1)
    data = [(rng.standard_normal((2, 5, 8)).astype(np.float32), rng.standard_normal((2, 5, 3)).astype(np.float32))
            for _ in range(5)]
    losses = {}
    for lib, model in ((torch, reference), (tg, mine)):
        optimizer = lib.optim.Adam(model.parameters(), lr=0.01)
        scheduler = lib.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
        losses[lib.__name__] = []
        for x, y in data:
            optimizer.zero_grad()
            loss = lib.nn.functional.mse_loss(model(lib.tensor(x)), lib.tensor(y))
            loss.backward()
            lib.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            losses[lib.__name__].append(loss.item())
    np.testing.assert_allclose(losses["tensorgraphs"], losses["torch"], rtol=1e-5)
    mine_params = dict(mine.named_parameters())
    for name, expected in reference.named_parameters():
        got, want = mine_params[name].detach().numpy(), expected.detach().numpy()
        if name.endswith("in_proj_bias"):  # the key bias's gradient is 0 up to rounding; Adam amplifies the noise
            got, want = np.delete(got, np.s_[8:16]), np.delete(want, np.s_[8:16])
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5, err_msg=name)


def test_sgd_momentum_resumes_from_a_torch_state_dict() -> None:
    """torch's SGD state has no step count: a loaded momentum buffer is past its first step."""
    torch.manual_seed(0)
    reference, mine = build(torch.nn), build(tg.nn)
    data = batches()
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.05, momentum=0.9, dampening=0.2)
    run(torch, reference, ref_opt, data, range(2), torch.nn.functional.mse_loss)
    copy_weights(reference, mine)
    my_opt = tg.optim.SGD(mine.parameters(), lr=0.05, momentum=0.9, dampening=0.2)
    my_opt.load_state_dict(ref_opt.state_dict())
    run(torch, reference, ref_opt, data, range(2, 5), torch.nn.functional.mse_loss)
    run(tg, mine, my_opt, data, range(2, 5), tg.nn.functional.mse_loss)
    assert_same_parameters(reference, mine, "SGD resumed from torch")


@pytest.mark.parametrize("label", ["SGD_nesterov_groups", "Adam_wd_amsgrad_groups", "RMSprop_centered_momentum"])
def test_eager_steps_build_their_graph_once_and_read_the_scheduled_lr(label: str,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from tensorgraphs.optim.optimizer import Optimizer
    from tensorgraphs.runtime import realize

    monkeypatch.setattr(realize, "_executables", type(realize._executables)())
    built: list[str] = []
    for builder in ("_step_graph", "_flat_graph"):
        original = getattr(Optimizer, builder)
        monkeypatch.setattr(Optimizer, builder, lambda self, *args, builder=builder, original=original:
                            built.append(builder) or original(self, *args))
    name, options, lrs = OPTIMIZERS[label]
    torch.manual_seed(0)
    reference, mine = build(torch.nn), build(tg.nn)
    copy_weights(reference, mine)
    data = batches(seed=3)
    ref_opt = getattr(torch.optim, name)(groups(reference, lrs), **options)
    my_opt = getattr(tg.optim, name)(groups(mine, lrs), **options)
    schedulers = [torch.optim.lr_scheduler.StepLR(ref_opt, 2, 0.5), tg.optim.lr_scheduler.StepLR(my_opt, 2, 0.5)]
    for lib, model, optimizer, scheduler in ((torch, reference, ref_opt, schedulers[0]),
                                             (tg, mine, my_opt, schedulers[1])):
        for step in range(STEPS):
            run(lib, model, optimizer, data, range(step, step + 1), lib.nn.functional.mse_loss)
            scheduler.step()
    assert_same_parameters(reference, mine, label)
    assert built == ["_flat_graph"]


@pytest.mark.parametrize("label", ["Adadelta_wd_groups", "Adamax_wd_maximize", "NAdam_wd", "RAdam"])
def test_compiled_optimizer_step_matches_torch(label: str) -> None:
    """The update traced once by tg.compile replays every step (step-dependent factors are graph values)."""
    reference, mine, my_opt, data = trained_reference(label)

    train_step = compiled_step(mine, my_opt)

    for x, y in data:
        train_step(x, y)
    assert sum(len(traces) for traces in train_step.traces.values()) == 1
    assert_same_parameters(reference, mine, f"compiled {label}")
