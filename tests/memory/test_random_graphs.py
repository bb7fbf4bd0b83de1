"""Property: on random graphs, planned execution (arena, in-place, poison on) equals unplanned, bit for bit,
and both equal the numpy reference. The verifier runs on every compile (in `Program`)."""

from __future__ import annotations

from typing import Callable

import numpy as np
import pytest

import tensorgraphs as tg
import tensorgraphs.nn.functional as F
from tensorgraphs.backends.cpu import CPU, CPU_TARGET
from tensorgraphs.backends.native import Program
from tensorgraphs.backends.numpy_backend import REFERENCE
from tensorgraphs.graph.node import Node
from tensorgraphs.memory.order import order_for_memory
from tensorgraphs.rewrite import fuzz
from tensorgraphs.schedule.fusion import schedule_kernels

pytestmark = pytest.mark.device("cpu", compile=True)  # checks generated C, small graphs included

Step = Callable[[np.random.Generator, list[tg.Tensor]], tg.Tensor]
SIDE = 12


def matrix(rng: np.random.Generator) -> tg.Tensor:
    return tg.tensor(rng.normal(size=(SIDE, SIDE)).astype(np.float32))


def pick(rng: np.random.Generator, pool: list[tg.Tensor]) -> tg.Tensor:
    return pool[len(pool) - 1 - min(int(rng.exponential(2)), len(pool) - 1)]


STEPS: tuple[Step, ...] = (
    lambda rng, pool: pick(rng, pool) @ matrix(rng) * 0.3,
    lambda rng, pool: (pick(rng, pool) * 0.5).tanh().exp() @ matrix(rng) * 0.1,
    lambda rng, pool: pick(rng, pool) - pick(rng, pool).mean(0, keepdim=True),
    lambda rng, pool: pick(rng, pool) * pick(rng, pool).sum(1, keepdim=True).tanh(),
    lambda rng, pool: F.softmax(pick(rng, pool), -1) + pick(rng, pool),
    lambda rng, pool: F.relu(pick(rng, pool)).T @ pick(rng, pool) * 0.1,
    lambda rng, pool: F.layer_norm(pick(rng, pool), (SIDE,)),
)


MOVING_AVERAGE: Step = lambda rng, pool: pick(rng, pool) * 0.9 + pick(rng, pool) * 0.1  # noqa: E731
"""An optimizer's moment: an elementwise output that later elementwise steps read at the same index."""


def random_graph(seed: int, steps: int = 8, kinds: tuple[Step, ...] = STEPS, kept: float = 0.25) -> list[Node]:
    """Roots of a random float32 graph of [12, 12] matrices: matmuls, reductions, elementwise chains, views; the
    last value and each earlier one with probability `kept`."""
    rng = np.random.default_rng(seed)
    pool = [matrix(rng) for _ in range(2)]
    for _ in range(steps):
        pool.append(kinds[rng.integers(len(kinds))](rng, pool))
    return [pool[-1].node] + [t.node for t in pool[2:-1] if rng.random() < kept]


def unplanned(roots: list[Node]) -> list[np.ndarray]:
    """The same compiled kernels with every temporary in bytes of its own."""
    _, inputs = CPU.program(roots)
    program = Program(schedule_kernels(roots, set(inputs).__contains__), inputs, CPU_TARGET, reuse_memory=False)
    return program.run([n.arg.data for n in inputs])


def check(roots: list[Node], seed: int, rtol: float) -> None:
    planned = CPU.evaluate(roots)
    for position, (got, same, want) in enumerate(zip(planned, unplanned(roots), REFERENCE.evaluate(roots))):
        assert fuzz.same_bits(got, same), f"seed {seed}, output {position}: planned differs from unplanned"
        np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol, equal_nan=True,
                                   err_msg=f"seed {seed}, output {position}")


@pytest.mark.parametrize("seed", range(24))
def test_planned_equals_unplanned_and_reference(seed: int) -> None:
    check(random_graph(seed), seed, rtol=2e-3)


def test_the_random_graphs_exercise_reuse_and_handoffs() -> None:
    plans = [CPU.program(random_graph(seed))[0].memory for seed in range(24)]
    assert sum(plan.arena_bytes < plan.naive_bytes for plan in plans) >= 8
    assert sum(len(plan.in_place) for plan in plans) >= 3


@pytest.mark.parametrize("seed", range(0, 200, 10))
def test_rewrite_fuzzer_graphs_any_dtype(seed: int) -> None:
    """The rewrite fuzzer's graphs: every dtype, NaN/Inf and wrapping integers, few temporaries."""
    roots = fuzz.random_graph(seed)
    planned, plain = CPU.evaluate(roots), unplanned(roots)
    assert all(fuzz.same_bits(a, b) for a, b in zip(planned, plain)), f"fuzz seed {seed}"


@pytest.mark.long
def test_recomputing_graphs_equal_unplanned_and_reference() -> None:
    """Longer random graphs, where a cheap value is now and then recomputed (`memory.recompute`) instead of kept."""
    recomputing = 0
    for seed in range(96):
        roots = random_graph(seed, steps=16)
        schedule = schedule_kernels(roots)
        if len(order_for_memory(schedule).kernels) > len(schedule.kernels):
            check(roots, seed, rtol=2e-3)
            recomputing += 1
    assert recomputing >= 2


@pytest.mark.long
def test_graphs_of_moving_averages_store_several_arrays_per_kernel_and_equal_the_reference() -> None:
    """Outputs read back at the same index ride in their reader's kernel (`schedule.fusion.store_in_consumers`):
    planned (in place where allowed) equal to unplanned and to the reference."""
    several = 0
    for seed in range(24):
        roots = random_graph(seed, kinds=STEPS + (MOVING_AVERAGE,) * 4, kept=0.6)
        kernels = CPU.program(roots)[0].kernels
        several += any(sum(b.writes for b in kernel.buffers) > 1 for kernel in kernels)
        check(roots, seed, rtol=2e-3)
    assert several >= 6, several
