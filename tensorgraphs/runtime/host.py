"""The host runtime (`runtime.device`): device memory is the process's memory, so a device buffer is a numpy
array, inputs and results cross the boundary without a copy, and a launch passes the arrays' addresses to a
function of a library loaded with ctypes."""

from __future__ import annotations

import ctypes
import functools
import itertools
import math
import operator
import sys
import threading
import weakref
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from tensorgraphs import memory
from tensorgraphs.runtime.buffer import DEAD_REFERENCE, data_address

POOLED_BYTES = 1 << 20
"""Outputs at least this large are recycled once the caller drops them: fresh pages cost page faults
(bench/NOTES.md)."""

POOLED_SHARED_BYTES = 1 << 16
"""The block a run's small outputs share is recycled from this size on: malloc maps blocks this large afresh at
times (its threshold moves), and a program asks for the same total at every call."""


class BlockPool:
    """Memory blocks of large outputs, handed out again (to any program) once nothing else refers to them: fresh
    memory costs page faults, reused memory nothing. Of each size, `per_size` blocks are kept, or as many as one
    run asked for at once (`keep`)."""

    def __init__(self, per_size: int = 2) -> None:
        self.per_size = per_size
        self._blocks: dict[int, list[np.ndarray]] = {}
        self._kept: dict[int, int] = {}
        self._lock = threading.Lock()

    def keep(self, size: int, count: int) -> None:
        """Keep up to `count` blocks of `size` bytes: a run takes that many at once (an attention's backward: dq, dk
        and dv of one size), and each one not kept would be fresh memory at every run."""
        with self._lock:
            self._kept[size] = max(self._kept.get(size, self.per_size), count)

    def __contains__(self, block: object) -> bool:
        """Whether `block` is one the pool keeps (hands out again)."""
        return any(block is kept for blocks in self._blocks.values() for kept in blocks)

    def take(self, size: int, pooled_from: int = POOLED_BYTES) -> np.ndarray:
        """A uint8 block of `size` bytes no array refers to (recycled if `size` is at least `pooled_from`)."""
        if size < pooled_from:
            return np.empty(size, np.uint8)
        with self._lock:
            blocks = self._blocks.setdefault(size, [])
            for position in range(len(blocks)):
                if sys.getrefcount(blocks[position]) <= 2:  # only the pool and getrefcount's argument
                    return blocks[position]
            block = np.empty(size, np.uint8)
            if len(blocks) < self._kept.get(size, self.per_size):
                blocks.append(block)
            return block


OUTPUT_BLOCKS = BlockPool()


class AddressTable:
    """The C array of buffer addresses an entry point takes, rewritten only where a buffer is not the one the last
    launch passed (held weakly: a freed buffer is never mistaken for a new one). An address costs a buffer-protocol
    call, and most of a program's buffers (parameters, captured and in-place state) are the same at every call:
    the buffers are compared with the last launch's in one loop that runs in C."""

    def __init__(self, size: int) -> None:
        self.addresses = (ctypes.c_void_p * max(size, 1))()
        self._buffers: list[weakref.ref] = [DEAD_REFERENCE] * size

    def __len__(self) -> int:
        return len(self._buffers)

    def update(self, buffers: Sequence[np.ndarray]) -> Any:
        known = map(operator.call, self._buffers)
        for i in itertools.compress(range(len(buffers)), map(operator.is_not, known, buffers)):
            self.set(i, buffers[i])
        return self.addresses

    def set(self, i: int, buffer: np.ndarray) -> None:
        self.addresses[i] = data_address(buffer)
        self._buffers[i] = weakref.ref(buffer)


