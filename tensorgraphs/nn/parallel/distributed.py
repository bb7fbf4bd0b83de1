"""`DistributedDataParallel`: torch's data-parallel wrapper, on `tg.distributed` (gloo).

At wrap, every rank takes rank 0's parameters and buffers. Each backward() then averages the gradients over
the ranks, bucket by bucket, as soon as every gradient of a bucket has been accumulated (a post-accumulate-grad
hook). The buckets are torch's (`assign_buckets`: about `bucket_cap_mb` each), over the parameters in the order
backward produces their gradients, which the first forward finds in its graph (torch rebuilds its buckets in that
order after the first iteration). A bucket's gradients are copied into one flat array and averaged there: in
eager code at once (`distributed.ALL_REDUCE_MEAN`); inside a function `tg.compile` traces, as two `host_call`
nodes of the graph: one reading the gradients starts the all-reduce as soon as the backward kernels have produced
them, the other waits for it before the optimizer kernels read the bucket, and the kernels between (the rest of
the backward pass, the optimizer's update of the buckets averaged before) run while the collective proceeds in
torch's background thread (`memory.order.place_host_calls`). Module buffers (batch norm's running statistics)
are broadcast from rank 0 before each forward the same two ways. Every rank issues the collectives in the same
order: in a compiled step each waits for the previous one (its `after` source), so no schedule can reorder them.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Iterator

import numpy as np

from tensorgraphs.distributed import (
    BROADCAST_FROM_RANK_0,
    FINISH_COLLECTIVE,
    START_ALL_REDUCE_MEAN,
    broadcast,
    is_initialized,
)
from tensorgraphs.distributed.collectives import broadcast_array
from tensorgraphs.distributed.host_collectives import all_reduce_mean
from tensorgraphs.errors import AutogradError, UnsupportedError, fail
from tensorgraphs.frontend import movement
from tensorgraphs.frontend.grad_mode import no_grad
from tensorgraphs.frontend.tensor import Tensor, host_buffer
from tensorgraphs.graph.host_call import host_call
from tensorgraphs.graph.node import Node, toposort
from tensorgraphs.graph.ops import Op
from tensorgraphs.nn.module import Module
from tensorgraphs.nn.parameter import Parameter
from tensorgraphs.runtime import tracing

DEFAULT_BUCKET_CAP_MB = 25.0
FIRST_BUCKET_BYTES = 1 << 20
"""torch's limit for the first bucket with the default bucket_cap_mb (`dist._DEFAULT_FIRST_BUCKET_BYTES`); with
the default, the last bucket is as small (see `assign_buckets`)."""


@dataclass
class _Bucket:
    """Parameters whose gradients are averaged together, as one flat array, in this order."""

    params: list[Parameter]
    ready: set[int] = field(default_factory=set)  # ids of those accumulated since the bucket was last averaged


def assign_buckets(params: list[Parameter], first_bytes: float, cap_bytes: float,
                   last_bytes: float = 0.0) -> list[_Bucket]:
    """torch's buckets over `params` in the order their gradients are ready: each filled until it holds at least
    its limit (`first_bytes` for the first, so that the last layers' gradients are sent early, `cap_bytes` after),
    or the dtype changes. With `last_bytes`, the parameters ready last form a bucket of their own as soon as they
    hold that much: in a compiled step only that bucket's all-reduce is left when backward ends, and the optimizer
    updates the others meanwhile (torch's eager optimizer step cannot start before every bucket is averaged)."""
    tail = 0  # how many of the last parameters form the last bucket
    size = 0
    while last_bytes and tail < len(params) and size < last_bytes and params[-1 - tail].dtype is params[-1].dtype:
        size += _nbytes(params[-1 - tail])
        tail += 1
    buckets: list[_Bucket] = []
    size = 0
    for param in params[:len(params) - tail]:
        limit = first_bytes if len(buckets) == 1 else cap_bytes
        if not buckets or size >= limit or buckets[-1].params[0].dtype is not param.dtype:
            buckets.append(_Bucket([]))
            size = 0
        buckets[-1].params.append(param)
        size += _nbytes(param)
    return buckets + ([_Bucket(params[len(params) - tail:])] if tail else [])


def _nbytes(param: Parameter) -> int:
    return param.numel() * param.dtype.itemsize


def ready_order(params: list[Parameter], outputs: list[Node]) -> list[Parameter]:
    """`params` (in registration order) in the order a backward from `outputs` produces their gradients: the
    reverse of the order of their first use in the forward graph (a gradient is complete once backward has passed
    its earliest use), parameters first used together (a linear layer's weight and bias) in reverse registration
    order as torch's; those the graph does not read last."""
    first_use: dict[int, int] = {}
    for position, node in enumerate(toposort(outputs)):
        for src in node.src:
            leaf = src.arg.grad_leaf() if src.op is Op.BUFFER and src.arg.grad_leaf is not None else None
            if leaf is not None:
                first_use.setdefault(id(leaf), position)
    return sorted(reversed(params), key=lambda p: (id(p) not in first_use, -first_use.get(id(p), 0)))


class DistributedDataParallel(Module):
    """torch.nn.parallel.DistributedDataParallel for tg modules on CPU (gloo); see the module docstring.

    `bucket_cap_mb` (default 25) bounds a bucket; `broadcast_buffers` broadcasts rank 0's module buffers before
    each forward; `no_sync()` skips the averaging (gradients accumulate locally until a backward
    outside it). Every parameter that requires grad must get a gradient in each backward (torch's default,
    `find_unused_parameters=False`).
    """

    def __init__(self, module: Module, device_ids: Any = None, output_device: Any = None, dim: int = 0,
                 broadcast_buffers: bool = True, process_group: Any = None, bucket_cap_mb: float | None = None,
                 find_unused_parameters: bool = False) -> None:
        super().__init__()
        if not is_initialized():
            fail("DistributedDataParallel", "the default process group is not initialized: call "
                 "tg.distributed.init_process_group('gloo') first", kind=UnsupportedError)
        if device_ids not in (None, []) or output_device is not None or dim != 0 or process_group is not None:
            fail("DistributedDataParallel", "device_ids, output_device, dim and process_group are not supported: "
                 "tensorgraphs runs on the CPU of each process, over the default group", kind=UnsupportedError)
        if find_unused_parameters:
            fail("DistributedDataParallel", "find_unused_parameters=True is not supported: every parameter that "
                 "requires grad must get a gradient in each backward", kind=UnsupportedError)
        self.module = module
        self.broadcast_buffers = broadcast_buffers
        self.bucket_cap_mb = DEFAULT_BUCKET_CAP_MB if bucket_cap_mb is None else bucket_cap_mb
        cap_bytes = self.bucket_cap_mb * 2**20
        self.require_backward_grad_sync = True
        with no_grad():
            for tensor in [*module.parameters(), *module.buffers()]:
                broadcast(tensor, src=0)
        default = bucket_cap_mb is None
        self._limits = (FIRST_BUCKET_BYTES if default else cap_bytes, cap_bytes, FIRST_BUCKET_BYTES if default else 0)
        self._params = [p for p in module.parameters() if p.requires_grad]
        self._assign_buckets(self._params[::-1])  # until the first forward shows the order of use
        self._rebuilt = False
        self._next_bucket = 0  # the bucket to average next in this backward
        self._last_collective: Node | None = None  # while tracing: the previous collective of this step
        for param in self._params:
            param.register_post_accumulate_grad_hook(self._gradient_ready)

    def _assign_buckets(self, ready: list[Parameter]) -> None:
        self._buckets = assign_buckets(ready, *self._limits)
        self._bucket_of = {id(p): bucket for bucket in self._buckets for p in bucket.params}

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        self._require_finished_reduction()
        self._last_collective = None
        if self.broadcast_buffers:
            self._broadcast_buffers()
        output = self.module(*args, **kwargs)
        if not self._rebuilt:
            self._rebuild_buckets(ready_order(self._params, [t.node for t in _tensors_in(output)]))
        return output

    def _rebuild_buckets(self, ready: list[Parameter]) -> None:
        """Buckets over the parameters in rank 0's `ready` order (as torch's, so that every rank's buckets match
        even where the ranks' first forwards differ)."""
        number = {id(p): i for i, p in enumerate(self._params)}
        order = np.array([number[id(p)] for p in ready], np.int64)
        broadcast_array(order, 0)
        self._assign_buckets([self._params[i] for i in order])
        self._rebuilt = True

    def _broadcast_buffers(self) -> None:
        """Every rank's module buffers become rank 0's."""
        with no_grad():
            for buffer in self.module.buffers():
                if tracing.active() is None:
                    broadcast(buffer, src=0)
                    continue
                self._last_collective = host_call(BROADCAST_FROM_RANK_0, [buffer.node], self._last_collective)
                buffer.assign(movement.reshape(Tensor(self._last_collective), buffer.shape))

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Backward passes inside accumulate gradients without averaging them; the first backward after it
        averages what has accumulated."""
        previous = self.require_backward_grad_sync
        self.require_backward_grad_sync = False
        try:
            yield
        finally:
            self.require_backward_grad_sync = previous

    @property
    def bucket_sizes(self) -> list[int]:
        """Elements per bucket, in the order they are averaged (from the first forward on, the order backward
        produces their gradients)."""
        return [sum(p.numel() for p in bucket.params) for bucket in self._buckets]

    def _gradient_ready(self, param: Tensor) -> None:
        """Average every bucket whose gradients are all accumulated, in bucket order (as torch launches them: the
        last layers' first, since their gradients are computed first), each after the ones before it. A compiled
        step is traced again when called with the other `no_sync()` state."""
        syncing = self.require_backward_grad_sync
        tracing.note_condition(lambda: self.require_backward_grad_sync == syncing)
        if not syncing:
            return
        self._bucket_of[id(param)].ready.add(id(param))
        buckets = self._buckets
        while self._next_bucket < len(buckets) and len(buckets[self._next_bucket].ready) == len(
                buckets[self._next_bucket].params):
            buckets[self._next_bucket].ready.clear()
            self._average(buckets[self._next_bucket])
            self._next_bucket += 1
        if self._next_bucket == len(buckets):
            self._next_bucket = 0

    def _average(self, bucket: _Bucket) -> None:
        """Replace each gradient of `bucket` by its mean over the ranks."""
        grads = [p.grad for p in bucket.params]
        if tracing.active() is not None:
            started = host_call(START_ALL_REDUCE_MEAN, [g.node for g in grads], self._last_collective, "early")
            self._last_collective = started
            averaged = Tensor(host_call(FINISH_COLLECTIVE, [started], placement="late"))
            parts = [movement.reshape(movement.narrow(averaged, 0, start, p.numel()), p.shape)
                     for p, start in zip(bucket.params, _offsets(bucket.params))]
        else:
            flat = np.empty(sum(p.numel() for p in bucket.params), bucket.params[0].dtype.storage)
            all_reduce_mean([np.ravel(g._value()) for g in grads], flat)
            parts = [Tensor(host_buffer(flat[start:start + p.numel()].reshape(p.shape), p.dtype))
                     for p, start in zip(bucket.params, _offsets(bucket.params))]
        for param, part in zip(bucket.params, parts):
            param.grad = part

    def _require_finished_reduction(self) -> None:
        """torch's check: a backward that left a bucket partly accumulated had parameters without gradients, whose
        bucket was then never averaged (ranks would step with different gradients)."""
        waiting = [bucket for bucket in self._buckets if bucket.ready]
        if not waiting:
            return
        names = {id(p): name for name, p in self.module.named_parameters()}
        missing = [names.get(id(p), "?") for bucket in waiting for p in bucket.params if id(p) not in bucket.ready]
        for bucket in waiting:
            bucket.ready.clear()
        self._next_bucket = 0
        fail("DistributedDataParallel", "Expected to have finished reduction in the prior iteration before starting "
             f"a new one: parameters {missing} received no gradient, so their bucket was never averaged across "
             "ranks; make every parameter take part in the loss (find_unused_parameters is not supported)",
             kind=AutogradError)


def _offsets(params: list[Parameter]) -> list[int]:
    sizes = [p.numel() for p in params]
    return [sum(sizes[:i]) for i in range(len(sizes))]


def _tensors_in(value: Any) -> list[Tensor]:
    """The tensors in a forward's output (a tensor, or lists, tuples and dicts of them)."""
    if isinstance(value, Tensor):
        return [value]
    if isinstance(value, dict):
        value = list(value.values())
    return [t for item in value for t in _tensors_in(item)] if isinstance(value, (list, tuple)) else []
