"""The arena: temporaries are views into one allocation per program; poison fills it with NaN bytes."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pytest

import tensorgraphs as tg
from tensorgraphs.backends.cpu import CPU, CPU_TARGET
from tensorgraphs.backends.native import Program
from tensorgraphs.backends.numpy_backend import REFERENCE
from tensorgraphs.graph.node import Node
from tensorgraphs.memory.arena import HUGE_PAGE_BYTES, Arena, poison_enabled
from tensorgraphs.schedule.fusion import schedule_kernels

pytestmark = pytest.mark.device("cpu", compile=True)  # checks generated C, small graphs included

if TYPE_CHECKING:
    from conftest import TransformerStep  # tests/memory/conftest.py


def test_views_are_aligned_slices_of_one_allocation() -> None:
    arena = Arena(4 << 20)
    a = arena.view(0, np.dtype(np.float32), (2, 3))
    b = arena.view(64, np.dtype(np.int64), (4,))
    assert arena.address % 4096 == 0 and b.ctypes.data == arena.address + 64
    a[...] = 1.5
    b[...] = -7
    assert a.base is not None and np.all(a == 1.5) and np.all(b == -7)


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads the process's mappings (Linux)")
def test_a_large_arena_is_private_memory_that_starts_on_a_huge_page() -> None:
    """Large arenas can be backed by transparent huge pages: a private anonymous mapping (a shared one is shmem,
    which the kernel gives huge pages only where shmem_enabled allows), starting on a 2 MiB boundary."""
    arena = Arena(5 << 20)
    arena.bytes[:] = 1
    for line in Path("/proc/self/maps").read_text().splitlines():
        span, permissions = line.split()[:2]
        start, end = (int(part, 16) for part in span.split("-"))
        if start <= arena.address < end:
            break
    else:
        pytest.fail("the arena is in no mapping")
    assert permissions == "rw-p" and arena.address + len(arena.bytes) <= end
    assert arena.address % HUGE_PAGE_BYTES == 0


def test_poison_reads_nan_in_floats_and_minus_one_in_ints(monkeypatch: pytest.MonkeyPatch) -> None:
    arena = Arena(256)
    arena.poison()
    for dtype in (np.float16, np.float32, np.float64):
        assert np.isnan(arena.view(0, np.dtype(dtype), (8,))).all()
    assert (arena.view(128, np.dtype(np.int32), (8,)) == -1).all()
    assert poison_enabled()
    monkeypatch.setenv("TG_POISON", "0")
    assert not poison_enabled()


def test_program_keeps_its_temporaries_in_the_arena(handoff_roots: list[Node]) -> None:
    program, inputs = CPU.program(handoff_roots)
    plan = program.memory
    assert program.arena.bytes.nbytes == plan.arena_bytes < plan.naive_bytes
    arrays = [n.arg.data for n in inputs]
    for _ in range(2):  # poisoned before each run: every temporary is written before it is read
        for got, want in zip(program.run(arrays), REFERENCE.evaluate(handoff_roots)):
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_debug_memory_prints_the_plan(handoff_roots: list[Node], monkeypatch: pytest.MonkeyPatch,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("TG_DEBUG", "memory")
    _, inputs = CPU.program(handoff_roots)
    program = Program(schedule_kernels(handoff_roots, set(inputs).__contains__), inputs, CPU_TARGET)
    printed = capsys.readouterr().err
    donor, output = program.memory.in_place[0]
    assert f"memory: arena {program.memory.arena_bytes} bytes" in printed and f"{output} overwrites {donor}" in printed


def test_two_layer_training_step_arena_is_at_most_30_percent_of_naive(two_layer_training: TransformerStep,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The issue's target on the benchmark's step (bench/memory.py) at small sizes, where the share is about the
    same (25% here, 27% at full size); the planned, recomputing, poisoned program still computes the step. The
    target was set with the attention decomposed (fused, the scores are not stored: less arena, and less naive)."""
    monkeypatch.setenv("TG_ATTENTION", "0")
    step = tg.compile(two_layer_training)
    got = step(two_layer_training.x, two_layer_training.target)
    stats = step.stats
    assert stats.arena_bytes <= 0.30 * stats.naive_bytes, stats
    with tg.device("numpy"):
        want = [t.detach().numpy() for t in two_layer_training(tg.tensor(two_layer_training.x),
                                                      tg.tensor(two_layer_training.target))]
    for position, (a, b) in enumerate(zip(got, want)):
        np.testing.assert_allclose(a.numpy(), b, rtol=2e-3, atol=1e-5, err_msg=f"output {position}")
