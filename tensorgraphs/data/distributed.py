"""`DistributedSampler`: each rank of a data-parallel run visits its own share of the dataset (torch's rules)."""

from __future__ import annotations

import math
from typing import Iterator, Sized

import numpy as np


class DistributedSampler:
    """torch.utils.data.DistributedSampler: the indices (shuffled with `seed + epoch` if `shuffle`; call
    `set_epoch` each epoch) padded by repeating the first ones to a multiple of `num_replicas` (or, with
    `drop_last`, cut down to one), then every `num_replicas`-th from `rank`. Every rank draws the same
    permutation (numpy's generator: the order differs from torch's, the rules do not). `num_replicas` and `rank`
    default to the process group's world size and rank."""

    def __init__(self, dataset: Sized, num_replicas: int | None = None, rank: int | None = None,
                 shuffle: bool = True, seed: int = 0, drop_last: bool = False) -> None:
        if num_replicas is None or rank is None:
            from tensorgraphs import distributed

            if not distributed.is_initialized():
                raise RuntimeError("DistributedSampler needs num_replicas and rank, or an initialized process "
                                   "group (tg.distributed.init_process_group)")
            num_replicas = distributed.get_world_size() if num_replicas is None else num_replicas
            rank = distributed.get_rank() if rank is None else rank
        if num_replicas < 1:
            raise ValueError(f"num_replicas must be at least 1, got {num_replicas}")
        if rank >= num_replicas or rank < 0:
            raise ValueError(f"Invalid rank {rank}, rank should be in the interval [0, {num_replicas - 1}]")
        self.dataset, self.num_replicas, self.rank = dataset, num_replicas, rank
        self.shuffle, self.seed, self.drop_last, self.epoch = shuffle, seed, drop_last, 0
        size = len(dataset)
        if drop_last and size % num_replicas:
            self.num_samples = math.ceil((size - num_replicas) / num_replicas)
        else:
            self.num_samples = math.ceil(size / num_replicas)
        self.total_size = self.num_samples * num_replicas

    def __iter__(self) -> Iterator[int]:
        size = len(self.dataset)
        if self.shuffle:
            indices = np.random.default_rng(self.seed + self.epoch).permutation(size).tolist()
        else:
            indices = list(range(size))
        if self.drop_last:
            indices = indices[:self.total_size]
        elif indices:
            padding = self.total_size - len(indices)
            indices += (indices * math.ceil(padding / len(indices)))[:padding]
        return iter(indices[self.rank:self.total_size:self.num_replicas])

    def __len__(self) -> int:
        return self.num_samples

    def set_epoch(self, epoch: int) -> None:
        """The epoch whose permutation the next iteration uses (the same on every rank)."""
        self.epoch = epoch

    def __repr__(self) -> str:
        return (f"DistributedSampler(num_replicas={self.num_replicas}, rank={self.rank}, shuffle={self.shuffle}, "
                f"seed={self.seed}, drop_last={self.drop_last})")

