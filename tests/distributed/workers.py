"""What each rank of a test's process group runs: `python workers.py SCENARIO OUT` with torch's environment
variables (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) set by `conftest.run_ranks`; results go to
OUT/rank{RANK}.npz."""

from __future__ import annotations

import datetime
import os
import sys
from pathlib import Path

import numpy as np

TIMEOUT_SECONDS = 20
"""How long a collective waits for a rank that does not come."""
STEPS = 10
GLOBAL_BATCH = 8
FEATURES, HIDDEN, OUTPUTS = 8, 16, 4


def global_batch() -> tuple[np.ndarray, np.ndarray]:
    """Every step's inputs and targets for the whole group (a rank takes its slice of rows)."""
    rng = np.random.default_rng(1234)
    x = rng.standard_normal((STEPS, GLOBAL_BATCH, FEATURES)).astype(np.float32)
    y = rng.standard_normal((STEPS, GLOBAL_BATCH, OUTPUTS)).astype(np.float32)
    return x, y


def layers(nn, norm: bool):  # noqa: ANN001, ANN201
    """The MLP in torch.nn or tg.nn; with `norm`, a BatchNorm1d (running statistics: module buffers) inside."""
    middle = [nn.BatchNorm1d(HIDDEN)] if norm else []
    return nn.Sequential(nn.Linear(FEATURES, HIDDEN), *middle, nn.Tanh(), nn.Linear(HIDDEN, OUTPUTS))


def initial_state(seed: int, norm: bool) -> dict[str, np.ndarray]:
    """Weights (and running statistics) that differ by seed: a rank's own until DDP broadcasts rank 0's."""
    rng = np.random.default_rng(seed)
    last = 3 if norm else 2
    shapes = {"0.weight": (HIDDEN, FEATURES), "0.bias": (HIDDEN,), f"{last}.weight": (OUTPUTS, HIDDEN),
              f"{last}.bias": (OUTPUTS,)}
    if norm:
        shapes.update({"1.weight": (HIDDEN,), "1.bias": (HIDDEN,), "1.running_mean": (HIDDEN,)})
    state = {name: (0.5 * rng.standard_normal(shape)).astype(np.float32) for name, shape in shapes.items()}
    if norm:
        state["1.running_var"] = np.full(HIDDEN, 1.0 + seed, np.float32)
        state["1.num_batches_tracked"] = np.array(seed, np.int64)
    return state


def tg_model(seed: int, norm: bool = False):  # noqa: ANN201
    import tensorgraphs as tg

    model = layers(tg.nn, norm)
    model.load_state_dict({k: tg.tensor(v) for k, v in initial_state(seed, norm).items()})
    return model


