"""Batches grouped K at a time, to feed a compiled step's `steps` (K steps in one native call)."""

from __future__ import annotations

from typing import Any, Iterable, Iterator, Mapping

import numpy as np

from tensorgraphs.data.dataloader import default_collate
from tensorgraphs.frontend.tensor import Tensor


def _layout(batch: Any) -> Any:
    """What must agree for batches to stack: the structure and every tensor's shape and dtype."""
    if isinstance(batch, (Tensor, np.ndarray)):
        return (type(batch).__name__, tuple(batch.shape), str(batch.dtype))
    if isinstance(batch, Mapping):
        return tuple((key, _layout(value)) for key, value in batch.items())
    if isinstance(batch, (tuple, list)):
        return (type(batch).__name__, tuple(_layout(item) for item in batch))
    return ("value", type(batch).__name__)


def grouped(batches: Iterable[Any], steps: int) -> Iterator[Any]:
    """Consecutive batches stacked `steps` at a time along a new leading axis (`default_collate`, as a DataLoader
    stacks samples): `for xs, ys in grouped(loader, 8): losses = train_step.steps(xs, ys)`. A group ends early
    where the next batch's shapes differ (a short last batch) or the batches run out."""
    if steps < 1:
        raise ValueError(f"steps must be at least 1, got {steps}")
    group: list[Any] = []
    for batch in batches:
        if group and (len(group) == steps or _layout(batch) != _layout(group[0])):
            yield default_collate(group)
            group = []
        group.append(batch)
    if group:
        yield default_collate(group)
