"""Offsets for every temporary in one arena: in-place handoffs first, then best-fit packing.

`plan_memory` pairs each output with an equal-sized input dying in the kernel
that creates it when the kernel allows it (`inplace`); `pack` makes each chain
of such pairs one group and places the groups one by one: a group goes into the
smallest gap between already placed groups live at the same time (best fit),
or after all of them. The placement order matters, so several orders are tried
and the smallest arena kept; on the transformer graphs the result equals the
bound `live_bytes`. `naive_plan` gives every temporary bytes of its own.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from tensorgraphs.memory.inplace import writes_in_place_safely
from tensorgraphs.memory.liveness import Lifetime, naive_bytes, temporaries
from tensorgraphs.schedule.fusion import Schedule

ALIGNMENT = 64
"""Every offset is a multiple of a cache line (and of every vector width the C compiler uses)."""


def aligned(nbytes: int) -> int:
    return -(-nbytes // ALIGNMENT) * ALIGNMENT


@dataclass
class ArenaPlan:
    """Where each temporary lives in the arena; `in_place` lists (donor, output) pairs sharing bytes.

    `live_bytes` is the most bytes live during any one kernel: no placement can use a smaller arena.
    """

    offsets: dict[str, int]
    arena_bytes: int
    naive_bytes: int
    live_bytes: int
    lifetimes: list[Lifetime]
    in_place: list[tuple[str, str]] = field(default_factory=list)

    def __str__(self) -> str:
        share = f"{100 * self.arena_bytes / self.naive_bytes:.1f}% of naive" if self.naive_bytes else "no temporaries"
        rows = [f"  {life.name}: [{self.offsets[life.name]}, +{life.nbytes}) kernels {life.start}..{life.end}"
                for life in sorted(self.lifetimes, key=lambda life: self.offsets[life.name])]
        handoffs = "".join(f"\n  {output} overwrites {donor}" for donor, output in self.in_place)
        return (f"memory: arena {self.arena_bytes} bytes, naive {self.naive_bytes} ({share}), "
                f"at least {self.live_bytes} live at once\n"
                + "\n".join(rows) + handoffs)


@dataclass
class _Group:
    """Temporaries that occupy the same bytes one after another (an in-place chain)."""

    names: list[str]
    nbytes: int
    start: int
    end: int
    offset: int = 0


def in_place_pairs(schedule: Schedule, lifetimes: list[Lifetime]) -> list[tuple[str, str]]:
    """(donor, output) pairs: a temporary written by the kernel where an equal-sized temporary input dies."""
    by_name = {life.name: life for life in lifetimes}
    taken: set[str] = set()
    pairs = []
    for position, kernel in enumerate(schedule.kernels):
        outputs = [b.name for b in kernel.buffers if b.writes and b.name in by_name
                   and by_name[b.name].start == position]
        for output in outputs:
            target = by_name[output]
            for buffer in kernel.buffers:
                donor = by_name.get(buffer.name)
                if (donor is not None and donor.name not in taken and donor.end == position
                        and donor.start < position and donor.nbytes == target.nbytes
                        and donor.dtype == target.dtype and writes_in_place_safely(kernel, donor.name, output)):
                    taken.add(donor.name)
                    pairs.append((donor.name, output))
                    break
    return pairs


def _groups(lifetimes: list[Lifetime], pairs: list[tuple[str, str]]) -> list[_Group]:
    by_name = {life.name: life for life in lifetimes}
    group_of = {life.name: _Group([life.name], aligned(life.nbytes), life.start, life.end) for life in lifetimes}
    for donor, output in pairs:  # in kernel order, so a chain grows at its end
        group = group_of[donor]
        group.names.append(output)
        group.end = max(group.end, by_name[output].end)
        group_of[output] = group
    unique = {id(g): g for g in group_of.values()}
    return list(unique.values())


def _live_bytes(groups: list[_Group]) -> int:
    """The largest total size of groups live during one kernel (a sweep over interval ends)."""
    events = sorted([(g.start, g.nbytes) for g in groups] + [(g.end + 1, -g.nbytes) for g in groups])
    live = peak = 0
    for _, change in events:  # at equal times the frees (negative) sort first
        live += change
        peak = max(peak, live)
    return peak


def _best_fit(groups: list[_Group], order: Callable[[_Group], tuple]) -> int:
    """Place `groups` in `order`, each in the smallest gap that fits among those live with it; the arena size."""
    placed: list[_Group] = []
    arena = 0
    for group in sorted(groups, key=order):
        live = sorted((p for p in placed if p.start <= group.end and group.start <= p.end), key=lambda p: p.offset)
        cursor, best, best_gap = 0, None, None
        for other in live:
            gap = other.offset - cursor
            if gap >= group.nbytes and (best_gap is None or gap < best_gap):
                best, best_gap = cursor, gap
            cursor = max(cursor, other.offset + other.nbytes)
        group.offset = cursor if best is None else best
        placed.append(group)
        arena = max(arena, group.offset + group.nbytes)
    return arena


ORDERS: dict[str, Callable[[_Group], tuple]] = {
    "largest first": lambda g: (-g.nbytes, g.start),
    "earliest first": lambda g: (g.start, -g.nbytes),
    "longest lived first": lambda g: (g.start - g.end, -g.nbytes),
}


def plan_memory(schedule: Schedule, reuse: bool = True) -> ArenaPlan:
    """Arena offsets for `schedule`'s temporaries, with in-place handoffs where a kernel allows them
    (`reuse=False`: the naive plan, every temporary in bytes of its own)."""
    lifetimes = temporaries(schedule)
    return pack(lifetimes, in_place_pairs(schedule, lifetimes)) if reuse else naive_plan(lifetimes)


def pack(lifetimes: list[Lifetime], pairs: list[tuple[str, str]]) -> ArenaPlan:
    """Best-fit offsets for `lifetimes` (each (donor, output) pair sharing bytes): the smallest arena over `ORDERS`."""
    groups = _groups(lifetimes, pairs)
    arena, offsets = 0, {}
    for order in ORDERS.values():
        size = _best_fit(groups, order)
        if not offsets or size < arena:
            arena, offsets = size, {name: g.offset for g in groups for name in g.names}
    return ArenaPlan(offsets, arena, naive_bytes(lifetimes), _live_bytes(groups), lifetimes, pairs)


def naive_plan(lifetimes: list[Lifetime]) -> ArenaPlan:
    """Every temporary in bytes of its own, one after another (the baseline, and unplanned execution)."""
    offsets, cursor = {}, 0
    for life in lifetimes:
        offsets[life.name] = cursor
        cursor += aligned(life.nbytes)
    return ArenaPlan(offsets, cursor, naive_bytes(lifetimes), _live_bytes(_groups(lifetimes, [])), lifetimes)
