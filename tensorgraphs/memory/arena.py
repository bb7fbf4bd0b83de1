"""The arena: one block of memory per program holding every temporary, allocated once and reused by each run.

Large arenas are mapped anonymously and marked for transparent huge pages
(fewer TLB misses over a working set of many megabytes). `TG_POISON=1` fills
the whole arena with 0xFF bytes before every run: NaN in every float type, -1
in every integer, so a kernel that reads a temporary before it is written shows
up as NaN (or a wrong integer) in tests instead of reading a stale value.
"""

from __future__ import annotations

import contextlib
import mmap
import os

import numpy as np

HUGE_PAGE_BYTES = 1 << 21
POISON_BYTE = 0xFF


def poison_enabled() -> bool:
    return os.environ.get("TG_POISON", "") not in ("", "0")


class Arena:
    """`nbytes` of page-aligned memory; `view(offset, dtype, shape)` is a temporary's array inside it."""

    def __init__(self, nbytes: int) -> None:
        huge = nbytes >= HUGE_PAGE_BYTES and hasattr(mmap, "MADV_HUGEPAGE")
        # Private: a shared anonymous mapping is shmem, which the kernel backs with huge pages only where
        # shmem_enabled allows (usually never). Mapped one huge page longer, so the arena can start on one.
        self._map = mmap.mmap(-1, max(nbytes, 1) + (HUGE_PAGE_BYTES if huge else 0),
                              flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)  # page-aligned, zero until touched
        if huge:
            with contextlib.suppress(OSError):  # a kernel built without transparent huge pages refuses the advice
                self._map.madvise(mmap.MADV_HUGEPAGE)
        whole = np.frombuffer(self._map, np.uint8)
        start = -whole.ctypes.data % HUGE_PAGE_BYTES if huge else 0
        self.bytes = whole[start:start + nbytes]
        self.address = self.bytes.ctypes.data

    def view(self, offset: int, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
        count = int(np.prod(shape, dtype=np.int64))
        return self.bytes[offset:offset + count * dtype.itemsize].view(dtype).reshape(shape)

    def poison(self) -> None:
        self.bytes.fill(POISON_BYTE)
