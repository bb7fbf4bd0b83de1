"""`tg.cpu` as torch.cpu: its `amp` namespace (torch.cpu.amp.autocast, torch.cpu.amp.GradScaler)."""

from __future__ import annotations

from tensorgraphs import missing as _missing
from tensorgraphs.cpu import amp

__all__ = ["amp"]
__getattr__ = _missing.module_getattr(__name__, globals())  # missing torch names: "not implemented yet"
