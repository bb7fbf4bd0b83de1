"""Random inputs of a signature and small timers: what verification and tuning run kernels on."""

from __future__ import annotations

import os
import time
from typing import Any, Callable, Iterator

import numpy as np

from tensorgraphs import dtypes
from tensorgraphs.plan.signature import TensorSpec


def random_array(spec: TensorSpec, rng: np.random.Generator) -> np.ndarray:
    """Values that exercise a kernel: normal floats with tails past +-2, small integers, both booleans."""
    if spec.dtype.is_floating_point:
        data = rng.standard_normal(spec.shape) * 2.0
        return dtypes.round_to_storage(data.astype(spec.dtype.storage), spec.dtype)
    if spec.dtype.is_bool:
        return rng.random(spec.shape) < 0.5
    low = 0 if spec.dtype.kind == "u" else -4
    return rng.integers(low, 5, spec.shape).astype(spec.dtype.storage)


def rounds_within(budget: float, min_runs: int, max_runs: int) -> Iterator[int]:
    """Round numbers 0, 1, ...: at least `min_runs`, more while `budget` seconds (from the first round) last, at
    most `max_runs`."""
    deadline = time.perf_counter() + budget
    count = 0
    while count < min_runs or (count < max_runs and time.perf_counter() < deadline):
        yield count
        count += 1


def kernel_clock() -> Callable[[], float]:
    """The clock of timed builds (`codegen.c_renderer.timer`): wall time, or with TG_KERNEL_CLOCK=cpu the
    process's CPU time (one thread on a loaded machine: time descheduled does not count)."""
    return time.process_time if os.environ.get("TG_KERNEL_CLOCK", "wall") == "cpu" else time.perf_counter


def time_interleaved(runs: list[Callable[[], Any]], budget: float = 0.05, min_runs: int = 3, max_runs: int = 50,
                     clock: Callable[[], float] = time.perf_counter) -> list[list[float]]:
    """Seconds per call of each of `runs` (after one warm-up call each), by `clock`: one call of each per round, in
    an order reversed every other round, so drifting load weighs on all alike."""
    for run in runs:
        run()
    samples: list[list[float]] = [[] for _ in runs]
    order = list(range(len(runs)))
    for count in rounds_within(budget, min_runs, max_runs):
        for i in order if count % 2 == 0 else reversed(order):
            start = clock()
            runs[i]()
            samples[i].append(clock() - start)
    return samples


def time_samples(run: Callable[[], Any], budget: float = 0.05, min_runs: int = 3, max_runs: int = 50) -> list[float]:
    """Seconds per call of `run` (after one warm-up call): at least `min_runs`, more while `budget` lasts."""
    return time_interleaved([run], budget, min_runs, max_runs)[0]
