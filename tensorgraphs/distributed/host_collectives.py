"""The collectives of data-parallel training as host functions: compiled programs call them (`graph.host_call`)
and eager code calls them directly, one mechanism either way."""

from __future__ import annotations

import numpy as np

from tensorgraphs.distributed.collectives import bits, broadcast_array, get_world_size, reduce_array
from tensorgraphs.runtime.host_calls import register_host_function

ALL_REDUCE_MEAN = "distributed.all_reduce_mean"
"""The output is the mean over the default process group of the sources, one after the other."""
BROADCAST_FROM_RANK_0 = "distributed.broadcast_from_rank_0"
"""The output is rank 0's sources, one after the other."""


def _gather(sources: list[np.ndarray], output: np.ndarray, scale: int = 1) -> None:
    """The sources one after the other in `output` (divided by `scale`), in one pass."""
    start = 0
    for source in sources:
        part = output[start:start + source.size]
        if scale == 1:
            np.copyto(part, source)
        else:
            np.divide(source, scale, out=part)
        start += source.size


def all_reduce_mean(sources: list[np.ndarray], output: np.ndarray) -> None:
    """`output` = the mean over the ranks of the (flat) `sources` one after the other: torch's bucket, copied
    into one array. As torch's default hook, divided by the world size first, then summed (for a power-of-two
    world size both are exact, so the order never shows)."""
    _gather(sources, output, get_world_size())
    reduce_array(output)


def broadcast_from_rank_0(sources: list[np.ndarray], output: np.ndarray) -> None:
    """`output` = rank 0's (flat) `sources`, one after the other."""
    _gather(sources, output)
    broadcast_array(bits(output), 0)


register_host_function(ALL_REDUCE_MEAN, all_reduce_mean)
register_host_function(BROADCAST_FROM_RANK_0, broadcast_from_rank_0)
