"""Preparations kept across calls: a kernel that `prepares` another kernel's operand (`Kernel.prepares`: the
Winograd transform of conv weights) from values that stay the same from call to call runs only when they change.

A compiled function's program reads arguments, random keys and the state it updates, which vary from call to
call, and parameters, module buffers and constants, which stay the same until the user gives a tensor another
value ("stable" inputs). A buffer is stable when its one writer reads only stable buffers. A preparation over
stable buffers may be skipped by a run whose stable inputs are the arrays, unchanged, that the last run read
(`Program.run`); what it writes then keeps bytes of its own in the arena, live over the whole program, so the next
run still finds it there.

Only preparations are kept: another stable value that is cheap to make again (a batch norm folded into conv
weights, one pass over them) would hold a second copy of the parameters for little time saved.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Collection

from tensorgraphs.codegen.c_renderer import uses_host_calls
from tensorgraphs.graph.node import Node
from tensorgraphs.schedule.fusion import Schedule


@dataclass(frozen=True)
class Preparations:
    """The kernels (positions in the schedule) a run may skip, the buffers they write (kept across runs), and the
    program inputs (positions) they read through any chain of kernels: a run given a new array for one of those
    runs them."""

    kernels: frozenset[int] = frozenset()
    kept: frozenset[str] = frozenset()
    inputs: frozenset[int] = frozenset()


def preparations(schedule: Schedule, inputs: list[Node], varying: Collection[int]) -> Preparations:
    """The preparations of `schedule` over stable buffers, for a program taking `inputs` of which those at positions
    `varying` change from call to call (the caller's arguments, which it may write in place between calls)."""
    kernels = schedule.kernels
    if not any(kernel.prepares for kernel in kernels):
        return Preparations()
    position = {node: i for i, node in enumerate(inputs)}
    writers: dict[str, list[int]] = defaultdict(list)
    for index, kernel in enumerate(kernels):
        for buffer in kernel.buffers:
            if buffer.writes:
                writers[buffer.name].append(index)
    # each stable buffer -> the program inputs its value is made from; absent: varying
    made_from: dict[str, frozenset[int]] = {}
    for spec in schedule.buffers:
        if spec.role == "input" and position.get(spec.node) not in varying:
            at = position.get(spec.node)
            made_from[spec.name] = frozenset() if at is None else frozenset({at})  # None: a constant it holds
    roles = {spec.name: spec.role for spec in schedule.buffers}
    skipped, read_by_skipped = set(), set()
    for index, kernel in enumerate(kernels):
        written = [b.name for b in kernel.buffers if b.writes]
        read = [b.name for b in kernel.buffers if not b.writes]
        if uses_host_calls([kernel]) or any(name not in made_from for name in read):
            continue
        if any(roles.get(name) != "temp" or writers[name] != [index] for name in written):
            continue
        sources = frozenset().union(*(made_from[name] for name in read))
        for name in written:
            made_from[name] = sources
        if kernel.prepares:
            skipped.add(index)
            read_by_skipped |= sources
    kept = {b.name for index in skipped for b in kernels[index].buffers if b.writes}
    return Preparations(frozenset(skipped), frozenset(kept), frozenset(read_by_skipped))
