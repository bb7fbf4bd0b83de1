"""Liveness of a schedule's temporary buffers over its kernel order.

A temporary lives from the first kernel that touches it (which must write it) to
the last kernel that reads it, both inclusive: two temporaries may share bytes
only when their intervals are disjoint, or when one kernel hands a dying input's
bytes to its output (`inplace`). A temporary holding a value that another
temporary already holds (`recompute`: made again later instead of kept) is a
copy: the naive count, every value in bytes of its own, counts it once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Collection

import numpy as np

from tensorgraphs.dtypes import DType
from tensorgraphs.schedule.fusion import Schedule


@dataclass(frozen=True)
class Lifetime:
    """One temporary: its byte size and the kernels [start, end] during which its bytes must be kept;
    `copy_of` names the temporary holding the same value first, if any."""

    name: str
    nbytes: int
    dtype: np.dtype
    start: int
    end: int
    copy_of: str | None = None

    def overlaps(self, other: Lifetime) -> bool:
        return self.start <= other.end and other.start <= self.end


def temporaries(schedule: Schedule, kept: Collection[str] = ()) -> list[Lifetime]:
    """Every temporary buffer of `schedule` with its live interval (a buffer no kernel touches lives nowhere); the
    `kept` ones live over every kernel, so that what one run left in them is still there at the next
    (`schedule.prepared`)."""
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    for position, kernel in enumerate(schedule.kernels):
        for buffer in kernel.buffers:
            first.setdefault(buffer.name, position)
            last[buffer.name] = position
    for name in kept:
        first[name], last[name] = 0, len(schedule.kernels) - 1
    lifetimes = []
    first_holder: dict[int, str] = {}  # id of the node (nodes are hash-consed) -> the temporary holding it first
    storage: dict[DType, np.dtype] = {}
    for spec in schedule.buffers:
        if spec.role != "temp":
            continue
        dtype = storage.get(spec.node.dtype) or storage.setdefault(spec.node.dtype, np.dtype(spec.node.dtype.storage))
        copy_of = first_holder.setdefault(id(spec.node), spec.name)
        lifetimes.append(Lifetime(spec.name, spec.node.size * dtype.itemsize, dtype, first.get(spec.name, -1),
                                  last.get(spec.name, -1), None if copy_of == spec.name else copy_of))
    return lifetimes


def naive_bytes(lifetimes: list[Lifetime]) -> int:
    """What the temporaries take without any reuse: the sum of their sizes, each value counted once (so
    recomputing a value never makes the naive count, and the share of it the arena takes, look better)."""
    return sum(life.nbytes for life in lifetimes if life.copy_of is None)
