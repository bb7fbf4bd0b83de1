"""Samplers: the order in which a DataLoader visits a dataset, and how it groups indices into batches."""

from __future__ import annotations

from typing import Any, Iterator, Sequence

import numpy as np

from tensorgraphs.frontend import creation


def as_generator(generator: Any) -> np.random.Generator | None:
    """An int seed, a numpy Generator, or anything with `initial_seed()` (a torch.Generator) -> a numpy Generator.

    None keeps tg's own random stream (`tg.manual_seed` makes it reproducible).
    """
    if generator is None or isinstance(generator, np.random.Generator):
        return generator
    if isinstance(generator, (int, np.integer)):
        return np.random.default_rng(int(generator))
    if hasattr(generator, "initial_seed"):
        return np.random.default_rng(int(generator.initial_seed()))
    raise TypeError(f"generator must be None, an int seed or a numpy Generator, got {type(generator).__name__}")


def permutation(n: int, generator: Any = None) -> np.ndarray:
    rng = as_generator(generator)
    return creation.randperm(n).numpy() if rng is None else rng.permutation(n)


class SequentialSampler:
    def __init__(self, data_source: Sequence[Any]) -> None:
        self.data_source = data_source

    def __iter__(self) -> Iterator[int]:
        return iter(range(len(self.data_source)))

    def __len__(self) -> int:
        return len(self.data_source)


class RandomSampler:
    """A new permutation every epoch, drawn from one generator that advances across epochs."""

    def __init__(self, data_source: Sequence[Any], generator: Any = None) -> None:
        self.data_source = data_source
        self.generator = as_generator(generator)

    def __iter__(self) -> Iterator[int]:
        return iter(permutation(len(self.data_source), self.generator).tolist())

    def __len__(self) -> int:
        return len(self.data_source)


class BatchSampler:
    def __init__(self, sampler: Any, batch_size: int, drop_last: bool) -> None:
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size <= 0:
            raise ValueError(f"batch_size should be a positive integer value, but got batch_size={batch_size}")
        self.sampler, self.batch_size, self.drop_last = sampler, batch_size, drop_last

    def __iter__(self) -> Iterator[list[int]]:
        batch: list[int] = []
        for index in self.sampler:
            batch.append(index)
            if len(batch) == self.batch_size:
                yield batch
                batch = []
        if batch and not self.drop_last:
            yield batch

    def __len__(self) -> int:
        full, rest = divmod(len(self.sampler), self.batch_size)
        return full + (1 if rest and not self.drop_last else 0)
