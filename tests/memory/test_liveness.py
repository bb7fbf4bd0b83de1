"""Liveness: each temporary lives from the kernel that writes it to the last kernel that reads it."""

from __future__ import annotations

from tensorgraphs.memory.liveness import naive_bytes, temporaries
from tensorgraphs.memory.order import order_for_memory
from tensorgraphs.schedule.fusion import Schedule


def test_intervals_span_first_write_to_last_read(handoff_schedule: Schedule) -> None:
    kernels, specs = handoff_schedule.kernels, handoff_schedule.buffers
    lifetimes = temporaries(handoff_schedule)
    assert [b.name for b in specs if b.role == "temp"] == [life.name for life in lifetimes]
    for life in lifetimes:
        users = [k for k, kernel in enumerate(kernels) if life.name in {b.name for b in kernel.buffers}]
        writers = [k for k in users if any(b.name == life.name and b.writes for b in kernels[k].buffers)]
        assert (life.start, life.end) == (min(users), max(users)) and writers[0] == life.start, life
        spec = next(b for b in specs if b.name == life.name)
        assert life.nbytes == spec.node.size * 4
    assert naive_bytes(lifetimes) == sum(life.nbytes for life in lifetimes) > 0


def test_overlap_is_inclusive_at_both_ends(handoff_schedule: Schedule) -> None:
    first, second, *_ = temporaries(handoff_schedule)
    assert first.end == second.start and first.overlaps(second) and second.overlaps(first)


def test_a_recomputed_value_counts_once_in_naive(two_layer_step: Schedule) -> None:
    """Recomputing adds temporaries holding values already counted: the naive bytes stay those of the schedule."""
    lifetimes = temporaries(order_for_memory(two_layer_step))
    copies = [life for life in lifetimes if life.copy_of is not None]
    naive = naive_bytes(temporaries(two_layer_step))
    assert copies and naive_bytes(lifetimes) == naive
    assert sum(life.nbytes for life in lifetimes) == naive + sum(life.nbytes for life in copies)
    sizes = {life.name: life.nbytes for life in lifetimes}
    assert all(sizes[life.copy_of] == life.nbytes for life in copies)
