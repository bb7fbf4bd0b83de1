"""Kernel reordering: a permutation that respects every buffer access and never grows the arena."""

from __future__ import annotations

import numpy as np
import pytest

import tensorgraphs as tg
from tensorgraphs.memory.order import greedy_order, kernel_dependencies, order_for_memory
from tensorgraphs.memory.packing import plan_memory
from tensorgraphs.schedule.fusion import Schedule, schedule_kernels


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
