"""Benchmark: data-parallel scaling of the 2-layer encoder step, tg's DistributedDataParallel beside torch's.

    .venv/bin/python bench/ddp.py [--layers 2] [--steps 10] [--nproc 2] [--bucket-cap-mb MB]

For each system (tg: `tg.compile` of the whole step with DistributedDataParallel, its bucket all-reduces inside
the compiled program; torch: eager with torch's DDP) one process with one thread, then `--nproc` processes with
one thread each (gloo on localhost, every rank its own batch of bench/train.py's size, so the global batch grows
with the processes). Each run is fresh processes (`--worker`, JSON on stdout). Reported: the median step, the
CPU time of the process per step (all its threads: where the step is much longer, it waited for a core), global
samples per second, the scaling over one process (and what it would be if every process had a core of its own
and never waited: processes x CPU time of one process / CPU time of each), the time per step spent on gradient
all-reduces (tg: the time its step spends in the host calls that start them and wait for them, i.e. not hidden
behind the rest of the backward pass, waiting for the slower rank included; torch: from issuing each bucket's
asynchronous all-reduce to its completion, overlapped or not), and one all-reduce of all the gradients alone
(gloo). Then, per tg bucket, where the compiled program starts its all-reduce and waits for it (kernel positions)
and the time the step spends in each of the two calls: the wait's time is the part not hidden. The model, data
and Adam settings are bench/train.py's.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).parent))

from train import LR, SEED, ModelSpec, build_model, make_data  # noqa: E402

WARMUP_STEPS = 2
ONE_THREAD = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


class StepClock:
    """Seconds spent in gradient all-reduces since the last `take()`, in total and per timed call, in order."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.calls: list[float] = []

    def timed(self, function: Callable[..., Any]) -> Callable[..., Any]:
        def run(*args: Any) -> Any:
            start = time.perf_counter()
            result = function(*args)
            seconds = time.perf_counter() - start
            self.seconds += seconds
            self.calls.append(seconds)
            return result

        return run

    def take(self) -> tuple[float, list[float]]:
        taken = self.seconds, self.calls
        self.seconds, self.calls = 0.0, []
        return taken


def tg_step(spec: ModelSpec, distributed: bool, clock: StepClock, cap: float | None) -> Callable[[], None]:
    import tensorgraphs as tg
    import tensorgraphs.nn.functional as F
    from tensorgraphs import nn
    from tensorgraphs.distributed import FINISH_COLLECTIVE, START_ALL_REDUCE_MEAN
    from tensorgraphs.runtime.host_calls import HOST_FUNCTIONS, register_host_function

    for name in (START_ALL_REDUCE_MEAN, FINISH_COLLECTIVE):
        register_host_function(name, clock.timed(HOST_FUNCTIONS[name]))
    tg.manual_seed(SEED)
    model = build_model(nn, F, spec)
    net = tg.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=cap) if distributed else model
    optimizer = tg.optim.Adam(model.parameters(), lr=LR)
    inputs, targets = (tg.from_numpy(array) for array in make_data(spec))

    @tg.compile
    def step(x: tg.Tensor, y: tg.Tensor) -> tg.Tensor:
        optimizer.zero_grad()
        loss = F.mse_loss(net(x), y)
        loss.backward()
        optimizer.step()
        return loss

    return functools.partial(step, inputs, targets)


def host_call_layout(step: Any) -> list[dict[str, Any]]:
    """Each host call of the compiled step (`step.func`), in program order: its kernel's position, whether it
    starts a bucket's all-reduce (else it waits for one) and how many elements it moves."""
    from tensorgraphs.codegen.loop_ir import HostCall

    (trace,) = [t for traces in step.func.traces.values() for t in traces]
    return [{"position": position, "starts": call.placement == "early", "elements": sum(call.sizes)}
            for position, kernel in enumerate(trace.program.kernels)
            for call in kernel.body if isinstance(call, HostCall)] + [{"kernels": len(trace.program.kernels)}]


