"""Bugs the fuzzers found that are being fixed elsewhere: by default the generators leave out what triggers them.

Each entry names the bug, says where it is tracked and how it shows, and says what is left out: steps of a
random program (`step`, given a `fuzz_programs.Proposal`), a way of running programs (`mode`), or training
cases on one path (`training`, given a `fuzz_training.TrainingCase` and the mode). With `--known-bugs` (or
`TG_FUZZ_KNOWN_BUGS=1`) nothing is left out, to check a fix; delete the entry when the fix lands.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np


@dataclass(frozen=True)
class KnownBug:
    name: str
    why: str
    step: Callable[[Any], bool] | None = None
    mode: str | None = None
    training: Callable[[Any, str], bool] | None = None


def _overflowing_matmul(p: Any) -> bool:
    """A float matmul whose products or sums can overflow (an inf and a -inf product sum to NaN)."""
    if "@" not in p.text or p.args[0].values.dtype.kind != "f":
        return False
    bound = float(p.args[0].values.shape[-1] if p.args[0].values.ndim else 1)
    for v in p.args if len(p.args) == 2 else p.args * 2:
        finite = np.abs(v.values[np.isfinite(v.values)].astype(np.float64))
        bound *= float(finite.max()) if finite.size else 0.0
    return bound >= float(np.finfo(p.args[0].values.dtype).max) / 2


KNOWN_BUGS: tuple[KnownBug, ...] = ()

UNSPECIFIED: tuple[KnownBug, ...] = (
    KnownBug("gemm-overflow", "docs/ops.md: which non-finite value an overflowing product gives (inf or NaN) is "
             "unspecified, and later steps may tell the two apart", step=_overflowing_matmul),
)
"""Behaviour the documented contract leaves open: always left out, even with `--known-bugs`."""


def active() -> tuple[KnownBug, ...]:
    """The entries in force: the unspecified behaviour, and the known bugs unless TG_FUZZ_KNOWN_BUGS is set."""
    return UNSPECIFIED + (() if os.environ.get("TG_FUZZ_KNOWN_BUGS") else KNOWN_BUGS)


def skipped_step(proposal: Any) -> KnownBug | None:
    return next((b for b in active() if b.step is not None and b.step(proposal)), None)


def skipped_mode(mode: str) -> KnownBug | None:
    return next((b for b in active() if b.mode == mode), None)


def skipped_training(case: Any, mode: str) -> KnownBug | None:
    return next((b for b in active() if b.training is not None and b.training(case, mode)), None)
