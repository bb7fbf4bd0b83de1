"""Recomputing a cheap temporary where it is used again, instead of keeping it live across the peak.

In a training step the forward pass makes values that the backward pass reads
again much later: a slice of a weight copied for a matmul, the activation after
a bias and ReLU. Kept, they are live at the peak (the turn from forward to
backward). When the kernel that made such a value is cheap (no GEMM and no
reduction: one pass over its elements), writes nothing else, and everything it
reads still holds the same values when the value is needed again, a copy of
that kernel runs just before the later uses, into a temporary of its own, and
the later uses read the copy. No temporary lives longer for it, and the value
is no longer live at the peak.

Each round recomputes every such value that is live at the peak kernel but not
used there; rounds go on while the peak falls or fewer kernels reach it, and
those up to the last that lowered it are kept. A recomputed temporary holds the
same value as the first, so the naive count counts it once (`Lifetime.copy_of`).
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

import numpy as np

from tensorgraphs.codegen.loop_ir import (
    LIBRARY_CALLS,
    Accumulate,
    Kernel,
    Let,
    Load,
    Local,
    Loop,
    Reduce,
    Store,
    TransposeLocal,
    rename_buffer,
    walk,
)
from tensorgraphs.memory.liveness import Lifetime, temporaries
from tensorgraphs.memory.packing import live_profile
from tensorgraphs.schedule.fusion import BufferSpec, Schedule

MAX_ROUNDS = 8

def is_cheap(kernel: Kernel) -> bool:
    """One pass over its elements (no library call, no reduction): running it again costs about what streaming
    its buffers costs."""
    return not any(isinstance(stmt, (*LIBRARY_CALLS, Reduce)) for stmt in walk(kernel.body))


KNOWN_NAMES = (Let, Load, Store, Accumulate, Local, TransposeLocal, Loop, Reduce)
"""Statements whose every buffer name `rename_buffer` knows (the fields of a library call are checked)."""


def renamable(kernel: Kernel, old: str) -> bool:
    """Whether `rename_buffer` renames every mention of buffer `old` in `kernel`: a library call whose listing
    still names it once renamed holds it in a field the renaming does not know (then the kernel stays as it is)."""
    mention = re.compile(rf"\b{re.escape(old)}\b")
    return not any(mention.search(repr(rename_buffer(stmt, old, ""))) for stmt in walk(kernel.body)
                   if not isinstance(stmt, KNOWN_NAMES))


def renamed(kernel: Kernel, old: str, new: str, name: str | None = None) -> Kernel:
    """`kernel` (named `name` if given) touching buffer `new` where it touched `old` (see `renamable`)."""
    return dataclasses.replace(kernel, name=name or kernel.name,
                               buffers=[dataclasses.replace(b, name=new) if b.name == old else b
                                        for b in kernel.buffers],
                               body=[rename_buffer(stmt, old, new) for stmt in kernel.body])


@dataclass
class Recomputation:
    """Make temporary `name` again, into `copy`, by a copy of the kernel at `writer` (which reads `reads`), run
    just before `late_users` (positions), which then read the copy."""

    name: str
    copy: str
    writer: int
    late_users: list[int]
    reads: set[str]


def _fresh_name(name: str, taken: set[str]) -> str:
    copy = f"{name}_again"
    while copy in taken:
        copy += "_again"
    return copy


def recomputations(schedule: Schedule, lifetimes: list[Lifetime], peak: int) -> list[Recomputation]:
    """The temporaries live at kernel `peak` but not used there that can be recomputed after it (largest first,
    none reading another's value)."""
    kernels = schedule.kernels
    users: dict[str, list[int]] = {}
    writers: dict[str, list[int]] = {}
    for position, kernel in enumerate(kernels):
        for buffer in kernel.buffers:
            users.setdefault(buffer.name, []).append(position)
            if buffer.writes:
                writers.setdefault(buffer.name, []).append(position)
    end = {life.name: life.end for life in lifetimes}
    taken = {spec.name for spec in schedule.buffers}
    found: list[Recomputation] = []
    for life in sorted(lifetimes, key=lambda life: -life.nbytes):
        if not life.start < peak < life.end or writers[life.name] != [life.start] or peak in users[life.name]:
            continue  # not live across the peak, written again, or needed at the peak itself
        writer = kernels[life.start]
        reads = {b.name for b in writer.buffers if not b.writes}
        late = [p for p in users[life.name] if p > peak]
        inputs_kept = all(end.get(name, late[0]) >= late[0]  # a temporary it reads is live until then anyway
                          and not any(life.start < w < late[0] for w in writers.get(name, ()))  # and not overwritten
                          for name in reads)
        used_early = any(life.start < p < peak for p in users[life.name])
        independent = not any(life.name in r.reads or r.name in reads for r in found)
        only_output = [b.name for b in writer.buffers if b.writes] == [life.name]
        if not (is_cheap(writer) and only_output and inputs_kept and used_early and independent):
            continue
        copy = _fresh_name(life.name, taken)
        if not all(renamable(kernels[p], life.name) for p in [life.start, *late]):
            continue
        taken.add(copy)
        found.append(Recomputation(life.name, copy, life.start, late, reads))
    return found


def recompute(schedule: Schedule, plan: list[Recomputation]) -> Schedule:
    """`schedule` with each recomputation of `plan` made: the copied kernel before the first late user, the
    late users reading the copy."""
    kernels = list(schedule.kernels)
    inserted: dict[int, list[Kernel]] = {}
    spec = {b.name: b for b in schedule.buffers}
    buffers = list(schedule.buffers)
    for r in plan:
        writer = kernels[r.writer]
        for position in r.late_users:
            kernels[position] = renamed(kernels[position], r.name, r.copy)
        inserted.setdefault(r.late_users[0], []).append(renamed(writer, r.name, r.copy, f"{writer.name}_again"))
        buffers.append(BufferSpec(r.copy, spec[r.name].node, "temp"))
    ordered = [k for position, kernel in enumerate(kernels) for k in [*inserted.get(position, []), kernel]]
    return dataclasses.replace(schedule, kernels=ordered, buffers=buffers)


def _peak(profile: np.ndarray) -> tuple[int, int]:
    """How high the peak is and how many kernels reach it (fewer is progress towards a lower one)."""
    top = int(profile.max(initial=0))
    return top, int((profile == top).sum())


def recompute_for_memory(schedule: Schedule) -> Schedule:
    """`schedule` with cheap temporaries recomputed, round by round while the peak falls or narrows; the rounds
    up to the last that lowered the peak are kept (recomputing costs time: never for nothing)."""
    best = current = schedule
    profile = live_profile(schedule)
    best_top = _peak(profile)[0]
    for _ in range(MAX_ROUNDS):
        plan = recomputations(current, temporaries(current), int(profile.argmax()) if profile.size else 0)
        if not plan:
            break
        candidate = recompute(current, plan)
        candidate_profile = live_profile(candidate)
        if _peak(candidate_profile) >= _peak(profile):
            break
        current, profile = candidate, candidate_profile
        if _peak(profile)[0] < best_top:
            best, best_top = current, _peak(profile)[0]
    return best
