"""A kernel order that keeps fewer temporary bytes live at once.

The scheduler emits kernels in graph order. Any order that respects each
buffer's accesses computes the same values: a kernel stays after the last
kernel that wrote a buffer it touches, and a writer stays after the readers of
the value it overwrites. Among the kernels whose predecessors have run, the
greedy pass runs the one that grows the live temporaries least (new bytes minus
bytes it frees). It is kept only when its arena is smaller than the original's.
"""

from __future__ import annotations

import dataclasses

from tensorgraphs.codegen.loop_ir import Kernel
from tensorgraphs.memory.liveness import temporaries
from tensorgraphs.memory.packing import plan_memory
from tensorgraphs.schedule.fusion import Schedule


def kernel_dependencies(kernels: list[Kernel]) -> list[set[int]]:
    """For each kernel, the earlier kernels it must follow (read after write, write after read or write)."""
    predecessors: list[set[int]] = [set() for _ in kernels]
    last_writer: dict[str, int] = {}
    readers: dict[str, set[int]] = {}
    for position, kernel in enumerate(kernels):
        for buffer in kernel.buffers:
            if buffer.name in last_writer:
                predecessors[position].add(last_writer[buffer.name])
            if buffer.writes:
                predecessors[position] |= readers.pop(buffer.name, set())
                last_writer[buffer.name] = position
            else:
                readers.setdefault(buffer.name, set()).add(position)
        predecessors[position].discard(position)
    return predecessors


def greedy_order(schedule: Schedule) -> list[int]:
    """Kernel positions in an order that respects `kernel_dependencies`, smallest growth of live bytes first."""
    kernels = schedule.kernels
    size = {life.name: life.nbytes for life in temporaries(schedule)}
    pending_uses: dict[str, int] = {}
    for kernel in kernels:
        for buffer in kernel.buffers:
            if buffer.name in size:
                pending_uses[buffer.name] = pending_uses.get(buffer.name, 0) + 1
    predecessors = kernel_dependencies(kernels)
    successors: list[list[int]] = [[] for _ in kernels]
    for position, before in enumerate(predecessors):
        for earlier in before:
            successors[earlier].append(position)
    waiting = [len(before) for before in predecessors]
    allocated: set[str] = set()

    def growth(position: int) -> int:
        names = [b.name for b in kernels[position].buffers if b.name in size]
        return (sum(size[n] for n in names if n not in allocated)
                - sum(size[n] for n in names if pending_uses[n] == 1))

    order: list[int] = []
    ready = [position for position, count in enumerate(waiting) if count == 0]
    while ready:
        chosen = min(ready, key=lambda position: (growth(position), position))
        ready.remove(chosen)
        order.append(chosen)
        for buffer in kernels[chosen].buffers:
            if buffer.name in size:
                allocated.add(buffer.name)
                pending_uses[buffer.name] -= 1
        for later in successors[chosen]:
            waiting[later] -= 1
            if waiting[later] == 0:
                ready.append(later)
    return order


def order_for_memory(schedule: Schedule) -> Schedule:
    """`schedule` with its kernels reordered by `greedy_order` when that makes the arena smaller."""
    order = greedy_order(schedule)
    if order == list(range(len(schedule.kernels))):
        return schedule
    reordered = dataclasses.replace(schedule, kernels=[schedule.kernels[i] for i in order])
    return reordered if plan_memory(reordered).arena_bytes < plan_memory(schedule).arena_bytes else schedule
