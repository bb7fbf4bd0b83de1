"""The host runtime: device buffers are host arrays, so the boundary copies nothing; programs go through it."""

from __future__ import annotations

import dataclasses
from collections import Counter

import numpy as np

import tensorgraphs as tg
from tensorgraphs.backends.cpu import CPU_TARGET
from tensorgraphs.backends.cpu import HOST_RUNTIME as HOST
from tensorgraphs.backends.native import Program
from tensorgraphs.runtime.buffer import data_address
from tensorgraphs.runtime.host import POOLED_BYTES, HostRuntime
from tensorgraphs.schedule import schedule_kernels


def test_crossing_the_boundary_copies_nothing_and_large_outputs_are_aligned() -> None:
    array = np.arange(12, dtype=np.float32)
    assert HOST.to_device(array, np.dtype(np.float32)) is array and HOST.to_host(array) is array
    large = HOST.empty((POOLED_BYTES // 4,), np.dtype(np.float32))
    assert large.ctypes.data % HOST.alignment == 0


class CountingRuntime(HostRuntime):
    def __init__(self) -> None:
        super().__init__(HOST.alignment, HOST.aligned_from)
        self.calls: Counter = Counter()

    def to_device(self, array, dtype):
        self.calls["to_device"] += 1
        return super().to_device(array, dtype)

    def to_host(self, buffer):
        self.calls["to_host"] += 1
        return super().to_host(buffer)

    def launch(self, entry, buffers, *args):
        self.calls["launch"] += 1
        return super().launch(entry, buffers, *args)


def test_a_program_moves_inputs_and_results_only_through_its_targets_runtime() -> None:
    runtime = CountingRuntime()
    x, y = tg.tensor(np.ones((4, 4), np.float32)), tg.tensor(np.full((4, 4), 2, np.float32))
    total, product = x + y, (x * y).sum(1)
    inputs = [x.node, y.node]
    program = Program(schedule_kernels([total.node, product.node], set(inputs).__contains__), inputs,
                      dataclasses.replace(CPU_TARGET, runtime=runtime))
    got = program.run([np.ones((4, 4), np.float32), np.full((4, 4), 2, np.float32)])
    np.testing.assert_array_equal(got[0], np.full((4, 4), 3, np.float32))
    np.testing.assert_array_equal(got[1], np.full(4, 8, np.float32))
    assert runtime.calls == Counter(to_device=2, to_host=2, launch=1)


def test_a_launch_passes_every_buffers_current_address() -> None:
    """Addresses are kept from launch to launch only for the very same buffers: a replaced or freed one is read
    again (a new array may reuse a freed one's memory or identity)."""
    seen: list[list[int]] = []

    def entry(addresses, *args):  # noqa: ANN001, ANN002, ANN202 - stands in for a ctypes function
        seen.append(list(addresses))
        return 0

    runtime = HostRuntime(alignment=64, aligned_from=1 << 20)
    kept, replaced = np.ones(4, np.float32), np.ones(4, np.float32)
    runtime.launch(entry, [kept, replaced])
    del replaced
    new = np.zeros(4, np.float32)
    runtime.launch(entry, [kept, new])
    runtime.launch(entry, [new, kept])
    assert seen == [[data_address(kept), seen[0][1]], [data_address(kept), data_address(new)],
                    [data_address(new), data_address(kept)]]
