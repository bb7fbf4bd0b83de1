"""Random inputs of a signature and a small timer: what verification and tuning run kernels on."""

from __future__ import annotations

import time
from typing import Any, Callable

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


def time_samples(run: Callable[[], Any], budget: float = 0.05, min_runs: int = 3, max_runs: int = 50) -> list[float]:
    """Seconds per call of `run` (after one warm-up call): at least `min_runs`, more while `budget` lasts."""
    run()
    samples: list[float] = []
    deadline = time.perf_counter() + budget
    while len(samples) < min_runs or (len(samples) < max_runs and time.perf_counter() < deadline):
        start = time.perf_counter()
        run()
        samples.append(time.perf_counter() - start)
    return samples
