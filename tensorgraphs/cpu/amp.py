"""torch.cpu.amp: the cpu autocast with bfloat16 by default, and the no-op GradScaler of `tg.amp`."""

from __future__ import annotations

from typing import Any

from tensorgraphs import dtypes
from tensorgraphs.amp import GradScaler
from tensorgraphs.frontend import autocast as _autocast


class autocast(_autocast.autocast):  # noqa: N801 - torch's name
    """torch.cpu.amp.autocast(enabled, dtype, cache_enabled): `tg.autocast("cpu", ...)`."""

    def __init__(self, enabled: bool = True, dtype: Any = dtypes.bfloat16, cache_enabled: bool = True) -> None:
        super().__init__("cpu", dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)


__all__ = ["GradScaler", "autocast"]
