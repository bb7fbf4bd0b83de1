"""`tg.amp` as torch.amp: the cpu autocast (`tensorgraphs.frontend.autocast`) and a GradScaler that is a no-op.

A loss scaler keeps float16 gradients from underflowing. bfloat16 has float32's exponent range, so on the cpu,
where autocast means bfloat16, scaling changes no gradient beyond rounding: `GradScaler` accepts torch's calls
(scale, unscale_, step, update, state_dict) and leaves values alone, so a torch AMP training loop runs unchanged.
"""

from __future__ import annotations

from typing import Any

from tensorgraphs import missing as _missing
from tensorgraphs.frontend.autocast import autocast, get_autocast_dtype, is_autocast_enabled


def is_autocast_available(device_type: str) -> bool:
    return device_type == "cpu"


class GradScaler:
    """torch.amp.GradScaler's interface; it scales nothing (see the module docstring), so `get_scale()` is 1.0."""

    def __init__(self, device: str = "cuda", init_scale: float = 2.0**16, growth_factor: float = 2.0,
                 backoff_factor: float = 0.5, growth_interval: int = 2000, enabled: bool = True) -> None:
        self.device = device

    def scale(self, outputs: Any) -> Any:
        return outputs

    def unscale_(self, optimizer: Any) -> None:
        """Gradients are not scaled, so there is nothing to undo."""

    def step(self, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
        return optimizer.step(*args, **kwargs)

    def update(self, new_scale: Any = None) -> None:
        """The scale stays 1."""

    def get_scale(self) -> float:
        return 1.0

    def is_enabled(self) -> bool:
        return False

    def state_dict(self) -> dict[str, Any]:
        return {}  # what torch's scaler gives when it is disabled

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Accepted (a torch checkpoint's scaler state has nothing this scaler uses)."""


__all__ = ["GradScaler", "autocast", "get_autocast_dtype", "is_autocast_available", "is_autocast_enabled"]
__getattr__ = _missing.module_getattr(__name__, globals())  # missing torch names: "not implemented yet"