class HostRuntime:
    """Buffers in the process's memory. Outputs of `aligned_from` bytes or more start on an `alignment`-byte
    boundary (a program's streaming stores write whole cache lines; a large numpy allocation starts 16 bytes past
    one)."""

    OWN_ALLOCATION_BYTES = 64

    def __init__(self, alignment: int, aligned_from: int) -> None:
        self.alignment, self.aligned_from = alignment, aligned_from

    def to_device(self, array: Any, dtype: np.dtype) -> np.ndarray:
        return np.asarray(array, dtype=dtype, order="C")  # keeps 0-d arrays 0-d, unlike ascontiguousarray

    def to_host(self, buffer: np.ndarray) -> np.ndarray:
        return buffer

    def empty(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        """An uninitialized array; a pooled one is aligned and its `.base` is its memory block. Small outputs
        (below both sizes) are plain allocations, as a program can return hundreds of them."""
        nbytes = math.prod(shape) * dtype.itemsize
        if self._small(nbytes):
            return np.empty(shape, dtype)
        block = OUTPUT_BLOCKS.take(nbytes + self.alignment)
        start = -block.ctypes.data % self.alignment
        return block[start:start + nbytes].view(dtype).reshape(shape)

    def outputs(self, specs: Sequence[tuple[tuple[int, ...], np.dtype]]) -> list[np.ndarray]:
        """A run's outputs. Binding is per-call work on hundreds of buffers in a training step, so the small ones
        (64 bytes up to the pooled and aligned sizes) share one allocation; an output below `OWN_ALLOCATION_BYTES`
        (a loss, a step count) gets its own, so keeping it keeps no run's block (`realize.owned` treats disjoint
        parts of one allocation as distinct memory). Given `specs` as a tuple, where each goes is worked out once."""
        layout = _output_layout(tuple(specs), self.alignment, self.aligned_from, self.OWN_ALLOCATION_BYTES)
        for size, count in layout.kept:
            OUTPUT_BLOCKS.keep(size, count)
        buffers: list[np.ndarray | None] = [None] * len(specs)
        for position in layout.own:
            buffers[position] = self.empty(*specs[position])
        if layout.shared:
            block = OUTPUT_BLOCKS.take(layout.shared_bytes + self.alignment, POOLED_SHARED_BYTES)
            start = -data_address(block) % self.alignment
            for position, offset in layout.shared:
                shape, dtype = specs[position]
                buffers[position] = np.ndarray(shape, dtype, block, start + offset)
        return buffers  # type: ignore[return-value]

    def arena(self, nbytes: int) -> memory.Arena:
        return memory.Arena(nbytes)

    def launch(self, entry: Callable[..., int], buffers: Sequence[np.ndarray], *args: Any) -> int:
        """`entry(addresses of buffers, *args)`; the address table is the entry's own (a program runs one call at a
        time), so it is rewritten only where buffers changed."""
        table = getattr(entry, "tg_addresses", None)
        if table is None or len(table) != len(buffers):
            table = entry.tg_addresses = AddressTable(len(buffers))  # type: ignore[attr-defined]
        return entry(table.update(buffers), *args)

    def launch_again(self, entry: Callable[..., int], changed: Mapping[int, np.ndarray], *args: Any) -> int:
        """`entry(addresses, *args)` over the buffers its last `launch` passed, but for the `changed` ones (slot ->
        buffer): the caller knows the others to be the same and alive."""
        table = entry.tg_addresses  # type: ignore[attr-defined]
        for i, buffer in changed.items():
            table.set(i, buffer)
        return entry(table.addresses, *args)

    def _small(self, nbytes: int) -> bool:
        return _plain_allocation(nbytes, self.alignment, self.aligned_from)


def _plain_allocation(nbytes: int, alignment: int, aligned_from: int) -> bool:
    """Below both the pooled and the aligned sizes: a plain allocation."""
    return nbytes + alignment < min(POOLED_BYTES, aligned_from)


@dataclass(frozen=True)
class OutputLayout:
    """Where `HostRuntime.outputs` puts a run's outputs: the positions allocated on their own (pooled, aligned or
    tiny), those sharing one block at a byte offset, the block's size, and how many pooled blocks of each size the
    run takes at once (`BlockPool.keep`)."""

    own: tuple[int, ...]
    shared: tuple[tuple[int, int], ...]
    shared_bytes: int
    kept: tuple[tuple[int, int], ...]


@functools.lru_cache(maxsize=4096)
def _output_layout(specs: tuple[tuple[tuple[int, ...], np.dtype], ...], alignment: int, aligned_from: int,
                   own_below: int) -> OutputLayout:
    own, shared, total = [], [], 0
    for position, (shape, dtype) in enumerate(specs):
        nbytes = math.prod(shape) * dtype.itemsize
        if own_below <= nbytes and _plain_allocation(nbytes, alignment, aligned_from):
            shared.append((position, total))
            total += -(-nbytes // alignment) * alignment
        else:
            own.append(position)
    pooled = Counter(math.prod(shape) * dtype.itemsize + alignment for shape, dtype in specs
                     if not _plain_allocation(math.prod(shape) * dtype.itemsize, alignment, aligned_from))
    return OutputLayout(tuple(own), tuple(shared), total, tuple(pooled.items()))
