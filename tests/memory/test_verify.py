"""The verifier accepts the planner's plans and names the buffers of every unsafe one."""

from __future__ import annotations

import dataclasses

import pytest

from tensorgraphs.memory.packing import naive_plan, plan_memory
from tensorgraphs.memory.verify import MemoryPlanError, verify_plan
from tensorgraphs.schedule.fusion import Schedule


def test_planned_and_naive_plans_pass(handoff_schedule: Schedule) -> None:
    plan = plan_memory(handoff_schedule)
    verify_plan(handoff_schedule, plan)
    verify_plan(handoff_schedule, naive_plan(plan.lifetimes))


def test_live_buffers_sharing_bytes_are_caught(handoff_schedule: Schedule, graph_order_schedule: Schedule) -> None:
    plan = plan_memory(handoff_schedule)
    donor, output = plan.in_place[0]
    undeclared = dataclasses.replace(plan, in_place=[])
    with pytest.raises(MemoryPlanError, match=f"{donor} and {output} share bytes"):
        verify_plan(handoff_schedule, undeclared)
    separate = plan_memory(graph_order_schedule)  # the product lives on until the column sum, after exp
    assert len(set(separate.offsets.values())) == 2
    collided = dataclasses.replace(separate, offsets=dict.fromkeys(separate.offsets, 0))
    with pytest.raises(MemoryPlanError, match="share bytes while both are live"):
        verify_plan(graph_order_schedule, collided)


def test_handoff_declared_on_an_unsafe_pair_is_caught(handoff_schedule: Schedule) -> None:
    plan = plan_memory(handoff_schedule)
    donor, output = plan.in_place[0]
    reversed_pair = dataclasses.replace(plan, in_place=[(output, donor)])
    with pytest.raises(MemoryPlanError):
        verify_plan(handoff_schedule, reversed_pair)


def test_misplaced_offsets_are_caught(handoff_schedule: Schedule) -> None:
    plan = plan_memory(handoff_schedule)
    name = plan.lifetimes[0].name
    for offset in (plan.offsets[name] + 4, plan.arena_bytes, -64):
        with pytest.raises(MemoryPlanError, match=f"{name} .* placed at {offset}"):
            verify_plan(handoff_schedule, dataclasses.replace(plan, offsets={**plan.offsets, name: offset}))