def bucket_rows(layout: list[dict[str, Any]], call_seconds: list[list[float]]) -> list[dict[str, Any]]:
    """Per bucket, in the order the step starts them: its elements, the positions of the kernels that start it
    and wait for it, and the median seconds the step spends in each (the wait's is what stays exposed)."""
    calls = layout[:-1]
    medians = [statistics.median(step[i] for step in call_seconds) for i in range(len(calls))]
    starts = [i for i, call in enumerate(calls) if call["starts"]]
    waits = [i for i, call in enumerate(calls) if not call["starts"]]
    return [{"elements": calls[s]["elements"], "started_at": calls[s]["position"], "waited_at": calls[w]["position"],
             "kernels": layout[-1]["kernels"], "start_s": medians[s], "wait_s": medians[w]}
            for s, w in zip(starts, waits)]


def torch_step(spec: ModelSpec, distributed: bool, clock: StepClock, cap: float | None) -> Callable[[], None]:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch import nn

    torch.set_num_threads(1)
    torch.manual_seed(SEED)
    model = build_model(nn, F, spec)
    net = model
    if distributed:
        net = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=cap)

        def timed_all_reduce(state, bucket):  # noqa: ANN001, ANN202 - torch checks the annotation is GradBucket
            """torch's default hook (divide, then an asynchronous all-reduce), timed from issue to completion."""
            start = time.perf_counter()
            tensor = bucket.buffer().div_(dist.get_world_size())

            def done(future: torch.futures.Future) -> torch.Tensor:
                clock.seconds += time.perf_counter() - start
                return future.value()[0]

            return dist.all_reduce(tensor, async_op=True).get_future().then(done)

        net.register_comm_hook(None, timed_all_reduce)
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)
    inputs, targets = (torch.from_numpy(array) for array in make_data(spec))

    def step() -> None:
        optimizer.zero_grad()
        F.mse_loss(net(inputs), targets).backward()
        optimizer.step()

    return step


def worker(system: str, layers: int, steps: int, distributed: bool, cap: float | None) -> None:
    if distributed:
        import torch.distributed as dist

        dist.init_process_group("gloo")
    clock = StepClock()
    spec = ModelSpec(layers, 8)
    step = (tg_step if system == "tg" else torch_step)(spec, distributed, clock, cap)
    for _ in range(WARMUP_STEPS):
        step()
    times, cpu_times, reduces, call_seconds = [], [], [], []
    for _ in range(steps):
        clock.take()
        start, cpu_start = time.perf_counter(), time.process_time()
        step()
        times.append(time.perf_counter() - start)
        cpu_times.append(time.process_time() - cpu_start)
        seconds, calls = clock.take()
        reduces.append(seconds)
        call_seconds.append(calls)
    buckets = bucket_rows(host_call_layout(step), call_seconds) if system == "tg" and distributed else []
    print(json.dumps({"step_s": statistics.median(times), "cpu_s": statistics.median(cpu_times),
                      "all_reduce_s": statistics.median(reduces), "alone_s": all_reduce_alone(spec) if distributed
                      else 0.0, "batch": spec.batch, "buckets": buckets}))
    if distributed:
        import torch.distributed as dist

        dist.destroy_process_group()


