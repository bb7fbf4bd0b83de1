"""Liveness of a schedule's temporary buffers over its kernel order.

A temporary lives from the first kernel that touches it (which must write it) to
the last kernel that reads it, both inclusive: two temporaries may share bytes
only when their intervals are disjoint, or when one kernel hands a dying input's
bytes to its output (`inplace`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tensorgraphs.schedule.fusion import Schedule


@dataclass(frozen=True)
class Lifetime:
    """One temporary: its byte size and the kernels [start, end] during which its bytes must be kept."""

    name: str
    nbytes: int
    dtype: np.dtype
    start: int
    end: int

    def overlaps(self, other: Lifetime) -> bool:
        return self.start <= other.end and other.start <= self.end


def temporaries(schedule: Schedule) -> list[Lifetime]:
    """Every temporary buffer of `schedule` with its live interval (a buffer no kernel touches lives nowhere)."""
    touched: dict[str, list[int]] = {}
    for position, kernel in enumerate(schedule.kernels):
        for buffer in kernel.buffers:
            touched.setdefault(buffer.name, []).append(position)
    lifetimes = []
    for spec in schedule.buffers:
        if spec.role != "temp":
            continue
        dtype = np.dtype(spec.node.dtype.storage)
        uses = touched.get(spec.name, [-1])
        lifetimes.append(Lifetime(spec.name, spec.node.size * dtype.itemsize, dtype, min(uses), max(uses)))
    return lifetimes


def naive_bytes(lifetimes: list[Lifetime]) -> int:
    """What the temporaries take without any reuse: the sum of their sizes."""
    return sum(life.nbytes for life in lifetimes)
