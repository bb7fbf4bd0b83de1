"""Batches grouped K at a time, to feed a compiled step's `steps` (K steps in one native call)."""

from __future__ import annotations

from typing import Any, Iterable, Iterator, Mapping

import numpy as np

from tensorgraphs.frontend.tensor import Tensor


def _layout(batch: Any) -> Any:
    """What must agree for batches to stack: the structure and every tensor's shape and dtype."""
    if isinstance(batch, (Tensor, np.ndarray)):
        return (type(batch).__name__, tuple(batch.shape), str(batch.dtype))
    if isinstance(batch, Mapping):
        return tuple((key, _layout(value)) for key, value in batch.items())
    if isinstance(batch, (tuple, list)):
        return (type(batch).__name__, tuple(_layout(item) for item in batch))
    return ("value", repr(batch))


def _stack(group: list[Any]) -> Any:
    first = group[0]
    if isinstance(first, Tensor):
        return Tensor.from_numpy(np.stack([t._value() for t in group]), first.dtype)
    if isinstance(first, np.ndarray):
        return np.stack(group)
    if isinstance(first, Mapping):
        return {key: _stack([batch[key] for batch in group]) for key in first}
    if isinstance(first, tuple) and hasattr(first, "_fields"):
        return type(first)(*(_stack(list(column)) for column in zip(*group)))
    if isinstance(first, (tuple, list)):
        return type(first)(_stack(list(column)) for column in zip(*group))
    return first  # a non-tensor value, the same in every batch of the group


def grouped(batches: Iterable[Any], steps: int) -> Iterator[Any]:
    """Consecutive batches stacked `steps` at a time along a new leading axis (tensors, and tuples, lists and
    dicts of them): `for xs, ys in grouped(loader, 8): losses = train_step.steps(xs, ys)`. A group ends early
    where the next batch's shapes differ (a short last batch) or the batches run out."""
    if steps < 1:
        raise ValueError(f"steps must be at least 1, got {steps}")
    group: list[Any] = []
    for batch in batches:
        if group and (len(group) == steps or _layout(batch) != _layout(group[0])):
            yield _stack(group)
            group = []
        group.append(batch)
    if group:
        yield _stack(group)
