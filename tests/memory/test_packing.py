"""Best-fit packing: no two live temporaries share bytes, offsets are aligned, gaps are reused."""

from __future__ import annotations

import numpy as np
import pytest

from tensorgraphs.memory.liveness import Lifetime
from tensorgraphs.memory.packing import ALIGNMENT, pack, plan_memory
from tensorgraphs.schedule.fusion import Schedule

FLOAT = np.dtype(np.float32)


def lifetime(name: str, nbytes: int, start: int, end: int) -> Lifetime:
    return Lifetime(name, nbytes, FLOAT, start, end)


def assert_disjoint_while_live(offsets: dict[str, int], lifetimes: list[Lifetime]) -> None:
    for i, a in enumerate(lifetimes):
        for b in lifetimes[i + 1:]:
            if a.overlaps(b):
                apart = offsets[a.name] + a.nbytes <= offsets[b.name] or offsets[b.name] + b.nbytes <= offsets[a.name]
                assert apart, (a, b, offsets)


def test_best_fit_takes_the_smallest_gap_that_fits() -> None:
    """A long-lived buffer between two freed holes: the later buffer goes into the hole it fits best."""
    lifetimes = [lifetime("big_hole", 4096, 0, 1), lifetime("keep", 64, 0, 9), lifetime("small_hole", 1024, 0, 1),
                 lifetime("pinned", 8192, 0, 9), lifetime("later", 1000, 2, 9)]
    plan = pack(lifetimes, [])
    assert_disjoint_while_live(plan.offsets, lifetimes)
    assert plan.offsets["later"] in (plan.offsets["small_hole"], plan.offsets["big_hole"])
    assert plan.arena_bytes == plan.live_bytes == 4096 + 1024 + 8192 + 64
    assert plan.naive_bytes == 4096 + 64 + 1024 + 8192 + 1000


@pytest.mark.parametrize("seed", range(20))
def test_random_lifetimes_pack_safely_and_near_the_bound(seed: int) -> None:
    rng = np.random.default_rng(seed)
    lifetimes = []
    for i in range(40):
        start = int(rng.integers(0, 30))
        lifetimes.append(lifetime(f"t{i}", int(rng.integers(1, 5000)), start, start + int(rng.integers(0, 8))))
    plan = pack(lifetimes, [])
    assert_disjoint_while_live(plan.offsets, lifetimes)
    assert all(offset % ALIGNMENT == 0 for offset in plan.offsets.values())
    assert plan.live_bytes <= plan.arena_bytes <= 1.5 * plan.live_bytes, f"seed {seed}"
    assert plan.arena_bytes < plan.naive_bytes


def test_schedule_plan_hands_the_dying_product_to_exp(handoff_schedule: Schedule) -> None:
    plan = plan_memory(handoff_schedule)
    ((donor, output),) = plan.in_place
    assert plan.offsets[donor] == plan.offsets[output]
    product, exp = (next(b for b in handoff_schedule.buffers if b.name == name).node for name in (donor, output))
    assert product.size == exp.size and plan.arena_bytes < plan.naive_bytes
