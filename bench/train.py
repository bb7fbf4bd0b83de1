"""Benchmark: one Adam training step of tg against torch eager and torch.compile, each system in its own process.

    .venv/bin/python bench/train.py [--models enc1,enc2,enc4,mlp] [--steps 10] [--no-torch-compile]
                                    [--tg-device compiled|planned|cpu] [--no-autocast] [--threads N]
    .venv/bin/python bench/train.py --kernels N [--threads 1 --clock cpu] [--models ...] [--no-autocast]

Models (issue 8 item 7): the pre-LN transformer encoder (d_model 256, 4 heads, ffn 1024, GELU-tanh, seq 128,
batch 8, MSE loss to a random target) at 1, 2 and 4 layers, and the MLP 784-1024-1024-10 (cross entropy,
batch 256); Adam lr 1e-3, no dropout. Every system gets the same data, generated with numpy from one seed.

Each (system, model) pair runs in a fresh subprocess (`--worker SYSTEM MODEL`, JSON on stdout), so peak RSS
(ru_maxrss) and compile caches belong to that run alone. ms/step is the median over the timed steps after
warm-up; compile time is the first step minus the median step (the first step includes tracing/compiling).
tg runs twice on a fresh compile cache: "cold" compiles with gcc, "warm" finds the compiled code (the
step times are the warm run's). The tg step is `tg.compile` of the whole step (forward, backward, Adam).
The autocast columns run every system again with the forward pass and loss under
`autocast("cpu", dtype=bfloat16)` (tg.autocast / torch.autocast; weights and Adam stay float32), and give
tg's float32 step time over its bfloat16 one.
A tg step slower than SLOW_STEP_S gets fewer timed steps, so the default run stays within a few minutes.

--kernels N measures each compiled tg step against its GEMM floor (issue 19): the flops of its matrix products
(GEMM calls and the fused attention's products: forward 2, backward 4, not the scores it computes again) at the
FMA peak (bench/peak.py), the step's kernel time as a multiple of that floor, the time of the kernels that run no
product (non-GEMM), the whole step's time (median of --steps calls, by the same clock) and the N slowest kernels.
On a loaded machine, `--threads 1 --clock cpu` times each kernel by the process's CPU time. It runs in this process,
with the kernel database of TG_CACHE_DIR: so `tg tune bench/train.py --kernels 0 ...` tunes the steps, and the same
--kernels command before and after shows what tuning changed.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

SEED = 0
LR = 1e-3
WARMUP_STEPS = 2
SLOW_STEP_S = 3.0
SLOW_TIMED_STEPS = 3
SYSTEMS = ("tg", "eager", "compile")
BF16 = "-bf16"  # a system name with this suffix runs under bfloat16 autocast


@dataclass(frozen=True)
class ModelSpec:
    """One benchmark model: `layers` encoder layers, or the MLP when layers is 0."""

    layers: int
    batch: int


MODELS = {"enc1": ModelSpec(1, 8), "enc2": ModelSpec(2, 8), "enc4": ModelSpec(4, 8), "mlp": ModelSpec(0, 256)}
D_MODEL, HEADS, FFN, SEQ = 256, 4, 1024, 128
MLP_SIZES = (784, 1024, 1024, 10)


def make_data(spec: ModelSpec) -> tuple[np.ndarray, np.ndarray]:
    """Inputs and targets, identical for every system: float32 (batch, seq, d_model) pairs, or MLP inputs and labels."""
    rng = np.random.default_rng(SEED)
    if spec.layers:
        shape = (spec.batch, SEQ, D_MODEL)
        return rng.standard_normal(shape, dtype=np.float32), rng.standard_normal(shape, dtype=np.float32)
    inputs = rng.standard_normal((spec.batch, MLP_SIZES[0]), dtype=np.float32)
    return inputs, rng.integers(0, MLP_SIZES[-1], spec.batch).astype(np.int64)


def build_model(nn: object, F: object, spec: ModelSpec) -> object:
    """The same model in torch.nn or tg.nn (both expose the PyTorch names and arguments)."""
    if spec.layers:
        def gelu_tanh(x: object) -> object:
            return F.gelu(x, approximate="tanh")

        layers = [nn.TransformerEncoderLayer(D_MODEL, HEADS, FFN, dropout=0.0, activation=gelu_tanh,
                                             batch_first=True, norm_first=True) for _ in range(spec.layers)]
        return nn.Sequential(*layers)
    a, b, c, d = MLP_SIZES
    return nn.Sequential(nn.Linear(a, b), nn.ReLU(), nn.Linear(b, c), nn.ReLU(), nn.Linear(c, d))


def torch_step(spec: ModelSpec, compiled: bool, autocast: bool) -> Callable[[], None]:
    import torch
    import torch.nn.functional as F
    from torch import nn

    torch.manual_seed(SEED)
    model = build_model(nn, F, spec)
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)
    inputs, targets = (torch.from_numpy(array) for array in make_data(spec))
    loss_fn = F.mse_loss if spec.layers else F.cross_entropy

    def forward_backward() -> torch.Tensor:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = loss_fn(model(inputs), targets)
        loss.backward()
        return loss

    run = torch.compile(forward_backward) if compiled else forward_backward

    def step() -> None:
        optimizer.zero_grad()
        run()
        optimizer.step()

    return step


def tg_training_step(spec: ModelSpec, autocast: bool = False) -> tuple[Callable[..., object], object, object]:
    """The step as a plain function of (inputs, targets), and the data."""
    import tensorgraphs as tg
    import tensorgraphs.nn.functional as F
    from tensorgraphs import nn

    tg.manual_seed(SEED)
    model = build_model(nn, F, spec)
    optimizer = tg.optim.Adam(model.parameters(), lr=LR)
    inputs, targets = (tg.from_numpy(array) for array in make_data(spec))
    loss_fn = F.mse_loss if spec.layers else F.cross_entropy

    def step(x: tg.Tensor, y: tg.Tensor) -> tg.Tensor:
        optimizer.zero_grad()
        with tg.autocast("cpu", dtype=tg.bfloat16, enabled=autocast):
            loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
        return loss

    return step, inputs, targets


def tg_step(spec: ModelSpec, device: str, autocast: bool) -> Callable[[], None]:
    import tensorgraphs as tg

    step, inputs, targets = tg_training_step(spec, autocast)
    if device == "compiled":  # the whole step as one program, replayed per call with the batch as arguments
        compiled = tg.compile(step)
        return lambda: compiled(inputs, targets)

    def lazy_step() -> None:
        with tg.device(device):
            step(inputs, targets)

    return lazy_step


def print_kernel_times(model: str, top: int, autocast: bool, peak_gflops: float, repeat: int) -> None:
    """The compiled step against its GEMM floor (its matrix products' flops, attention's included, at the FMA
    peak): the step's kernel time (the medians of `repeat` runs, summed), its multiple of the floor and the time of
    the kernels that run no product; then its `top` slowest kernels, each with its share and its fraction of the
    peak."""
    import tensorgraphs as tg
    from tensorgraphs.plan.measure import kernel_clock

    step, inputs, targets = tg_training_step(MODELS[model], autocast)
    compiled = tg.compile(step)
    compiled(inputs, targets)  # compiled and warm before the timed runs
    clock = kernel_clock()
    whole = []
    for _ in range(repeat):
        start = clock()
        compiled(inputs, targets)
        whole.append(clock() - start)
    with tg.profile(report=False) as session:
        for _ in range(repeat):
            compiled(inputs, targets)
    runs: dict[str, list[float]] = {}
    flops: dict[str, float] = {}
    for event in session.events:
        runs.setdefault(event.name, []).append(event.seconds)
        flops[event.name] = event.flops
    times = {name: statistics.median(seconds) * len(seconds) / repeat for name, seconds in runs.items()}
    total, floor = sum(times.values()), sum(flops.values()) / (peak_gflops * 1e9)
    products = sum(seconds for name, seconds in times.items() if flops[name])
    print(f"{model}{' bfloat16 autocast' if autocast else ''}: {len(times)} kernels, {total * 1e3:.1f} ms in kernels; "
          f"GEMM floor {floor * 1e3:.1f} ms ({sum(flops.values()) / 1e9:.2f} GFLOP at {peak_gflops:.0f} GFLOP/s): "
          f"{total / floor:.2f}x; GEMM kernels {products * 1e3:.1f} ms, non-GEMM {(total - products) * 1e3:.1f} ms; "
          f"whole step {statistics.median(whole) * 1e3:.1f} ms ({statistics.median(whole) / floor:.2f}x)")
    for name, seconds in sorted(times.items(), key=lambda item: -item[1])[:top]:
        peak = f"{flops[name] / seconds / 1e9 / peak_gflops:6.1%} of peak" if flops[name] else ""
        print(f"  {seconds * 1e3:7.2f} ms {seconds / total:6.1%} {peak:>14}  {name}")


def time_steps(step: Callable[[], None], steps: int) -> dict[str, float]:
    """First step (includes compiling), warm-up, then the median of the timed steps."""
    start = time.perf_counter()
    step()
    first = time.perf_counter() - start
    if first > SLOW_STEP_S:
        steps = min(steps, SLOW_TIMED_STEPS)
    for _ in range(WARMUP_STEPS - 1):
        step()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    median = statistics.median(times)
    return {"ms": median * 1e3, "compile_s": max(first - median, 0.0), "steps": steps}


def worker(system: str, model: str, steps: int, tg_device: str) -> None:
    spec, autocast = MODELS[model], system.endswith(BF16)
    system = system.removesuffix(BF16)
    step = (tg_step(spec, tg_device, autocast) if system == "tg" else
            torch_step(spec, compiled=system == "compile", autocast=autocast))
    result = time_steps(step, steps)
    result["rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    print(json.dumps(result))


def run_worker(system: str, model: str, steps: int, tg_device: str,
               env: dict[str, str] | None = None) -> dict[str, float] | str:
    """One measurement in a fresh interpreter; the error's last line instead when it fails."""
    command = [sys.executable, __file__, "--worker", system, model, "--steps", str(steps), "--tg-device", tg_device]
    done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, **(env or {})})
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines() or [f"exit {done.returncode}"]
        return lines[-1][:60]
    return json.loads(done.stdout.strip().splitlines()[-1])


