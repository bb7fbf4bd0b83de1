"""Learning-rate schedules step for step against torch's (exact equality: same formulas, same float order)."""

from __future__ import annotations

import warnings
from typing import Any, Callable

import pytest
import torch

import tensorgraphs as tg

SCHEDULERS: dict[str, Callable[[Any, Any], Any]] = {
    "StepLR": lambda sched, opt: sched.StepLR(opt, step_size=3, gamma=0.5),
    "MultiStepLR": lambda sched, opt: sched.MultiStepLR(opt, milestones=[2, 5, 5, 9], gamma=0.5),
    "ExponentialLR": lambda sched, opt: sched.ExponentialLR(opt, gamma=0.9),
    "CosineAnnealingLR": lambda sched, opt: sched.CosineAnnealingLR(opt, T_max=7, eta_min=0.001),
    "LinearLR": lambda sched, opt: sched.LinearLR(opt, start_factor=0.25, total_iters=6),
    "LinearLR_decay": lambda sched, opt: sched.LinearLR(opt, start_factor=1.0, end_factor=0.1, total_iters=5),
    "LambdaLR": lambda sched, opt: sched.LambdaLR(opt, lambda epoch: 0.9**epoch / (1 + epoch)),
    "LambdaLR_per_group": lambda sched, opt: sched.LambdaLR(opt, [lambda e: 1.0 / (e + 1), lambda e: 0.5 * e]),
}


def lr_history(lib: Any, name: str, steps: int = 20) -> list[list[float]]:
    params = [lib.zeros(2, requires_grad=True), lib.zeros(3, requires_grad=True)]
    optimizer = lib.optim.SGD([{"params": params[:1]}, {"params": params[1:], "lr": 0.3}], lr=0.1)
    scheduler = SCHEDULERS[name](lib.optim.lr_scheduler, optimizer)
    history = [scheduler.get_last_lr()]
    for _ in range(steps):
        optimizer.step()
        scheduler.step()
        history.append(scheduler.get_last_lr())
        assert [g["lr"] for g in optimizer.param_groups] == history[-1]
    return history


@pytest.mark.parametrize("name", SCHEDULERS)
def test_schedule_equals_torch(name: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = lr_history(torch, name)
    assert lr_history(tg, name) == expected


def test_scheduler_state_dict_round_trip() -> None:
    optimizer = tg.optim.SGD([tg.zeros(2, requires_grad=True)], lr=1.0)
    scheduler = tg.optim.lr_scheduler.StepLR(optimizer, step_size=2)
    for _ in range(3):
        scheduler.step()
    state = scheduler.state_dict()
    fresh = tg.optim.lr_scheduler.StepLR(optimizer, step_size=2)
    fresh.load_state_dict(state)
    assert fresh.last_epoch == 3 and fresh.get_last_lr() == scheduler.get_last_lr()
