"""torch.multinomial: category indices drawn from rows of non-negative weights, on the graph.

Both ways are one exponential race: category j arrives at time Exp(1) / w_j, and the first arrivals win
(the k largest of w_j / Exp(1)). Without replacement one race gives all k draws, in the order weighted
sampling without replacement draws them (what torch computes too); with replacement every draw runs its own
race, whose winner is category j with probability w_j / sum(w). Zero weights never win while a positive
weight is left. The arrivals come from the random stream, so `tg.manual_seed` reproduces the draws.

Like torch, eager calls read the weights to refuse NaN, infinite or negative ones and rows that sum to zero
(one evaluation, which the draws then reuse); inside `tg.compile` the weights are not known when tracing, and
such rows draw arbitrary categories.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tensorgraphs import dtypes
from tensorgraphs.errors import ArgumentError, DTypeError, ShapeError, fail
from tensorgraphs.frontend import elementwise as ew
from tensorgraphs.frontend import movement as mv
from tensorgraphs.frontend import random as rng
from tensorgraphs.frontend import reduce as rd
from tensorgraphs.frontend.sorting import topk
from tensorgraphs.frontend.tensor import Tensor, cast, held
from tensorgraphs.runtime import tracing


def _check(probs: Tensor, num_samples: int, replacement: bool) -> None:
    if not isinstance(probs, Tensor) or not probs.dtype.is_floating_point:
        got = probs.dtype.name if isinstance(probs, Tensor) else type(probs).__name__
        fail("multinomial", f"expected a floating point tensor of probabilities, got {got}", kind=DTypeError)
    if probs.ndim not in (1, 2) or probs.shape[-1] == 0:
        fail("multinomial", f"expected a 1-D or 2-D tensor with at least one category, got shape {probs.shape}",
             kind=ShapeError)
    if not isinstance(num_samples, int) or num_samples <= 0:
        fail("multinomial", f"num_samples must be a positive integer, got {num_samples!r}", kind=ArgumentError)
    if not replacement and num_samples > probs.shape[-1]:
        fail("multinomial", f"cannot draw {num_samples} samples without replacement from {probs.shape[-1]} "
             "categories", kind=ArgumentError)


def _checked_values(probs: Tensor) -> Tensor:
    """`probs` evaluated, after torch's checks of its values (module docstring)."""
    values = probs.detach().numpy()
    with np.errstate(invalid="ignore"):
        if not np.isfinite(values).all() or (values < 0).any():
            fail("multinomial", "probability tensor contains either inf, nan or element < 0", kind=ArgumentError)
        if (values.sum(-1) <= 0).any():
            fail("multinomial", "invalid multinomial distribution (sum of probabilities <= 0)", kind=ArgumentError)
    return held(values, probs.dtype)


def multinomial(probs: Tensor, num_samples: int, replacement: bool = False, *, generator: Any = None) -> Tensor:
    _check(probs, num_samples, replacement)
    if tracing.active() is None:
        probs = _checked_values(probs)
    weights = cast(mv.reshape(probs.detach(), (-1, 1, probs.shape[-1])), dtypes.float64)
    races = num_samples if replacement else 1
    shape = (weights.shape[0], races, weights.shape[-1])
    arrivals = ew.neg(ew.log1p(ew.neg(rng.rand(shape, dtypes.float64, generator))))  # Exp(1), may be 0
    speed = ew.where(ew.gt(weights, 0), ew.div(weights, arrivals), -1.0)  # zero weights come last
    picks = rd.argmax(speed, -1) if replacement else topk(mv.squeeze(speed, 1), num_samples, -1).indices
    return mv.reshape(picks, probs.shape[:-1] + (num_samples,))
