"""Eager optimizer steps over flat storage (`optim.flat`): the same values as torch whatever the user does to the
parameters and the state between steps, and one program over a few arrays per param group."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest
import torch
from test_optimizers import (
    OPTIMIZERS,
    assert_same_parameters,
    batches,
    build,
    compiled_step,
    copy_weights,
    groups,
    run,
)

import tensorgraphs as tg
from tensorgraphs.optim.optimizer import Optimizer
from tensorgraphs.runtime import realize

Between = Callable[[Any, Any, Any, int], None]
"""What the user does after step `i` (lib, model, optimizer, i), in torch and in tg alike."""


def train_both(name: str, options: dict[str, Any], lrs: tuple[float, float] | None, between: Between,
               steps: int = 5) -> tuple[torch.nn.Module, tg.nn.Module, Any, Any]:
    torch.manual_seed(0)
    reference, mine = build(torch.nn), build(tg.nn)
    copy_weights(reference, mine)
    data = batches(seed=5)
    optimizers = [getattr(lib.optim, name)(groups(model, lrs), **options)
                  for lib, model in ((torch, reference), (tg, mine))]
    for lib, model, optimizer in zip((torch, tg), (reference, mine), optimizers):
        for step in range(steps):
            run(lib, model, optimizer, data, range(step, step + 1), lib.nn.functional.mse_loss)
            between(lib, model, optimizer, step)
    return reference, mine, optimizers[0], optimizers[1]


def count_builds(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    """(builder, number of inputs) of every optimizer step graph built from now on (a fresh executable cache)."""
    monkeypatch.setattr(realize, "_executables", type(realize._executables)())
    built: list[tuple[str, int]] = []
    for builder in ("_step_graph", "_flat_graph"):
        original = getattr(Optimizer, builder)

        def counted(self: Optimizer, *args: Any, builder: str = builder, original: Any = original) -> Any:
            roots, inputs, outputs = original(self, *args)
            built.append((builder, len(inputs)))
            return roots, inputs, outputs

        monkeypatch.setattr(Optimizer, builder, counted)
    return built


@pytest.mark.parametrize("label", OPTIMIZERS)
def test_every_optimizer_steps_flat_in_one_program_of_a_few_arrays(label: str,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    built = count_builds(monkeypatch)
    name, options, lrs = OPTIMIZERS[label]
    reference, mine, ref_opt, my_opt = train_both(name, options, lrs, lambda *_: None)
    assert_same_parameters(reference, mine, label)
    per_group = 3 + len(my_opt.state[next(iter(my_opt.state))])  # parameters, gradients, lr and each state key
    assert built == [("_flat_graph", per_group * len(my_opt.param_groups))]
    for expected, mine_p in zip(ref_opt.state.values(), mine.parameters()):
        for key, value in expected.items():
            want = value.detach().numpy()  # compared at the state's scale: its small entries are differences
            np.testing.assert_allclose(np.asarray(my_opt.state[mine_p][key].numpy(), np.float64), want, rtol=1e-5,
                                       atol=1e-6 * np.abs(want).max(), err_msg=f"{label} {key}")


def test_a_parameter_written_in_place_is_seen_by_the_next_step() -> None:
    """In-place writes under no_grad, through `.data`, and a whole new `.data`, between steps."""

    def between(lib: Any, model: Any, optimizer: Any, step: int) -> None:
        with lib.no_grad():
            if step == 0:
                model[0].weight.mul_(0.5)
            elif step == 1:
                model[2].bias.data.add_(1.0)
            elif step == 2:
                model[0].bias.data = lib.ones(6) * 0.25

    reference, mine, _, _ = train_both("AdamW", {"lr": 0.01}, None, between)
    assert_same_parameters(reference, mine, "AdamW with in-place writes")


def test_the_step_is_seen_through_views_taken_before_it() -> None:
    """Views of a parameter (`.data`, `detach()`) and state entries read before a step show its new values."""
    model = build(tg.nn)
    optimizer = tg.optim.Adam(model.parameters(), lr=0.1)
    data = batches()
    run(tg, model, optimizer, data, range(1), tg.nn.functional.mse_loss)
    weight = model[0].weight
    views = [weight.data, weight.detach()]
    exp_avg = optimizer.state[weight]["exp_avg"]
    before = exp_avg.numpy()
    run(tg, model, optimizer, data, range(1, 2), tg.nn.functional.mse_loss)
    for view in views:
        np.testing.assert_array_equal(view.numpy(), weight.detach().numpy())
    assert optimizer.state[weight]["exp_avg"] is exp_avg
    assert not np.array_equal(exp_avg.numpy(), before)


def test_state_written_in_place_is_seen_by_the_next_step() -> None:
    def between(lib: Any, model: Any, optimizer: Any, step: int) -> None:
        if step == 1:
            optimizer.state[model[0].weight]["exp_avg"].zero_()
            optimizer.state[model[2].bias]["exp_avg_sq"].mul_(4.0)
        if step == 2:  # one parameter's step count: the others' stay as they are
            optimizer.state[model[2].weight]["step"].add_(3.0)

    reference, mine, _, _ = train_both("Adam", {"lr": 0.01}, None, between)
    assert_same_parameters(reference, mine, "Adam with state written in place")


def test_parameters_without_gradients_and_groups_added_later() -> None:
    """A step where one parameter has no gradient (its step count falls behind: per-parameter steps from then on),
    then a param group added between steps."""
    torch.manual_seed(0)
    reference, mine = build(torch.nn), build(tg.nn)
    copy_weights(reference, mine)
    data = batches(seed=2)
    for lib, model in ((torch, reference), (tg, mine)):
        params = [p for name, p in model.named_parameters() if name != "2.bias"]
        optimizer = lib.optim.Adam(params, lr=0.02)
        for step in range(5):
            optimizer.zero_grad()
            lib.nn.functional.mse_loss(model(lib.tensor(data[step][0])), lib.tensor(data[step][1])).backward()
            if step == 1:
                model[0].bias.grad = None
            optimizer.step()
            if step == 2:
                optimizer.add_param_group({"params": [model[2].bias], "lr": 0.05, "weight_decay": 0.1})
    assert_same_parameters(reference, mine, "Adam, a gradient missing, a group added")


def test_state_dict_round_trip_through_a_file(tmp_path: Path) -> None:
    """Stop after 3 flat steps, save the optimizer's state with tg.save, load it into a fresh optimizer, go on."""
    torch.manual_seed(0)
    reference, mine = build(torch.nn), build(tg.nn)
    copy_weights(reference, mine)
    data = batches()
    lrs = (0.02, 0.01)
    ref_opt = torch.optim.AdamW(groups(reference, lrs), lr=0.01, weight_decay=0.1)
    run(torch, reference, ref_opt, data, range(6), torch.nn.functional.mse_loss)
    first = tg.optim.AdamW(groups(mine, lrs), lr=0.01, weight_decay=0.1)
    run(tg, mine, first, data, range(3), tg.nn.functional.mse_loss)
    saved = first.state_dict()
    tg.save({"state": {str(k): v for k, v in saved["state"].items()}}, tmp_path / "optimizer.safetensors")
    loaded = tg.load(tmp_path / "optimizer.safetensors")
    second = tg.optim.AdamW(groups(mine, lrs), lr=0.5)
    second.load_state_dict({"state": {int(k): v for k, v in loaded["state"].items()},
                            "param_groups": saved["param_groups"]})
    live = second.state_dict()["state"]  # torch's state_dict holds the live state: later steps show in it
    for number, entries in saved["state"].items():
        for key, value in entries.items():
            np.testing.assert_array_equal(second.state_dict()["state"][number][key].numpy(), value.numpy())
    run(tg, mine, second, data, range(3, 6), tg.nn.functional.mse_loss)
    assert_same_parameters(reference, mine, "AdamW resumed from a file")
    for number, expected in ref_opt.state_dict()["state"].items():
        for key, value in expected.items():
            np.testing.assert_allclose(live[number][key].numpy(), value.numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("order", ["eager first", "compiled first"])
def test_eager_and_compiled_steps_of_one_optimizer(order: str) -> None:
    """Flat state read and written by a compiled step (a trace of the per-parameter update), and the other way."""
    torch.manual_seed(0)
    reference, mine = build(torch.nn), build(tg.nn)
    copy_weights(reference, mine)
    data = batches()
    ref_opt = torch.optim.Adam(reference.parameters(), lr=0.01)
    run(torch, reference, ref_opt, data, range(6), torch.nn.functional.mse_loss)
    optimizer = tg.optim.Adam(mine.parameters(), lr=0.01)

    step = compiled_step(mine, optimizer)

    compiled = range(2, 6) if order == "eager first" else range(3)
    for index in range(6):
        if index in compiled:
            step(tg.tensor(data[index][0]), tg.tensor(data[index][1]))
        else:
            run(tg, mine, optimizer, data, range(index, index + 1), tg.nn.functional.mse_loss)
    assert_same_parameters(reference, mine, order)
    for expected, state in zip(ref_opt.state.values(), optimizer.state.values()):
        for key, value in expected.items():
            np.testing.assert_allclose(state[key].numpy(), value.numpy(), rtol=1e-5, atol=1e-6, err_msg=key)


@pytest.mark.parametrize("name", ["SGD", "Adam", "AdamW", "RMSprop"])
def test_a_compiled_flat_step_is_one_kernel_per_group_storing_parameters_and_state(
        name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Large enough to be compiled (not interpreted): per group, one kernel over the flat vector stores the
    parameters and every per-element state array, and one more the step count."""
    count_builds(monkeypatch)
    model = tg.nn.Sequential(tg.nn.Linear(128, 256), tg.nn.Tanh(), tg.nn.Linear(256, 8))
    options = {"momentum": 0.9} if name == "SGD" else {}
    optimizer = getattr(tg.optim, name)(groups(model, (0.1, 0.2)), lr=0.01, **options)
    x = tg.tensor(np.ones((4, 128), np.float32))
    for _ in range(2):
        optimizer.zero_grad()
        model(x).sum().backward()
        optimizer.step()
    (prepared,) = [run for key, (run, _) in realize._executables.items() if key[2][0] == "flat optimizer step"]
    assert prepared._program is not None, "interpreted: the test's model is too small to be compiled"
    stores = sorted(sum(b.writes for b in kernel.buffers) for kernel in prepared._program.kernels)
    per_element = 1 + sum(v.ndim > 0 for v in optimizer.state[model[0].weight].values())
    assert stores == [1, 1, per_element, per_element], stores
