"""The collectives of data-parallel training as host functions: compiled programs call them (`graph.host_call`)
and eager code calls them directly, one mechanism either way."""

from __future__ import annotations

from typing import Any

import numpy as np

from tensorgraphs.distributed.collectives import (
    bits,
    broadcast_array,
    finish,
    get_world_size,
    reduce_array,
    start_reducing_array,
)
from tensorgraphs.runtime.host_calls import register_host_function

ALL_REDUCE_MEAN = "distributed.all_reduce_mean"
"""The output is the mean over the default process group of the sources, one after the other."""
BROADCAST_FROM_RANK_0 = "distributed.broadcast_from_rank_0"
"""The output is rank 0's sources, one after the other."""
START_ALL_REDUCE_MEAN = "distributed.start_all_reduce_mean"
"""Starts ALL_REDUCE_MEAN into the output, going on while the program runs on: FINISH_COLLECTIVE gives the result."""
FINISH_COLLECTIVE = "distributed.finish_collective"
"""The output is the (one) source once the collective started in it has finished."""

_in_flight: dict[int, Any] = {}
"""Address of an array a collective is working in -> what `finish` waits for."""


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


def start_all_reduce_mean(sources: list[np.ndarray], output: np.ndarray) -> None:
    """`all_reduce_mean`, returning as soon as the sum has started (see FINISH_COLLECTIVE)."""
    _gather(sources, output, get_world_size())
    _in_flight[output.ctypes.data] = start_reducing_array(output)


def finish_collective(sources: list[np.ndarray], output: np.ndarray) -> None:
    """Wait for the collective started in `sources[0]`, then copy its result to `output`."""
    (source,) = sources
    started = _in_flight.pop(source.ctypes.data, None)
    if started is None:
        raise RuntimeError("finish_collective: no collective was started in this array (a host call out of order)")
    finish(started)
    np.copyto(output, source)


def broadcast_from_rank_0(sources: list[np.ndarray], output: np.ndarray) -> None:
    """`output` = rank 0's (flat) `sources`, one after the other."""
    _gather(sources, output)
    broadcast_array(bits(output), 0)


register_host_function(ALL_REDUCE_MEAN, all_reduce_mean)
register_host_function(BROADCAST_FROM_RANK_0, broadcast_from_rank_0)
register_host_function(START_ALL_REDUCE_MEAN, start_all_reduce_mean)
register_host_function(FINISH_COLLECTIVE, finish_collective)
