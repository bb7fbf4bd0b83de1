"""torch.distributed's process group and collectives, on tg tensors (`pip install tensorgraphs[distributed]`).

The process group is torch's own (gloo on CPUs): `torchrun` and its rendezvous work unchanged. A collective
runs on the tensor's array as a torch tensor sharing its memory (`torch.from_numpy`), so nothing is copied
when the tensor holds a buffer of its own that nothing else reads: the collective then writes that buffer,
as torch's in-place collectives write the tensor's storage. A tensor whose value is still a graph, a view, or
a buffer other tensors or graphs share is computed (if lazy) and copied first, and then holds the result as
an in-place op would leave it: graphs built from its old value keep that value.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Any, Iterator

import numpy as np

from tensorgraphs import dtypes
from tensorgraphs.errors import ArgumentError, DTypeError, TGError, UnsupportedError, fail
from tensorgraphs.frontend.grad_mode import no_grad
from tensorgraphs.frontend.tensor import Tensor, host_buffer
from tensorgraphs.graph.ops import Op
from tensorgraphs.runtime import tracing

REDUCIBLE = (dtypes.uint8, dtypes.int8, dtypes.int32, dtypes.int64, dtypes.float16, dtypes.bfloat16, dtypes.float32,
             dtypes.float64)
"""Dtypes gloo reduces (bfloat16 in its float32 storage, rounded back). Broadcast and all_gather move bits and
take every dtype."""

_PRIVATE_NODE_REFS = 3  # the tensor, `node` in `_writable_array` and getrefcount's argument
_PRIVATE_ARRAY_REFS = 3  # the node's Buffer, `array` in `_writable_array` and getrefcount's argument


class DistributedError(TGError, RuntimeError):
    """A collective failed: typically another rank stopped or crashed (torch's message says which peer)."""


@contextlib.contextmanager
def _collective(op: str) -> Iterator[None]:
    """Runs one of torch's collectives: its failure becomes a DistributedError naming the collective."""
    try:
        yield
    except RuntimeError as error:
        fail(f"distributed.{op}", f"the collective failed; another rank has probably stopped or crashed (see its "
             f"output): {error}", kind=DistributedError)


def torch_distributed() -> Any:
    """torch.distributed, or a clear error where torch is not installed."""
    try:
        import torch.distributed as dist
    except ImportError:
        fail("distributed", "tg.distributed runs on torch.distributed, which is not installed: "
             "pip install 'tensorgraphs[distributed]'", kind=UnsupportedError)
    return dist


def is_available() -> bool:
    try:
        import torch.distributed as dist
    except ImportError:
        return False
    return dist.is_available()


def is_initialized() -> bool:
    return is_available() and torch_distributed().is_initialized()


def init_process_group(backend: str = "gloo", init_method: str | None = None, timeout: Any = None,
                       world_size: int = -1, rank: int = -1, store: Any = None, group_name: str = "") -> None:
    """torch's `init_process_group` (its arguments; `env://` by default, as torchrun sets it up). tensorgraphs
    computes on CPUs, so the backend is gloo."""
    if backend != "gloo":
        fail("distributed.init_process_group", f"backend {backend!r} is not supported: tensorgraphs tensors live "
             "in CPU memory, so use backend='gloo'", kind=UnsupportedError)
    dist = torch_distributed()
    options: dict[str, Any] = {"init_method": init_method, "world_size": world_size, "rank": rank,
                               "store": store, "group_name": group_name}
    if timeout is not None:
        options["timeout"] = timeout
    dist.init_process_group(backend, **options)


def destroy_process_group(group: Any = None) -> None:
    _require_group("destroy_process_group").destroy_process_group(group)


def get_rank(group: Any = None) -> int:
    return _require_group("get_rank").get_rank(group)


def get_world_size(group: Any = None) -> int:
    return _require_group("get_world_size").get_world_size(group)


def barrier(group: Any = None) -> None:
    dist = _require_group("barrier")
    with _collective("barrier"):
        dist.barrier(group)


def all_reduce(tensor: Tensor, op: Any = None, group: Any = None, async_op: bool = False) -> None:
    """Reduce `tensor` across the group (default: sum); every rank's tensor then holds the result."""
    dist = _require_group("all_reduce")
    _refuse_async("all_reduce", async_op)
    _require_reducible("all_reduce", tensor)
    array, own = _writable_array(tensor)
    reduce_array(array, dist.ReduceOp.SUM if op is None else op, group)
    _finish(tensor, array, own)


def reduce_array(array: np.ndarray, op: Any = None, group: Any = None) -> None:
    """All-reduce a contiguous numpy array in place (the memory is shared with torch, not copied)."""
    import torch

    dist = torch_distributed()
    with _collective("all_reduce"):
        dist.all_reduce(torch.from_numpy(array), op=dist.ReduceOp.SUM if op is None else op, group=group)


def start_reducing_array(array: np.ndarray) -> Any:
    """Start summing a contiguous numpy array in place over the default group; it goes on in torch's
    background thread until `finish` is called with what this returns (do not touch the array before)."""
    import torch

    tensor = torch.from_numpy(array)
    with _collective("all_reduce"):
        return tensor, torch_distributed().all_reduce(tensor, async_op=True)


def finish(started: Any) -> None:
    """Wait for a collective `start_reducing_array` started."""
    _, work = started
    with _collective("all_reduce"):
        work.wait()


def broadcast_array(array: np.ndarray, src: int, group: Any = None) -> None:
    """Broadcast a contiguous numpy array in place from rank `src` (the memory is shared with torch, not copied)."""
    import torch

    with _collective("broadcast"):
        torch_distributed().broadcast(torch.from_numpy(array), src=src, group=group)


def broadcast(tensor: Tensor, src: int, group: Any = None, async_op: bool = False) -> None:
    """Every rank's `tensor` gets rank `src`'s value."""
    _require_group("broadcast")
    _refuse_async("broadcast", async_op)
    _require_tensor("broadcast", tensor)
    array, own = _writable_array(tensor)
    broadcast_array(bits(array), src, group)
    _finish(tensor, array, own)


def all_gather(tensor_list: list[Tensor], tensor: Tensor, group: Any = None, async_op: bool = False) -> None:
    """`tensor_list[r]` gets rank r's `tensor` (one tensor per rank, each of `tensor`'s shape and dtype)."""
    import torch

    dist = _require_group("all_gather")
    _refuse_async("all_gather", async_op)
    _require_tensor("all_gather", tensor)
    size = dist.get_world_size(group)
    if not isinstance(tensor_list, (list, tuple)) or len(tensor_list) != size:
        fail("distributed.all_gather", f"tensor_list must be a list of {size} tensors (one per rank), got "
             f"{len(tensor_list) if isinstance(tensor_list, (list, tuple)) else type(tensor_list).__name__}",
             kind=ArgumentError)
    for out in tensor_list:
        _require_tensor("all_gather", out)
        if out.shape != tensor.shape or out.dtype is not tensor.dtype:
            fail("distributed.all_gather", f"every output must be {tensor.dtype.name}{list(tensor.shape)} like the "
                 f"input, got {out.dtype.name}{list(out.shape)}", kind=ArgumentError)
    outputs = [_writable_array(out) for out in tensor_list]
    source = np.ascontiguousarray(tensor._value())
    with _collective("all_gather"):
        dist.all_gather([torch.from_numpy(bits(a)) for a, _ in outputs], torch.from_numpy(bits(source)),
                        group=group)
    for out, (array, own) in zip(tensor_list, outputs):
        _finish(out, array, own)


def _require_group(op: str) -> Any:
    dist = torch_distributed()
    if not dist.is_initialized():
        fail(f"distributed.{op}", "the default process group is not initialized: call "
             "tg.distributed.init_process_group('gloo') first (under torchrun, or with MASTER_ADDR, MASTER_PORT, "
             "RANK and WORLD_SIZE set)", kind=UnsupportedError)
    return dist


def _refuse_async(op: str, async_op: bool) -> None:
    if async_op:
        fail(f"distributed.{op}", "async_op=True is not supported: the collective returns when it is done",
             kind=UnsupportedError)


def _require_tensor(op: str, tensor: Any) -> None:
    if not isinstance(tensor, Tensor):
        fail(f"distributed.{op}", f"expected a tensorgraphs Tensor, got {type(tensor).__name__}", kind=ArgumentError)


def _require_reducible(op: str, tensor: Any) -> None:
    _require_tensor(op, tensor)
    if tensor.dtype not in REDUCIBLE:
        fail(f"distributed.{op}", f"gloo cannot reduce {tensor.dtype.name} tensors; reducible dtypes: "
             f"{', '.join(d.name for d in REDUCIBLE)} (cast first, e.g. tensor.to(tg.int32))", kind=DTypeError)


def bits(array: np.ndarray) -> np.ndarray:
    """A bool array as bytes (torch's gloo moves those; the bits are the same)."""
    return array.view(np.uint8) if array.dtype == np.bool_ else array


def _writable_array(tensor: Tensor) -> tuple[np.ndarray, bool]:
    """A contiguous array a collective may write, and whether it is the tensor's own buffer (then the tensor
    already holds what the collective writes); else a copy of its value, which `_finish` gives the tensor."""
    node = tensor._node if tensor._base is None else None
    if node is not None and node.op is Op.BUFFER and sys.getrefcount(node) <= _PRIVATE_NODE_REFS:
        array = node.arg.data
        if (isinstance(array, np.ndarray) and array.flags.c_contiguous and array.flags.writeable
                and array.flags.owndata and array.dtype == np.dtype(tensor.dtype.storage)
                and sys.getrefcount(array) <= _PRIVATE_ARRAY_REFS):
            tracing.note_value_written()
            return array, True
    return np.array(tensor._value(), dtype=tensor.dtype.storage, order="C"), False


def _finish(tensor: Tensor, array: np.ndarray, own: bool) -> None:
    """`tensor` holds `array` (bfloat16 values rounded to bfloat16, as they are stored)."""
    if tensor.dtype is dtypes.bfloat16:
        np.copyto(array, dtypes.round_to_storage(array, tensor.dtype))
    if not own:
        with no_grad():
            tensor.assign(Tensor(host_buffer(array, tensor.dtype)))