def all_reduce_alone(spec: ModelSpec, repeat: int = 5) -> float:
    """Median seconds of one gloo all-reduce of as many floats as the model has parameters."""
    import numpy as np
    import torch
    import torch.distributed as dist
    from torch import nn

    count = sum(p.numel() for p in build_model(nn, torch.nn.functional, spec).parameters())
    tensor = torch.from_numpy(np.ones(count, np.float32))
    times = []
    for _ in range(repeat):
        dist.barrier()
        start = time.perf_counter()
        dist.all_reduce(tensor)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(system: str, nproc: int, layers: int, steps: int, cap: float | None) -> dict[str, float] | str:
    """`nproc` fresh processes of one thread each; the slowest rank's figures (the step waits for it anyway)."""
    command = [sys.executable, __file__, "--worker", system, "--layers", str(layers), "--steps", str(steps)]
    command += [] if cap is None else ["--bucket-cap-mb", str(cap)]
    env = {**os.environ, **ONE_THREAD, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
           "WORLD_SIZE": str(nproc)}
    if nproc > 1:
        command.append("--distributed")
    processes = [subprocess.Popen(command, env={**env, "RANK": str(rank)}, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True) for rank in range(nproc)]
    results = []
    for process in processes:
        out, err = process.communicate(timeout=900)
        if process.returncode != 0:
            return (err.strip().splitlines() or [f"exit {process.returncode}"])[-1][:80]
        results.append(json.loads(out.strip().splitlines()[-1]))
    slowest = max(results, key=lambda r: r["step_s"])
    return {**slowest, "samples_s": nproc * slowest["batch"] / slowest["step_s"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=2, help="encoder layers (bench/train.py's encoder)")
    parser.add_argument("--steps", type=int, default=10, help="timed steps after warm-up")
    parser.add_argument("--nproc", type=int, default=2, help="processes of the data-parallel runs")
    parser.add_argument("--systems", default="tg,torch", help="comma-separated: tg, torch")
    parser.add_argument("--bucket-cap-mb", type=float, help="DDP bucket cap of both systems (default: theirs, 25)")
    parser.add_argument("--worker", choices=("tg", "torch"), help=argparse.SUPPRESS)
    parser.add_argument("--distributed", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.layers, args.steps, args.distributed, args.bucket_cap_mb)
        return
    cap = "default" if args.bucket_cap_mb is None else f"{args.bucket_cap_mb:g} MB"
    print(f"encoder {args.layers} layers, batch 8 per process, Adam; 1 thread per process; {args.steps} timed steps; "
          f"bucket cap {cap}")
    print("| system | processes | step ms | CPU ms/step | samples/s | scaling | scaling by CPU time | "
          "all-reduce ms/step | one all-reduce alone ms |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    buckets = []
    for system in args.systems.split(","):
        single = run(system, 1, args.layers, args.steps, args.bucket_cap_mb)
        parallel = run(system, args.nproc, args.layers, args.steps, args.bucket_cap_mb)
        for nproc, result in ((1, single), (args.nproc, parallel)):
            if isinstance(result, str):
                print(f"| {system} | {nproc} | error: {result} | | | | | | |")
                continue
            scaling = cpu_scaling = "-"
            if not isinstance(single, str):
                scaling = f"{result['samples_s'] / single['samples_s']:.2f}x"
                cpu_scaling = f"{nproc * single['cpu_s'] / result['cpu_s']:.2f}x"
            reduce, alone = ((f"{result['all_reduce_s'] * 1e3:.1f}", f"{result['alone_s'] * 1e3:.1f}") if nproc > 1
                             else ("-", "-"))
            print(f"| {system} | {nproc} | {result['step_s'] * 1e3:.1f} | {result['cpu_s'] * 1e3:.1f} | "
                  f"{result['samples_s']:.1f} | {scaling} | {cpu_scaling} | {reduce} | {alone} |", flush=True)
            buckets += result["buckets"]
    if buckets:
        print_buckets(buckets)


def print_buckets(buckets: list[dict[str, Any]]) -> None:
    """tg's buckets in the data-parallel run: where the program starts and waits for each all-reduce, and the time
    each call takes (the slowest rank's); kernels between the two run while the bucket is summed."""
    print(f"\ntg buckets (the program has {buckets[0]['kernels']} kernels)")
    print("| bucket | elements | started after kernel | waited for at kernel | kernels between | start ms | wait ms |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for number, bucket in enumerate(buckets):
        print(f"| {number} | {bucket['elements']} | {bucket['started_at']} | {bucket['waited_at']} | "
              f"{bucket['waited_at'] - bucket['started_at'] - 1} | {bucket['start_s'] * 1e3:.1f} | "
              f"{bucket['wait_s'] * 1e3:.1f} |")


if __name__ == "__main__":
    main()
