"""`DataLoader`: batches from a dataset, in order or shuffled, collated into tg tensors."""

from __future__ import annotations

from typing import Any, Callable, Iterator, Mapping, Sequence

import numpy as np

from tensorgraphs import dtypes
from tensorgraphs.data.sampling import BatchSampler, RandomSampler, SequentialSampler
from tensorgraphs.frontend.movement import stack
from tensorgraphs.frontend.tensor import Tensor, is_scalar

# torch's multi-process loading options: accepted; loading is single-process (batches are host slices)
_WORKER_OPTIONS = {"timeout", "worker_init_fn", "multiprocessing_context", "prefetch_factor", "persistent_workers",
                   "pin_memory_device", "in_order"}


def default_collate(batch: Sequence[Any]) -> Any:
    """torch's default_collate: stack tensors and arrays, numbers become a tensor, containers recurse."""
    first = batch[0]
    if isinstance(first, Tensor):
        return stack(list(batch))
    if isinstance(first, np.ndarray):
        return Tensor.from_numpy(np.stack(batch))
    if is_scalar(first):
        kind = dtypes.float64 if isinstance(first, (float, np.floating)) else None
        return Tensor.from_numpy(np.asarray(batch), kind)
    if isinstance(first, Mapping):
        return {key: default_collate([sample[key] for sample in batch]) for key in first}
    if isinstance(first, tuple) and hasattr(first, "_fields"):
        return type(first)(*(default_collate(list(column)) for column in zip(*batch)))
    if isinstance(first, (tuple, list)):
        if len({len(sample) for sample in batch}) != 1:
            raise RuntimeError("each element in list of batch should be of equal size")
        return [default_collate(list(column)) for column in zip(*batch)]
    return list(batch)


class DataLoader:
    """torch.utils.data.DataLoader's single-process core: batch_size, shuffle, sampler, drop_last, collate_fn.

    `generator` (an int seed, a numpy Generator or a torch.Generator's seed) fixes the shuffle
    order; without it the order comes from tg's random stream (`tg.manual_seed`).
    """

    def __init__(self, dataset: Any, batch_size: int | None = 1, shuffle: bool | None = None, sampler: Any = None,
                 batch_sampler: Any = None, num_workers: int = 0, collate_fn: Callable[[list[Any]], Any] | None = None,
                 pin_memory: bool = False, drop_last: bool = False, generator: Any = None,
                 **worker_options: Any) -> None:
        unknown = set(worker_options) - _WORKER_OPTIONS
        if unknown:
            raise TypeError(f"DataLoader got an unexpected keyword argument '{sorted(unknown)[0]}'")
        if sampler is not None and shuffle:
            raise ValueError("sampler option is mutually exclusive with shuffle")
        if batch_sampler is not None and (batch_size != 1 or shuffle or sampler is not None or drop_last):
            raise ValueError("batch_sampler option is mutually exclusive with batch_size, shuffle, sampler, "
                             "and drop_last")
        self.dataset, self.batch_size, self.drop_last = dataset, batch_size, drop_last
        self.num_workers, self.pin_memory, self.generator = num_workers, pin_memory, generator
        if sampler is None:
            sampler = RandomSampler(dataset, generator) if shuffle else SequentialSampler(dataset)
        self.sampler = sampler
        if batch_sampler is None and batch_size is not None:
            batch_sampler = BatchSampler(sampler, batch_size, drop_last)
        self.batch_sampler = batch_sampler
        self.collate_fn = collate_fn if collate_fn is not None else (
            default_collate if batch_sampler is not None else (lambda sample: sample))

    def _fetch(self, indices: list[int]) -> Any:
        if self.collate_fn is default_collate and hasattr(self.dataset, "collated_batch"):
            return self.dataset.collated_batch(indices)
        if hasattr(self.dataset, "__getitems__"):
            return self.collate_fn(self.dataset.__getitems__(indices))
        return self.collate_fn([self.dataset[i] for i in indices])

    def __iter__(self) -> Iterator[Any]:
        if self.batch_sampler is None:
            for index in self.sampler:
                yield self.collate_fn(self.dataset[index])
            return
        for indices in self.batch_sampler:
            yield self._fetch(list(indices))

    def __len__(self) -> int:
        return len(self.batch_sampler if self.batch_sampler is not None else self.sampler)
