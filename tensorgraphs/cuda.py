"""`tg.cuda` as torch.cuda answers on a machine without a GPU: code that asks before using one runs unchanged."""

from __future__ import annotations

from tensorgraphs import missing as _missing


def is_available() -> bool:
    """False: tensorgraphs computes on the cpu (`.to("cuda")` raises, naming the devices there are)."""
    return False


def device_count() -> int:
    return 0


def manual_seed(seed: int) -> None:
    """Accepted and ignored, as torch.cuda.manual_seed without a GPU (tg.manual_seed seeds every device)."""


manual_seed_all = manual_seed

__getattr__ = _missing.module_getattr(__name__, globals())  # missing torch names: "not implemented yet"