def train_tg(compiled: bool, distributed: bool, crash_after: int | None = None,
             bucket_cap_mb: float | None = None, norm: bool = False) -> dict[str, np.ndarray]:
    """10 SGD steps (momentum) of the MLP (with batch norm if `norm`) on this rank's rows (all rows when not
    `distributed`); ranks start from different weights, which DistributedDataParallel replaces by rank 0's.
    With `crash_after`, rank 1 dies after that many steps."""
    import tensorgraphs as tg
    import tensorgraphs.nn.functional as F

    rank, world = (tg.distributed.get_rank(), tg.distributed.get_world_size()) if distributed else (0, 1)
    model = tg_model(seed=rank, norm=norm)
    net = tg.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=bucket_cap_mb) if distributed else model
    optimizer = tg.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    def step(x: tg.Tensor, y: tg.Tensor) -> tg.Tensor:
        optimizer.zero_grad()
        loss = F.mse_loss(net(x), y)
        loss.backward()
        optimizer.step()
        return loss

    run = tg.compile(step) if compiled else step
    xs, ys = global_batch()
    rows = slice(rank * GLOBAL_BATCH // world, (rank + 1) * GLOBAL_BATCH // world)
    for count, (x, y) in enumerate(zip(xs, ys)):
        if count == crash_after and rank == 1:
            os._exit(3)
        run(tg.tensor(x[rows]), tg.tensor(y[rows]))
    results = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    if compiled:
        (trace,) = [t for traces in run.traces.values() for t in traces]
        results.update(host_call_positions(trace.program.kernels))
    return results


def host_call_positions(kernels: list) -> dict[str, np.ndarray]:
    """Per host call of the compiled step, in program order: its kernel's position, whether it starts a collective
    (else it finishes one), the last kernel writing one of its sources (-1: all are program inputs) and the first
    kernel reading what it writes."""
    from tensorgraphs.codegen.loop_ir import HostCall

    calls, starts, producers, consumers = [], [], [], []
    for position, kernel in enumerate(kernels):
        (call,) = [s for s in kernel.body if isinstance(s, HostCall)] or [None]
        if call is None:
            continue
        calls.append(position)
        starts.append(call.placement == "early")
        producers.append(max((i for i, k in enumerate(kernels[:position])
                              if any(b.writes and b.name in (*call.sources, call.after) for b in k.buffers)),
                             default=-1))
        consumers.append(min(i for i, k in enumerate(kernels) if i > position
                             and any(not b.writes and b.name == call.output for b in k.buffers)))
    return {"host_calls": np.array(calls), "starts": np.array(starts), "producers": np.array(producers),
            "consumers": np.array(consumers)}


def train_torch_ddp(norm: bool = False) -> dict[str, np.ndarray]:
    """The same training with torch's DistributedDataParallel."""
    import torch
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    model = layers(torch.nn, norm)
    model.load_state_dict({k: torch.from_numpy(v) for k, v in initial_state(rank, norm).items()})
    net = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    xs, ys = global_batch()
    rows = slice(rank * GLOBAL_BATCH // world, (rank + 1) * GLOBAL_BATCH // world)
    for x, y in zip(xs, ys):
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(net(torch.from_numpy(x[rows])), torch.from_numpy(y[rows])).backward()
        optimizer.step()
    return {k: v.detach().numpy() for k, v in model.state_dict().items()}


def collectives() -> dict[str, np.ndarray]:
    """tg.distributed's collectives on tensors of every kind (lazy, own buffer, view, parameter) and errors."""
    import tensorgraphs as tg
    import tensorgraphs.distributed as dist

    rank = dist.get_rank()
    out: dict[str, object] = {}
    lazy = tg.tensor([1.0, 2.0, 3.0]) * (rank + 1)
    dist.all_reduce(lazy)
    own = tg.tensor([1.0, 2.0, 3.0])
    address = own._node.arg.data.ctypes.data
    dist.all_reduce(own)
    out["own_in_place"] = own._node.arg.data.ctypes.data == address
    kept = tg.tensor([1.0, 2.0])
    built_before = kept * 10  # lazy: reads the value before the collective, as in torch
    dist.all_reduce(kept)
    base = tg.tensor([float(rank)] * 4)
    dist.all_reduce(base[1:3])
    largest = tg.tensor([rank, -rank])
    dist.all_reduce(largest, op=dist.ReduceOp.MAX)
    third = tg.tensor([1.0, 1.0 / 3.0], dtype=tg.bfloat16)
    dist.all_reduce(third)
    flags = tg.tensor([rank == 0, rank == 1])
    dist.broadcast(flags, src=1)
    gathered = [tg.zeros(2, dtype=tg.int64) for _ in range(2)]
    dist.all_gather(gathered, tg.tensor([rank, 10 * rank]))
    tg.manual_seed(rank)
    weight = tg.nn.Linear(3, 2).weight
    with tg.no_grad():
        dist.broadcast(weight, src=0)
    weight.sum().backward()
    out["weight_is_leaf"] = weight.is_leaf and weight.requires_grad and weight.grad is not None
    for name, call in (("dtype", lambda: dist.all_reduce(tg.tensor([True]))),
                       ("async", lambda: dist.all_reduce(tg.tensor([1.0]), async_op=True))):
        try:
            call()
        except tg.TGError as error:
            out[f"{name}_error"] = type(error).__name__
    dist.barrier()
    tensors = {"lazy": lazy, "own": own, "kept": kept, "built_before": built_before, "base": base,
               "largest": largest, "third": third.float(), "flags": flags, "gathered": tg.stack(gathered),
               "weight": weight}
    return {**{k: v.detach().numpy() for k, v in tensors.items()}, **{k: np.array(v) for k, v in out.items()}}


def accumulate_without_sync() -> dict[str, np.ndarray]:
    """Two micro-batches: the first's backward inside no_sync (gradients stay local), the second's outside it
    (what has accumulated is averaged). Rank 0 also runs one process on both ranks' rows."""
    import tensorgraphs as tg
    import tensorgraphs.nn.functional as F

    rank = tg.distributed.get_rank()
    xs, ys = global_batch()
    ddp = tg.nn.parallel.DistributedDataParallel(tg_model(seed=0))
    half = slice(rank * GLOBAL_BATCH // 2, (rank + 1) * GLOBAL_BATCH // 2)
    with ddp.no_sync():
        F.mse_loss(ddp(tg.tensor(xs[0, half])), tg.tensor(ys[0, half])).backward()
    out = {f"local/{n}": p.grad.numpy() for n, p in ddp.module.named_parameters()}
    F.mse_loss(ddp(tg.tensor(xs[1, half])), tg.tensor(ys[1, half])).backward()
    out.update({f"synced/{n}": p.grad.numpy() for n, p in ddp.module.named_parameters()})
    if rank == 0:
        single = tg_model(seed=0)
        for step in (0, 1):
            F.mse_loss(single(tg.tensor(xs[step])), tg.tensor(ys[step])).backward()
        out.update({f"single/{n}": p.grad.numpy() for n, p in single.named_parameters()})
    return out


def train_every_way() -> dict[str, np.ndarray]:
    """The training eagerly, compiled (with two and three buckets) and in torch on this process group, and (on rank 0)
    in one process on the whole batch: results named "<way>/<name>"."""
    ways = {"eager": lambda: train_tg(compiled=False, distributed=True),
            "compiled": lambda: train_tg(compiled=True, distributed=True, bucket_cap_mb=TWO_BUCKETS_MB),
            "compiled-3": lambda: train_tg(compiled=True, distributed=True, bucket_cap_mb=THREE_BUCKETS_MB),
            "torch": train_torch_ddp}
    if int(os.environ["RANK"]) == 0:
        ways["single"] = lambda: train_tg(compiled=False, distributed=False)
    ways.update({"eager-norm": lambda: train_tg(compiled=False, distributed=True, norm=True),
                 "compiled-norm": lambda: train_tg(compiled=True, distributed=True, norm=True),
                 "torch-norm": lambda: train_torch_ddp(norm=True)})
    return {f"{way}/{name}": value for way, train in ways.items() for name, value in train().items()}


TWO_BUCKETS_MB = (OUTPUTS * HIDDEN + OUTPUTS + HIDDEN) * 4 / 2**20
"""A bucket cap that the last layer and the first layer's bias fill (torch's buckets take parameters, from the
last, until they hold the cap): the first layer's weight goes to a second bucket."""
THREE_BUCKETS_MB = 10 * 4 / 2**20
"""A cap the last layer's bias does not fill, its weight and the first layer's bias each do: three buckets."""

def encoder(nn):  # noqa: ANN001, ANN201
    """Two small pre-norm transformer encoder layers in torch.nn or tg.nn: backward produces the gradients in
    neither the order nor the reverse of the order the parameters are registered (each layer's first norm last)."""
    return nn.Sequential(*(nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True, norm_first=True)
                           for _ in range(2)))


ENCODER_BUCKET_MB = 700 / 2**20


def bucket_sizes() -> dict[str, np.ndarray]:
    """Elements per bucket of torch's DistributedDataParallel once it has rebuilt its buckets in the order the
    gradients were ready (its second iteration, seen by a communication hook), and of tg's after one step."""
    import torch
    import torch.distributed as dist

    import tensorgraphs as tg

    sizes: dict[int, int] = {}

    def record(state, bucket):  # noqa: ANN001, ANN202 - torch checks the annotation is GradBucket
        sizes[bucket.index()] = bucket.buffer().numel()
        return dist.all_reduce(bucket.buffer().div_(dist.get_world_size()), async_op=True).get_future().then(
            lambda future: future.value()[0])

    ddp = torch.nn.parallel.DistributedDataParallel(encoder(torch.nn), bucket_cap_mb=ENCODER_BUCKET_MB)
    ddp.register_comm_hook(None, record)
    for _ in range(2):
        sizes.clear()
        ddp(torch.ones(2, 3, 8)).sum().backward()
    ours = tg.nn.parallel.DistributedDataParallel(encoder(tg.nn), bucket_cap_mb=ENCODER_BUCKET_MB)
    ours(tg.ones(2, 3, 8)).sum().backward()
    return {"torch": np.array([sizes[i] for i in sorted(sizes)]), "tg": np.array(ours.bucket_sizes)}


def everything() -> dict[str, np.ndarray]:
    """The collectives, no_sync, the buckets and the training, in one process group (starting one costs
    seconds)."""
    parts = {"collectives": collectives, "no-sync": accumulate_without_sync, "buckets": bucket_sizes,
             "train": train_every_way}
    return {f"{part}:{key}": value for part, run in parts.items() for key, value in run().items()}


SCENARIOS = {
    "everything": everything,
    "crash-eager": lambda: train_tg(compiled=False, distributed=True, crash_after=2),
    "crash-compiled": lambda: train_tg(compiled=True, distributed=True, crash_after=2),
}


def main() -> None:
    import tensorgraphs as tg

    scenario, out = sys.argv[1], Path(sys.argv[2])
    tg.distributed.init_process_group("gloo", timeout=datetime.timedelta(seconds=TIMEOUT_SECONDS))
    results = SCENARIOS[scenario]()
    tg.distributed.destroy_process_group()
    np.savez(out / f"rank{os.environ['RANK']}.npz", **results)


if __name__ == "__main__":
    main()
