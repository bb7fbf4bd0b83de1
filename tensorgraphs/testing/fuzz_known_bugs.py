"""Bugs the fuzzers found that are being fixed elsewhere: by default the generators leave out what triggers them.

Each entry names the bug, says where it is tracked and how it shows, and says what is left out: steps of a
random program (`step`, given a `fuzz_programs.Proposal`), a way of running programs (`mode`), or training
cases on one path (`training`, given a `fuzz_training.TrainingCase` and the mode). With `--known-bugs` (or
`TG_FUZZ_KNOWN_BUGS=1`) nothing is left out, to check a fix; delete the entry when the fix lands.
"""

from __future__ import annotations

import os
import re
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


def _rounds_negative_fraction(p: Any) -> bool:
    """floor/ceil/trunc/round of a value in (-1, -0.0]: a zero whose sign the devices disagree on."""
    if not re.search(r"\.(floor|ceil|trunc|round)\(\)", p.text):
        return False
    x = p.args[0].values
    return x.dtype.kind == "f" and bool((np.signbit(x) & (x > -1)).any())


def _overflowing_matmul(p: Any) -> bool:
    """A float matmul whose products or sums can overflow (an inf and a -inf product sum to NaN)."""
    if "@" not in p.text or p.args[0].values.dtype.kind != "f":
        return False
    bound = float(p.args[0].values.shape[-1] if p.args[0].values.ndim else 1)
    for v in p.args if len(p.args) == 2 else p.args * 2:
        finite = np.abs(v.values[np.isfinite(v.values)].astype(np.float64))
        bound *= float(finite.max()) if finite.size else 0.0
    return bound >= float(np.finfo(p.args[0].values.dtype).max) / 2


def _broadcast_softmax(p: Any) -> bool:
    """A softmax or log_softmax result broadcast to a bigger shape."""
    return any("softmax(" in a.text and a.tensor.numel() < p.numel for a in p.args)


KNOWN_BUGS: tuple[KnownBug, ...] = (
    KnownBug("integer-pow", "issue 13: integer ** integer tensor goes through float exp2/log2 "
             "(5 ** 5 is 3124 on the numpy device)",
             step=lambda p: p.dtype in ("int64", "int32", "int8", "uint8") and bool(re.search(r"\*\* [xv]\d", p.text))),
    KnownBug("rounding-negative-zero", "issue 13: floor/ceil/trunc of -0.0 or of (-1, 0) give +0.0 on the numpy "
             "device (torch and the cpu device: -0.0)", step=_rounds_negative_fraction),
    KnownBug("gemm-overflow-nan", "issue 13: a GEMM whose products overflow gives inf on the cpu device, NaN on "
             "the numpy device (fused multiply-add never rounds a product to inf)", step=_overflowing_matmul),
    KnownBug("softmax-broadcast-row", "issue 13: a softmax/log_softmax result broadcast over a size-1 dim raises "
             "KeyError 'row47' in the cpu scheduler", step=_broadcast_softmax),
    KnownBug("compile-argument-leaf", "issue 22: inside tg.compile, `x.detach().requires_grad_()` of an argument "
             "becomes a constant zero (gradients with respect to arguments are zero)", mode="compile-grad"),
    KnownBug("sgd-momentum-compile", "issue 13: SGD's first-step momentum branch is fixed when traced, so under "
             "tg.compile momentum and Nesterov are dropped",
             training=lambda case, mode: mode == "compile" and case.optimizer.startswith("SGD") and
             "momentum" in case.optimizer),
    KnownBug("scatter-add-one-element", "issue 13: scatter_add with a one-element index gives zeros on the cpu "
             "device (batch-1 cross_entropy has zero gradients)",
             training=lambda case, mode: case.loss == "cross_entropy" and case.batch == 1),
)


def active() -> tuple[KnownBug, ...]:
    """The entries in force: all of them, unless TG_FUZZ_KNOWN_BUGS is set."""
    return () if os.environ.get("TG_FUZZ_KNOWN_BUGS") else KNOWN_BUGS


def skipped_step(proposal: Any) -> KnownBug | None:
    return next((b for b in active() if b.step is not None and b.step(proposal)), None)


def skipped_mode(mode: str) -> KnownBug | None:
    return next((b for b in active() if b.mode == mode), None)


def skipped_training(case: Any, mode: str) -> KnownBug | None:
    return next((b for b in active() if b.training is not None and b.training(case, mode)), None)
