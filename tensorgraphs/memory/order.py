"""A kernel order that keeps fewer temporary bytes live at once.

The scheduler emits kernels in graph order. Any order that respects each
buffer's accesses computes the same values: a kernel stays after the last
kernel that wrote a buffer it touches, and a writer stays after the readers of
the value it overwrites. Two passes improve on graph order:

- `greedy_order`: among the kernels whose predecessors have run, run the one
  that grows the live temporaries least (new bytes minus bytes it frees);
- `sink_order`: then, latest kernel first, move each kernel that creates more
  temporary bytes than it keeps alive to just before its first consumer. A
  value only the backward pass reads (the attention probabilities the softmax
  gradient recomputes from saved scores) is then made when it is needed, not
  during the forward pass, where it would stay live across the peak.

`best_order` keeps whichever candidate order has the fewest bytes live at once;
`order_for_memory` then moves host calls that start or wait for asynchronous work
(`place_host_calls`: a collective proceeds while the kernels between run, and the
kernels a collective needs run before those it does not) and
recomputes what is cheap to make again rather than keep (`recompute`).
"""

from __future__ import annotations

import dataclasses

from tensorgraphs.codegen.loop_ir import HostCall, Kernel
from tensorgraphs.memory.liveness import temporaries
from tensorgraphs.memory.packing import live_bytes
from tensorgraphs.memory.recompute import recompute_for_memory
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


def _successors(predecessors: list[set[int]]) -> list[list[int]]:
    successors: list[list[int]] = [[] for _ in predecessors]
    for position, before in enumerate(predecessors):
        for earlier in before:
            successors[earlier].append(position)
    return successors


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
    successors = _successors(predecessors)
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


def sink_order(schedule: Schedule, order: list[int]) -> list[int]:
    """`order` with each kernel that creates more temporary bytes than it keeps alive moved to just before its
    first consumer, latest first (so a chain of such kernels moves down together).

    Every kernel it moves past then runs with the created bytes not yet live and at most the kept bytes
    (temporaries the moved kernel reads whose other uses all come earlier) live longer: fewer bytes live.
    """
    kernels = schedule.kernels
    size = {life.name: life.nbytes for life in temporaries(schedule)}
    users: dict[str, list[int]] = {}
    for position, kernel in enumerate(kernels):
        for name in {b.name for b in kernel.buffers if b.name in size}:
            users.setdefault(name, []).append(position)
    created: list[int] = [0] * len(kernels)  # bytes of the temporaries each kernel touches first (writes)
    touched: list[list[str]] = [[] for _ in kernels]  # the temporaries it touches that an earlier kernel made
    for name, positions in users.items():
        created[positions[0]] += size[name]
        for position in positions[1:]:
            touched[position].append(name)
    successors = _successors(kernel_dependencies(kernels))
    order = list(order)
    place = [0] * len(kernels)
    for at, kernel in enumerate(order):
        place[kernel] = at
    for kernel in sorted(range(len(kernels)), key=place.__getitem__, reverse=True):
        at = place[kernel]
        target = min((place[s] for s in successors[kernel]), default=len(order)) - 1
        if target <= at or not created[kernel]:
            continue
        kept = sum(size[name] for name in touched[kernel]
                   if max(place[user] for user in users[name] if user != kernel) < target)
        if created[kernel] > kept:
            order.insert(target, order.pop(at))
            for shifted in range(at, target + 1):
                place[order[shifted]] = shifted
    return order


def best_order(schedule: Schedule) -> Schedule:
    """`schedule` with its kernels in graph order, `greedy_order` or that improved by `sink_order`, whichever keeps
    the fewest bytes live at once (the first on ties)."""
    greedy = greedy_order(schedule)
    candidates = [dataclasses.replace(schedule, kernels=[schedule.kernels[i] for i in order])
                  for order in (range(len(schedule.kernels)), greedy, sink_order(schedule, greedy))]
    return min(candidates, key=live_bytes)


def _placement(kernel: Kernel) -> str:
    return next((stmt.placement for stmt in kernel.body if isinstance(stmt, HostCall)), "")


def _position(kernels: list[Kernel], kernel: Kernel) -> int:
    return next(i for i, k in enumerate(kernels) if k is kernel)


def place_host_calls(schedule: Schedule) -> Schedule:
    """`schedule` with each host call that starts asynchronous work ("early") moved up, with the kernels it depends
    on, as far as the ones before it allow (the kernels it does not depend on run after it), and each that waits
    for such work ("late") moved, with every kernel depending on it, to the end (keeping their order; one waiting
    for work started earlier first): the work proceeds while the kernels between run. The gradients of a
    data-parallel bucket are then computed, and its all-reduce started, before the backward kernels of later
    buckets. Both moves keep every dependency (what precedes a kernel moved up moves with it, what follows one
    moved down is moved too)."""
    kernels = list(schedule.kernels)
    if not any(_placement(k) for k in kernels):
        return schedule
    kernels = _start_early(kernels)
    predecessors = kernel_dependencies(kernels)
    late = [i for i, k in enumerate(kernels) if _placement(k) == "late"]
    # waited for in the order the work was started (the last of them, and what reads its result, at the end)
    for kernel in [kernels[i] for i in sorted(late, key=lambda i: max(predecessors[i], default=-1))]:
        successors = _successors(kernel_dependencies(kernels))
        start = _position(kernels, kernel)
        moved = {start}
        for position in range(start, len(kernels)):
            if position in moved:
                moved.update(successors[position])
        kernels = [k for i, k in enumerate(kernels) if i not in moved] + [kernels[i] for i in sorted(moved)]
    return dataclasses.replace(schedule, kernels=kernels)


def _start_early(kernels: list[Kernel]) -> list[Kernel]:
    """`kernels` with the "early" host calls in turn each preceded only by the kernels it depends on that no
    earlier one does (in their order), the other kernels after the last: each call comes right after the last
    kernel it depends on, and as early as the calls before it allow."""
    predecessors = kernel_dependencies(kernels)
    starts = [i for i, k in enumerate(kernels) if _placement(k) == "early"]
    group = [len(starts)] * len(kernels)  # the first early call depending on each kernel (len(starts): none)
    for number, start in enumerate(starts):
        stack = [start]
        while stack:
            position = stack.pop()
            if group[position] == len(starts):
                group[position] = number
                stack.extend(predecessors[position])
    return [kernels[i] for i in sorted(range(len(kernels)), key=lambda i: (group[i], i))]


def order_for_memory(schedule: Schedule) -> Schedule:
    """`best_order` of `schedule`, host calls placed for overlap, and the cheap temporaries that would stay live
    across its peak recomputed."""
    return recompute_for_memory(place_host_calls(best_order(schedule)))
