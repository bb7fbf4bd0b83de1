"""Datasets with torch.utils.data's names: `Dataset`, `TensorDataset`, `Subset`, `random_split`."""

from __future__ import annotations

from typing import Any, Generic, Sequence, TypeVar

import numpy as np

from tensorgraphs.data.sampling import permutation
from tensorgraphs.frontend.tensor import Tensor

Sample = TypeVar("Sample")


class Dataset(Generic[Sample]):
    """A map-style dataset: `__getitem__(index)` and `__len__`."""

    def __getitem__(self, index: int) -> Sample:
        raise NotImplementedError(f"{type(self).__name__} must implement __getitem__")

    def __len__(self) -> int:
        raise NotImplementedError(f"{type(self).__name__} must implement __len__")


class TensorDataset(Dataset[tuple[Tensor, ...]]):
    """Samples are the i-th rows of each tensor; the DataLoader slices whole batches at once (`collated_batch`).

    The tensors are realized once into host arrays, so every batch is a fresh input buffer of
    the same shape and dtype: what a compiled training step wants to be fed.
    """

    def __init__(self, *tensors: Tensor | np.ndarray) -> None:
        sizes = {len(t) for t in tensors}
        if len(sizes) > 1:
            raise ValueError(f"Size mismatch between tensors: first dims {[len(t) for t in tensors]}")
        self.tensors = tuple(tensors)
        self._arrays = [np.asarray(t.detach()._value() if isinstance(t, Tensor) else t) for t in tensors]
        self._dtypes = [t.dtype if isinstance(t, Tensor) else None for t in tensors]

    def __len__(self) -> int:
        return len(self._arrays[0]) if self._arrays else 0

    def __getitem__(self, index: int) -> tuple[Tensor, ...]:
        return tuple(Tensor.from_numpy(a[index], dt) for a, dt in zip(self._arrays, self._dtypes))

    def collated_batch(self, indices: Sequence[int]) -> list[Tensor]:
        """What default_collate would make of these samples (a list, as torch), in one slice per tensor."""
        rows = np.asarray(indices, dtype=np.int64)
        return list(Tensor.from_numpy(a[rows], dt) for a, dt in zip(self._arrays, self._dtypes))


class Subset(Dataset[Sample]):
    def __init__(self, dataset: Dataset[Sample], indices: Sequence[int]) -> None:
        self.dataset, self.indices = dataset, list(indices)

    def __getitem__(self, index: int) -> Sample:
        return self.dataset[self.indices[index]]

    def __len__(self) -> int:
        return len(self.indices)


def random_split(dataset: Dataset[Sample], lengths: Sequence[int | float], generator: Any = None) -> list[Subset]:
    """Disjoint random subsets of the given lengths (or fractions, as torch)."""
    total = len(dataset)
    if all(isinstance(n, float) for n in lengths) and abs(sum(lengths) - 1) < 1e-9:
        counts = [int(total * f) for f in lengths]
        for i in range(total - sum(counts)):
            counts[i % len(counts)] += 1
        lengths = counts
    if sum(lengths) != total:
        raise ValueError("Sum of input lengths does not equal the length of the input dataset!")
    order = permutation(total, generator).tolist()
    bounds = np.cumsum([0, *lengths])
    return [Subset(dataset, order[start:end]) for start, end in zip(bounds[:-1], bounds[1:])]
