"""The gradient average of data-parallel training, as a host function compiled programs call
(`graph.host_call`) and eager code calls directly: one mechanism either way."""

from __future__ import annotations

import numpy as np

from tensorgraphs.distributed.collectives import get_world_size, reduce_array
from tensorgraphs.runtime.host_calls import register_host_function

ALL_REDUCE_MEAN = "distributed.all_reduce_mean"
"""The host function's name: the output is the mean of the source over the default process group."""


def all_reduce_mean(sources: list[np.ndarray], output: np.ndarray) -> None:
    """`output` = the mean over the ranks of the (flat) `sources` one after the other: torch's bucket, copied
    into one array. As torch's default hook, divided by the world size first, then summed (for a power-of-two
    world size both are exact, so the order never shows)."""
    world, start = get_world_size(), 0
    for source in sources:  # copied and divided in one pass
        np.divide(source, world, out=output[start:start + source.size])
        start += source.size
    reduce_array(output)


register_host_function(ALL_REDUCE_MEAN, all_reduce_mean)
