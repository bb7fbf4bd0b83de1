"""`tg.distributed`: torch.distributed's names on tg tensors (see `collectives`); data-parallel training in
`tg.nn.parallel.DistributedDataParallel`, sharding in `tg.data.DistributedSampler`."""

from typing import Any

from tensorgraphs.distributed.collectives import (
    all_gather,
    all_reduce,
    barrier,
    broadcast,
    destroy_process_group,
    get_rank,
    get_world_size,
    init_process_group,
    is_available,
    is_initialized,
)
from tensorgraphs.distributed.host_collectives import (
    ALL_REDUCE_MEAN,
    BROADCAST_FROM_RANK_0,
    FINISH_COLLECTIVE,
    START_ALL_REDUCE_MEAN,
)

__all__ = ["ALL_REDUCE_MEAN", "BROADCAST_FROM_RANK_0", "FINISH_COLLECTIVE", "START_ALL_REDUCE_MEAN", "ReduceOp",
           "all_gather", "all_reduce", "barrier", "broadcast", "destroy_process_group", "get_rank", "get_world_size",
           "init_process_group", "is_available", "is_initialized"]


def __getattr__(name: str) -> Any:
    if name == "ReduceOp":  # torch's, imported only when asked for (torch is an optional dependency)
        from tensorgraphs.distributed.collectives import torch_distributed

        return torch_distributed().ReduceOp
    raise AttributeError(f"module 'tensorgraphs.distributed' has no attribute {name!r}")
