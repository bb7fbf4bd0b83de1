"""The verifier: proves an `ArenaPlan` safe for its schedule, from the schedule alone.

Checked: every temporary has an aligned offset inside the arena; the first kernel
touching a temporary writes it; and any two temporaries whose bytes overlap are
never live at the same time, except a declared in-place handoff (same bytes,
the donor dies in the kernel that creates the output, and that kernel passes
`writes_in_place_safely`). Liveness is recomputed here, not taken from the plan.
"""

from __future__ import annotations

from typing import Collection

from tensorgraphs.errors import TGError
from tensorgraphs.memory.inplace import writes_in_place_safely
from tensorgraphs.memory.liveness import Lifetime, temporaries
from tensorgraphs.memory.packing import ALIGNMENT, ArenaPlan
from tensorgraphs.schedule.fusion import Schedule


class MemoryPlanError(TGError, AssertionError):
    """A memory plan would let one buffer overwrite another that is still needed (a bug in tensorgraphs)."""


def verify_plan(schedule: Schedule, plan: ArenaPlan, kept: Collection[str] = ()) -> None:
    """Raise `MemoryPlanError` naming the buffers and kernels if `plan` is unsafe for `schedule` (whose `kept`
    buffers must hold their values from one run to the next: `temporaries`)."""
    lifetimes = [life for life in temporaries(schedule, kept) if life.nbytes > 0]
    first_touch: dict[str, int] = {}
    for position, kernel in enumerate(schedule.kernels):
        for buffer in kernel.buffers:
            first_touch.setdefault(buffer.name, position)
    for life in lifetimes:
        _check_placement(schedule, plan, life, first_touch.get(life.name, life.start))
    handoffs = set(plan.in_place)
    by_offset = sorted(lifetimes, key=lambda life: plan.offsets[life.name])
    for i, first in enumerate(by_offset):
        first_end = plan.offsets[first.name] + first.nbytes
        for second in by_offset[i + 1:]:
            if plan.offsets[second.name] >= first_end:
                break
            if first.overlaps(second) and not _handoff(schedule, plan, handoffs, first, second):
                raise MemoryPlanError(f"memory plan: {first.name} and {second.name} share bytes while both are live "
                                      f"(kernels {first.start}..{first.end} and {second.start}..{second.end})")


def _check_placement(schedule: Schedule, plan: ArenaPlan, life: Lifetime, first_touch: int) -> None:
    offset = plan.offsets.get(life.name)
    if offset is None or offset % ALIGNMENT or offset < 0 or offset + life.nbytes > plan.arena_bytes:
        raise MemoryPlanError(f"memory plan: {life.name} ({life.nbytes} bytes) placed at {offset}, "
                              f"not {ALIGNMENT}-aligned inside the {plan.arena_bytes}-byte arena")
    first_kernel = schedule.kernels[first_touch]
    if not any(b.name == life.name and b.writes for b in first_kernel.buffers):
        raise MemoryPlanError(f"memory plan: {life.name} is read by kernel {first_kernel.name} before any kernel "
                              "writes it")


def _handoff(schedule: Schedule, plan: ArenaPlan, handoffs: set[tuple[str, str]], a: Lifetime, b: Lifetime) -> bool:
    donor, output = (a, b) if a.start < b.start else (b, a)
    return ((donor.name, output.name) in handoffs and plan.offsets[donor.name] == plan.offsets[output.name]
            and donor.nbytes == output.nbytes and donor.end == output.start
            and writes_in_place_safely(schedule.kernels[output.start], donor.name, output.name))
