"""Offline packing: no two live temporaries share bytes, offsets are aligned, gaps are reused, the bound is met."""

from __future__ import annotations

import numpy as np
import pytest

from tensorgraphs.memory.liveness import Lifetime, temporaries
from tensorgraphs.memory.packing import (
    ALIGNMENT,
    FITS,
    ORDERS,
    _Group,
    _groups,
    in_place_pairs,
    live_bytes,
    live_profile,
    pack,
    place,
    plan_memory,
)
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
    lifetimes = random_lifetimes(seed)
    plan = pack(lifetimes, [])
    assert_disjoint_while_live(plan.offsets, lifetimes)
    assert all(offset % ALIGNMENT == 0 for offset in plan.offsets.values())
    assert plan.live_bytes <= plan.arena_bytes <= 1.5 * plan.live_bytes, f"seed {seed}"
    assert plan.arena_bytes < plan.naive_bytes


def random_lifetimes(seed: int, count: int = 40) -> list[Lifetime]:
    rng = np.random.default_rng(seed)
    lifetimes = []
    for i in range(count):
        start = int(rng.integers(0, 30))
        lifetimes.append(lifetime(f"t{i}", int(rng.integers(1, 5000)), start, start + int(rng.integers(0, 8))))
    return lifetimes


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("fit", FITS)
def test_every_placement_strategy_is_safe(order: str, fit: str) -> None:
    for seed in range(10):
        lifetimes = random_lifetimes(seed)
        groups = _groups(lifetimes, [])
        arena = place(groups, ORDERS[order], FITS[fit])
        offsets = {g.names[0]: g.offset for g in groups}
        assert_disjoint_while_live(offsets, lifetimes)
        assert max(offsets[life.name] + life.nbytes for life in lifetimes) <= arena, (order, fit, seed)


def test_best_fit_and_first_fit_choose_different_gaps() -> None:
    """Holes of 4096 (lower) and 1024 bytes: 1000 bytes go into the small hole by best fit, the low one by first."""
    lifetimes = [lifetime("big_hole", 4096, 0, 1), lifetime("keep", 64, 0, 9), lifetime("small_hole", 1024, 0, 1),
                 lifetime("pinned", 8192, 0, 9), lifetime("later", 1000, 2, 9)]
    by_start = lambda g: (g.start, g.names[0] == "later")  # noqa: E731  (the holes first, in the listed order)
    chosen = {}
    for fit in FITS:
        groups = _groups(lifetimes, [])
        place(groups, by_start, FITS[fit])
        offsets = {g.names[0]: g.offset for g in groups}
        chosen[fit] = next(name for name in ("big_hole", "small_hole") if offsets[name] == offsets["later"])
    assert chosen == {"best fit": "small_hole", "first fit": "big_hole"}


def live_profile_of(groups: list[_Group]) -> list[int]:
    """Live bytes per kernel, by brute force."""
    end = max(g.end for g in groups)
    return [sum(g.nbytes for g in groups if g.start <= t <= g.end) for t in range(end + 1)]


def test_largest_first_packs_tighter_on_average() -> None:
    """The measurement behind `ORDERS`' order: offline, placing the largest first wastes least."""
    waste = {name: 0.0 for name in ORDERS}
    for seed in range(20):
        groups = _groups(random_lifetimes(seed, 120), [])
        bound = max(live_profile_of(groups))
        for name, order in ORDERS.items():
            waste[name] += place(groups, order, FITS["best fit"]) / bound - 1
    assert min(waste, key=waste.__getitem__) == "largest first", waste


def test_live_profile_matches_brute_force(two_layer_step: Schedule) -> None:
    lifetimes = temporaries(two_layer_step)
    profile = live_profile(two_layer_step)
    assert list(profile) == live_profile_of(_groups(lifetimes, in_place_pairs(two_layer_step, lifetimes)))
    assert live_bytes(two_layer_step) == profile.max() == plan_memory(two_layer_step).live_bytes


def test_schedule_plan_hands_the_dying_product_to_exp(handoff_schedule: Schedule) -> None:
    plan = plan_memory(handoff_schedule)
    ((donor, output),) = plan.in_place
    assert plan.offsets[donor] == plan.offsets[output]
    product, exp = (next(b for b in handoff_schedule.buffers if b.name == name).node for name in (donor, output))
    assert product.size == exp.size and plan.arena_bytes < plan.naive_bytes
