"""Preparations kept across calls: a kernel that makes its results from values that stay the same from call to call
(a batch norm folded into conv weights, the Winograd transform of conv weights) runs only when they change.

A compiled function's program reads arguments, random keys and the state it updates, which vary from call to
call, and parameters, module buffers and constants, which stay the same until the user gives a tensor another
value ("stable" inputs). A buffer is stable when its one writer reads only stable buffers. A kernel over stable
buffers may be skipped by a run whose stable inputs are the arrays, unchanged, that the last run read
(`Program.run`); what it writes then keeps bytes of its own in the arena, live over the whole program, so the next
run still finds it there. So a kernel is kept where it `prepares` another kernel's operand (`Kernel.prepares`: the
Winograd transform, four times the weights, saves far more than its bytes cost), and, in a program whose caller
says which inputs vary (a compiled function), where it writes no more than it reads (folds and casts of
parameters, not a constant expanded to a large tensor). A program realized eagerly is given new arrays for its
activations at every call: there every input counts as stable, so a kept temporary of any other kind would only
take bytes the arena could reuse.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Collection

from tensorgraphs.codegen.c_renderer import uses_host_calls
from tensorgraphs.codegen.loop_ir import Kernel
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


def preparations(schedule: Schedule, inputs: list[Node], varying: Collection[int] | None) -> Preparations:
    """The preparations of `schedule` over stable buffers, for a program taking `inputs` of which those at positions
    `varying` change from call to call (the caller's arguments, which it may write in place between calls; None
    where the caller does not know: only kernels that prepare are kept)."""
    kernels = schedule.kernels
    position = {node: i for i, node in enumerate(inputs)}
    writers: dict[str, list[int]] = defaultdict(list)
    for index, kernel in enumerate(kernels):
        for buffer in kernel.buffers:
            if buffer.writes:
                writers[buffer.name].append(index)
    # each stable buffer -> the program inputs its value is made from; absent: varying
    made_from: dict[str, frozenset[int]] = {}
    for spec in schedule.buffers:
        if spec.role == "input" and position.get(spec.node) not in (varying or ()):
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
        if kernel.prepares or (varying is not None and _bytes(kernel, writes=True) <= _bytes(kernel, writes=False)):
            skipped.add(index)
            read_by_skipped |= sources
    kept = {b.name for index in skipped for b in kernels[index].buffers if b.writes}
    return Preparations(frozenset(skipped), frozenset(kept), frozenset(read_by_skipped))


def _bytes(kernel: Kernel, writes: bool) -> int:
    """The bytes of the buffers `kernel` writes (or reads)."""
    return sum(b.size * b.dtype.itemsize for b in kernel.buffers if b.writes == writes)
