"""How closely a bfloat16 autocast training run tracks torch's: the yardstick is torch's own bfloat16 run against
its float32 run, from the same weights on the same data.

Each bfloat16 run leaves the float32 trajectory by its own rounding noise. Two runs that round differently
(tensorgraphs and torch sum in other orders, and round at slightly different places) each carry such noise, so
their losses differ by about sqrt(2) times what one run differs from float32: `TRACKING_FACTOR` allows 2.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

TRACKING_FACTOR = 2.0


@dataclass(frozen=True)
class Tracking:
    """Mean and largest relative loss differences per step: ours vs torch's bfloat16 run (`to_torch`), torch's
    bfloat16 vs its float32 run (`torch_to_float32`, the yardstick), ours vs torch's float32 run."""

    to_torch: tuple[float, float]
    torch_to_float32: tuple[float, float]
    to_float32: tuple[float, float]

    def __str__(self) -> str:
        def pair(values: tuple[float, float]) -> str:
            return f"mean {values[0]:.2e}, max {values[1]:.2e}"

        return (f"tg bf16 vs torch bf16: {pair(self.to_torch)}; torch bf16 vs torch f32: "
                f"{pair(self.torch_to_float32)}; tg bf16 vs torch f32: {pair(self.to_float32)}")


def tracking(ours: list[float], torch_bfloat16: list[float], torch_float32: list[float]) -> Tracking:
    def differences(a: list[float], b: list[float]) -> tuple[float, float]:
        relative = np.abs(np.subtract(a, b)) / np.abs(b)
        return float(relative.mean()), float(relative.max())

    return Tracking(differences(ours, torch_bfloat16), differences(torch_bfloat16, torch_float32),
                    differences(ours, torch_float32))


def assert_tracks_torch(ours: list[float], torch_bfloat16: list[float], torch_float32: list[float]) -> Tracking:
    """Ours stays within TRACKING_FACTOR times the yardstick of torch's bfloat16 run (mean and largest
    difference), and as close to float32 as torch's bfloat16 run is, to the same factor."""
    found = tracking(ours, torch_bfloat16, torch_float32)
    yardstick = found.torch_to_float32
    for name, values in (("torch's bfloat16 run", found.to_torch), ("torch's float32 run", found.to_float32)):
        assert all(v <= TRACKING_FACTOR * y for v, y in zip(values, yardstick, strict=True)), (
            f"the autocast losses stray from {name}: {found}")
    return found