def run_tg_cold_then_warm(system: str, model: str, steps: int, tg_device: str) -> dict[str, float] | str:
    """tg twice on a fresh compile cache: the first run compiles cold (gcc), the second finds the compiled code
    (the warm compile is tracing, rewriting, scheduling and loading); the step times are the second run's."""
    with tempfile.TemporaryDirectory() as cache:
        cold = run_worker(system, model, steps, tg_device, {"TG_CACHE_DIR": cache})
        warm = run_worker(system, model, steps, tg_device, {"TG_CACHE_DIR": cache})
    if isinstance(cold, str) or isinstance(warm, str):
        return cold if isinstance(cold, str) else warm
    return {**warm, "cold_compile_s": cold["compile_s"]}


COLUMNS = (("tg ms", "tg", "ms", "{:.1f}"), ("torch eager ms", "eager", "ms", "{:.1f}"),
           ("torch.compile ms", "compile", "ms", "{:.1f}"), ("tg cold compile s", "tg", "cold_compile_s", "{:.2f}"),
           ("tg warm compile s", "tg", "compile_s", "{:.2f}"),
           ("torch.compile s", "compile", "compile_s", "{:.1f}"), ("tg RSS MiB", "tg", "rss_mib", "{:.0f}"),
           ("eager RSS MiB", "eager", "rss_mib", "{:.0f}"))
