"""Benchmark: scaled-dot-product attention forward + backward, tg (compiled) against torch, each system in its own
process.

    .venv/bin/python bench/attention.py [--lengths 1024,2048,4096] [--heads 8] [--dim 64] [--causal]
                                        [--repeats 5] [--no-torch-compile] [--threads N] [--clock wall|cpu]

One step computes out = softmax(q k^T / sqrt(d)) v (batch 1, `heads` heads, T queries and keys, head dim d) and the
gradients of q, k and v given a random gradient of out. tg: `tg.compile` of a function returning out and
`tg.grad` of it (the fused attention kernel); torch: F.scaled_dot_product_attention and `backward`, eager and
under torch.compile. Both steps return their results without copying them (`np.asarray` of ours shares its
memory, as torch's tensors are returned as they are; `.numpy()` would copy ours). ms is the median of the timed
steps after warm-up steps (not counted). Each (system, T) runs in a fresh subprocess (`--worker SYSTEM T`, JSON on
stdout), so its peak RSS (ru_maxrss) is its own; "extra MiB" is the peak minus the peak before the first step
(imports and the inputs): the memory the attention needs.

The floor is the FMA work at PEAK_GFLOPS (2 threads, the FMA peak measured by bench/gemm.py; half of it with
--threads 1): forward 2 products (4 T^2 d flops a head), backward 5 (10 T^2 d); half of each with --causal. On a
shared machine, `--threads 1 --clock cpu` compares the CPU time of one thread (time it was descheduled does not
count).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

import numpy as np

SEED = 0
WARMUP_STEPS = 2
PEAK_GFLOPS = 231.0
SYSTEMS = ("tg", "eager", "compile")
CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}


def make_data(length: int, heads: int, dim: int) -> list[np.ndarray]:
    """q, k, v and the gradient of out, identical for every system."""
    rng = np.random.default_rng(SEED)
    return [rng.standard_normal((1, heads, length, dim), dtype=np.float32) for _ in range(4)]


def floor_ms(length: int, heads: int, dim: int, causal: bool, threads: int | None) -> float:
    flops = (4 + 10) * length * length * dim * heads * (0.5 if causal else 1.0)
    return flops / (PEAK_GFLOPS * (threads or 2) / 2 * 1e9) * 1e3


def tg_step(arrays: list[np.ndarray], causal: bool) -> Callable[[], object]:
    import tensorgraphs as tg
    import tensorgraphs.nn.functional as F

    @tg.compile
    def step(q: tg.Tensor, k: tg.Tensor, v: tg.Tensor, grad: tg.Tensor) -> tuple[tg.Tensor, ...]:
        out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        return (out, *tg.grad(out, [q, k, v], grad_outputs=grad))

    q, k, v, grad = (tg.tensor(a, requires_grad=i < 3) for i, a in enumerate(arrays))
    return lambda: [np.asarray(t) for t in step(q, k, v, grad)]


def torch_step(arrays: list[np.ndarray], causal: bool, compiled: bool) -> Callable[[], object]:
    import torch

    torch.manual_seed(SEED)
    q, k, v = (torch.tensor(a, requires_grad=True) for a in arrays[:3])
    grad = torch.tensor(arrays[3])

    def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)

    forward = torch.compile(attention) if compiled else attention

    def step() -> object:
        for t in (q, k, v):
            t.grad = None
        out = forward(q, k, v)
        out.backward(grad)
        return out, q.grad, k.grad, v.grad

    return step


def worker(system: str, length: int, heads: int, dim: int, causal: bool, repeats: int, clock_name: str,
           threads: int | None) -> dict[str, float]:
    if threads and system != "tg":
        import torch

        torch.set_num_threads(threads)
    clock = CLOCKS[clock_name]
    arrays = make_data(length, heads, dim)
    step = tg_step(arrays, causal) if system == "tg" else torch_step(arrays, causal, system == "compile")
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    for _ in range(WARMUP_STEPS):
        step()
    times = []
    for _ in range(repeats):
        start = clock()
        step()
        times.append(clock() - start)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"ms": statistics.median(times) * 1e3, "peak_mib": peak / 1024, "extra_mib": (peak - before) / 1024}


def run_worker(system: str, length: int, args: argparse.Namespace) -> dict[str, float] | None:
    command = [sys.executable, __file__, "--worker", system, str(length), "--heads", str(args.heads), "--dim",
               str(args.dim), "--repeats", str(args.repeats), "--clock", args.clock] + (
                   ["--causal"] if args.causal else [])
    env = dict(os.environ)
    if args.threads:
        command += ["--threads", str(args.threads)]
        env["OMP_NUM_THREADS"] = str(args.threads)
    result = subprocess.run(command, capture_output=True, text=True, env=env)
    if result.returncode != 0:
        print(f"{system} T={length} failed:\n{result.stderr[-2000:]}", file=sys.stderr)
        return None
    return json.loads(result.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="1024,2048,4096")
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--no-torch-compile", action="store_true")
    parser.add_argument("--threads", type=int, default=None, help="threads of both systems (OMP_NUM_THREADS)")
    parser.add_argument("--clock", choices=CLOCKS, default="wall", help="wall-clock or process CPU time")
    parser.add_argument("--worker", nargs=2, metavar=("SYSTEM", "T"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.clock == "cpu" and args.threads != 1:
        parser.error("--clock cpu measures one thread: add --threads 1")
    if args.worker:
        system, length = args.worker
        print(json.dumps(worker(system, int(length), args.heads, args.dim, args.causal, args.repeats, args.clock,
                                args.threads)))
        return
    systems = [s for s in SYSTEMS if not (s == "compile" and args.no_torch_compile)]
    print(f"attention forward+backward, batch 1, {args.heads} heads, head dim {args.dim}"
          f"{', causal' if args.causal else ''}; median of {args.repeats} after {WARMUP_STEPS} warm-up steps, "
          f"{args.clock} clock, {args.threads or 'default'} threads")
    print(f"{'T':>6} {'system':>8} {'ms':>9} {'floor ms':>9} {'of floor':>9} {'vs eager':>9} {'peak MiB':>9} "
          f"{'extra MiB':>10}")
    for length in map(int, args.lengths.split(",")):
        floor = floor_ms(length, args.heads, args.dim, args.causal, args.threads)
        results = {system: run_worker(system, length, args) for system in systems}
        eager = results.get("eager")
        for system, found in results.items():
            if found is None:
                continue
            speedup = f"{eager['ms'] / found['ms']:.2f}x" if eager else "-"
            print(f"{length:>6} {system:>8} {found['ms']:>9.1f} {floor:>9.1f} {found['ms'] / floor:>8.2f}x "
                  f"{speedup:>9} {found['peak_mib']:>9.0f} {found['extra_mib']:>10.1f}")


if __name__ == "__main__":
    main()
