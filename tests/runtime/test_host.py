"""The host runtime: device buffers are host arrays, so the boundary copies nothing; programs go through it."""

from __future__ import annotations

import dataclasses
from collections import Counter

import numpy as np

import tensorgraphs as tg
from tensorgraphs.backends.cpu import CPU_TARGET
from tensorgraphs.backends.cpu import HOST_RUNTIME as HOST
from tensorgraphs.backends.native import Program
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