AUTOCAST_COLUMNS = (("tg bf16 ms", "tg-bf16", "ms", "{:.1f}"), ("torch eager bf16 ms", "eager-bf16", "ms", "{:.1f}"),
                    ("torch.compile bf16 ms", "compile-bf16", "ms", "{:.1f}"))


def speedup(results: dict[str, dict[str, float] | str]) -> str:
    """tg's float32 step time over its bfloat16 autocast one."""
    f32, bf16 = results.get("tg"), results.get("tg" + BF16)
    if not isinstance(f32, dict) or not isinstance(bf16, dict):
        return "-"
    return f"{f32['ms'] / bf16['ms']:.2f}x"


def cell(result: dict[str, float] | str | None, key: str, fmt: str) -> str:
    if result is None:
        return "-"
    if isinstance(result, str):
        return "error"
    return fmt.format(result[key])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(MODELS), help=f"comma-separated subset of {','.join(MODELS)}")
    parser.add_argument("--steps", type=int, default=10, help="timed steps per run, after warm-up")
    parser.add_argument("--no-torch-compile", action="store_true", help="skip torch.compile (the slowest part)")
    parser.add_argument("--no-autocast", action="store_true", help="skip the bfloat16 autocast columns")
    parser.add_argument("--tg-device", default="compiled",
                        help="compiled (tg.compile of the whole step) or a device for lazy steps (planned, cpu, numpy)")
    parser.add_argument("--kernels", type=int, metavar="N",
                        help="print each tg step's multiple of its GEMM floor, its non-GEMM time and its N slowest "
                             "kernels (medians of --steps runs), and exit")
    parser.add_argument("--threads", type=int, help="OpenMP threads of every system (default: all cores)")
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                        help="--kernels times kernels by wall or, with --threads 1, CPU time (a loaded machine)")
    parser.add_argument("--worker", nargs=2, metavar=("SYSTEM", "MODEL"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(*args.worker, args.steps, args.tg_device)
        return
    if args.clock == "cpu" and args.threads != 1:
        parser.error("--clock cpu measures one thread: add --threads 1")
    if args.threads:
        os.environ["OMP_NUM_THREADS"] = str(args.threads)  # before any OpenMP runtime loads, and for the workers
    os.environ["TG_KERNEL_CLOCK"] = args.clock
    if args.kernels is not None:
        from peak import fma_peak

        peak_gflops = fma_peak(args.clock == "cpu")
        print(f"threads {args.threads or os.cpu_count()}, clock {args.clock}, FMA peak {peak_gflops:.1f} GFLOP/s")
        for model in args.models.split(","):
            for autocast in (False,) if args.no_autocast else (False, True):
                print_kernel_times(model, args.kernels, autocast, peak_gflops, args.steps)
        return
    systems = [system for system in SYSTEMS if not (args.no_torch_compile and system == "compile")]
    columns = COLUMNS if args.no_autocast else COLUMNS + AUTOCAST_COLUMNS
    systems += [] if args.no_autocast else [system + BF16 for system in systems]
    header = ["model", *(title for title, *_ in columns), *([] if args.no_autocast else ["tg f32/bf16"])]
    print(f"tg device {args.tg_device}, {args.steps} timed steps after {WARMUP_STEPS} warm-up (fewer for slow tg)")
    print(" | ".join(header))
    print(" | ".join("---" for _ in header))
    errors = []
    for model in args.models.split(","):
        results = {system: run_tg_cold_then_warm(system, model, args.steps, args.tg_device)
                   if system.startswith("tg") else run_worker(system, model, args.steps, args.tg_device)
                   for system in systems}
        errors += [f"{model} {system}: {result}" for system, result in results.items() if isinstance(result, str)]
        cells = [cell(results.get(system), key, fmt) for _, system, key, fmt in columns]
        print(" | ".join([model, *cells, *([] if args.no_autocast else [speedup(results)])]), flush=True)
    for error in errors:
        print("error", error)


if __name__ == "__main__":
    main()
