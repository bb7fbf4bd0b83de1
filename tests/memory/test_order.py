"""Kernel reordering: a permutation that respects every buffer access and keeps fewer bytes live."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Callable

import numpy as np
import pytest

import tensorgraphs as tg
from tensorgraphs.memory.liveness import Lifetime
from tensorgraphs.memory.order import greedy_order, kernel_dependencies, order_for_memory, sink_order
from tensorgraphs.memory.packing import live_bytes, plan_memory
from tensorgraphs.memory.verify import verify_plan
from tensorgraphs.schedule.fusion import Schedule, schedule_kernels

if TYPE_CHECKING:
    from conftest import TransformerStep  # tests/memory/conftest.py


def two_branches() -> Schedule:
    """Two independent chains of materialized exp(x@w) feeding matmuls, summed at the end."""
    rng = np.random.default_rng(0)
    x, w = (tg.tensor(rng.normal(size=(32, 32)).astype(np.float32)) for _ in range(2))
    branches = [((x @ w) * scale).exp() @ w for scale in (0.1, 0.2, 0.3)]
    return schedule_kernels([(branches[0] + branches[1] + branches[2]).node])


def test_dependencies_follow_the_buffers(graph_order_schedule: Schedule) -> None:
    """Here every buffer is written once: a kernel follows exactly the writers of what it reads."""
    kernels = graph_order_schedule.kernels
    writer = {b.name: i for i, k in enumerate(kernels) for b in k.buffers if b.writes}
    predecessors = kernel_dependencies(kernels)
    for position, kernel in enumerate(kernels):
        assert predecessors[position] == {writer[b.name] for b in kernel.buffers if b.name in writer} - {position}
    independent = [(a, b) for b in range(len(kernels)) for a in range(b) if a not in predecessors[b]]
    assert independent, "the column sum and the exp chain do not depend on each other"


def test_running_the_sum_first_lets_exp_overwrite_the_product(graph_order_schedule: Schedule,
                                                              handoff_schedule: Schedule) -> None:
    before, after = plan_memory(graph_order_schedule), plan_memory(handoff_schedule)
    assert before.in_place == [] and len(after.in_place) == 1
    assert after.arena_bytes < before.arena_bytes == before.naive_bytes


@pytest.mark.parametrize("build", [two_branches, lambda: schedule_kernels([(tg.ones(4) * 2).node])])
def test_greedy_order_is_a_valid_permutation(build) -> None:  # noqa: ANN001
    schedule = build()
    order = greedy_order(schedule)
    assert sorted(order) == list(range(len(schedule.kernels)))
    position = {kernel: i for i, kernel in enumerate(order)}
    for kernel, before in enumerate(kernel_dependencies(schedule.kernels)):
        assert all(position[earlier] < position[kernel] for earlier in before)


def test_reordering_keeps_or_shrinks_the_arena() -> None:
    schedule = two_branches()
    reordered = order_for_memory(schedule)
    assert plan_memory(reordered).arena_bytes <= plan_memory(schedule).arena_bytes
    assert sorted(map(id, reordered.kernels)) == sorted(map(id, schedule.kernels))


def test_sink_order_moves_creators_down_and_never_grows_the_peak(two_layer_step: Schedule) -> None:
    """On a training step the sunk order is a valid order whose peak is never above the greedy one's (the
    synthetic case below shows a kernel moving)."""
    greedy = greedy_order(two_layer_step)
    sunk = sink_order(two_layer_step, greedy)
    assert sorted(sunk) == list(range(len(two_layer_step.kernels)))
    position = {kernel: i for i, kernel in enumerate(sunk)}
    for kernel, before in enumerate(kernel_dependencies(two_layer_step.kernels)):
        assert all(position[earlier] < position[kernel] for earlier in before)
    in_order = lambda order: dataclasses.replace(two_layer_step,  # noqa: E731
                                                 kernels=[two_layer_step.kernels[i] for i in order])
    assert live_bytes(in_order(sunk)) <= live_bytes(in_order(greedy))


def test_sink_order_moves_a_kernel_that_creates_more_than_it_keeps() -> None:
    """An outer product of two inputs (it frees nothing) made first and read last: it moves to just before its
    reader; the tanh chain (each kernel frees what it creates) stays where it is."""
    rng = np.random.default_rng(1)
    x, w = (tg.tensor(rng.normal(size=(32, 32)).astype(np.float32)) for _ in range(2))
    u, v = (tg.tensor(rng.normal(size=(32, 1)).astype(np.float32)) for _ in range(2))
    chain = x
    for _ in range(3):
        chain = (chain @ w).tanh()
    schedule = schedule_kernels([((u * v.T).exp() @ w + chain @ w).node])
    (outer,) = [i for i, kernel in enumerate(schedule.kernels) if "exp" in kernel.name]
    (reader,) = [i for i, before in enumerate(kernel_dependencies(schedule.kernels)) if outer in before]
    sunk = sink_order(schedule, list(range(len(schedule.kernels))))
    assert outer < reader - 1 and sunk.index(outer) == sunk.index(reader) - 1
    assert [k for k in sunk if k != outer] == [k for k in range(len(schedule.kernels)) if k != outer]
    in_order = lambda order: dataclasses.replace(schedule, kernels=[schedule.kernels[i] for i in order])  # noqa: E731
    assert live_bytes(in_order(sunk)) < live_bytes(schedule)
    assert sink_order(schedule, sunk) == sunk  # a fixed point: nothing left to move


def test_memory_planning_work_grows_linearly_with_depth(transformer_step: Callable[[int], TransformerStep],
                                                       count_calls: Callable) -> None:
    """Ordering, recomputing, packing and verifying make a fixed number of passes over the kernels' buffers
    (about 11 buffer lifetimes computed per kernel when written), however deep the model: a pass per kernel
    or per candidate would multiply the lifetimes per kernel by the depth."""
    lifetimes = count_calls(Lifetime, "__init__")
    per_kernel = []
    for layers in (1, 4):
        schedule = transformer_step(layers).schedule()
        lifetimes.clear()
        ordered = order_for_memory(schedule)
        verify_plan(ordered, plan_memory(ordered))
        per_kernel.append(lifetimes["__init__"] / len(schedule.kernels))
    assert 0 < per_kernel[1] <= 1.25 * per_kernel[0], per_kernel
