"""torch.nn.parallel's names: `DistributedDataParallel` (needs torch.distributed: `tensorgraphs[distributed]`)."""

from tensorgraphs.nn.parallel.distributed import DistributedDataParallel

__all__ = ["DistributedDataParallel"]
