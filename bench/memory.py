"""Benchmark: arena vs naive temporary bytes and peak process RSS for a pre-LN transformer, next to torch eager.

    .venv/bin/python bench/memory.py [--layers 1,2,4] [--steps 3] [--mode adam|grads|forward] [--skip-torch]

Model: pre-LN transformer encoder layers (d_model 256, 4 heads, ffn 1024, seq 128, batch 8, no dropout),
loss = mean squared error to a target; one step (`--mode adam`, the default) = zero_grad, forward, loss,
backward and an Adam step (lr 1e-3), the whole step compiled into one program; `grads` stops at the
gradients, `forward` at the loss. Each (framework, layers) row runs in its own subprocess so
its peak RSS is its alone: "peak" over the whole process (imports and, for ours, tracing and compiling), and
"steps": the peak while running the steps after the first call (VmHWM reset through /proc/self/clear_refs).
Ours runs `tg.compile` on the cpu backend.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

D_MODEL, HEADS, FFN, SEQ, BATCH = 256, 4, 1024, 128, 8


def peak_rss_mib() -> float:
    """The process's peak resident set since start or the last `reset_peak_rss` (VmHWM, in MiB)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def reset_peak_rss() -> None:
    Path("/proc/self/clear_refs").write_text("5")  # Linux: VmHWM := current RSS


def data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return (rng.normal(size=(BATCH, SEQ, D_MODEL)).astype(np.float32),
            rng.normal(size=(BATCH, SEQ, D_MODEL)).astype(np.float32))


MODES = ("adam", "grads", "forward")


def run_ours(layers: int, steps: int, mode: str) -> dict:
    import tensorgraphs as tg
    from tensorgraphs import nn

    tg.manual_seed(0)
    model = nn.Sequential(*[nn.TransformerEncoderLayer(D_MODEL, HEADS, FFN, dropout=0.0, batch_first=True,
                                                       norm_first=True) for _ in range(layers)])
    params = list(model.parameters())
    optimizer = tg.optim.Adam(params, lr=1e-3)

    def step(x: tg.Tensor, target: tg.Tensor) -> tuple[tg.Tensor, ...]:
        optimizer.zero_grad()
        loss = ((model(x) - target) ** 2).mean()
        if mode == "forward":
            return (loss,)
        if mode == "grads":
            return (loss, *tg.grad(loss, params))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()  # no gradient kept after the step: the program need not write them out
        return (loss,)

    compiled = tg.compile(step)
    x, target = data()
    started = time.perf_counter()
    compiled(x, target)
    first = time.perf_counter() - started
    peak = peak_rss_mib()
    reset_peak_rss()
    started = time.perf_counter()
    for _ in range(steps):
        loss = compiled(x, target)[0].item()
    stats = compiled.stats
    (trace, *_) = next(iter(compiled.traces.values()))  # the traces of the one signature called
    plan = trace.program.memory
    return {"kernels": stats.kernels, "arena_bytes": stats.arena_bytes, "naive_bytes": stats.naive_bytes,
            "live_bytes": plan.live_bytes, "in_place": len(plan.in_place),
            "recomputed": sum(life.copy_of is not None for life in plan.lifetimes),
            "compile_s": round(stats.compile_seconds, 2), "first_call_s": round(first, 2),
            "step_s": round((time.perf_counter() - started) / steps, 4), "loss": loss, "peak_rss_mib": peak,
            "steps_rss_mib": peak_rss_mib()}


def run_torch(layers: int, steps: int, mode: str) -> dict:
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.TransformerEncoderLayer(D_MODEL, HEADS, FFN, dropout=0.0,
                                                                   batch_first=True, norm_first=True)
                                  for _ in range(layers)])
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    x, target = (torch.from_numpy(a) for a in data())
    started = time.perf_counter()
    peak = peak_rss_mib()
    reset_peak_rss()
    for _ in range(steps):
        with torch.set_grad_enabled(mode != "forward"):
            optimizer.zero_grad()
            loss = ((model(x) - target) ** 2).mean()
            if mode != "forward":
                loss.backward()
            if mode == "adam":
                optimizer.step()
    steps_rss = peak_rss_mib()
    return {"step_s": round((time.perf_counter() - started) / steps, 4), "loss": loss.item(),
            "peak_rss_mib": max(peak, steps_rss), "steps_rss_mib": steps_rss}


WORKERS = {"ours": run_ours, "torch": run_torch}


def in_subprocess(framework: str, layers: int, steps: int, mode: str) -> dict:
    command = [sys.executable, __file__, "--worker", framework, "--layers", str(layers), "--steps", str(steps),
               "--mode", mode]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        return {"error": result.stderr.strip().splitlines()[-1] if result.stderr.strip() else "failed"}
    return json.loads(result.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", default="1,2,4")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--mode", choices=MODES, default="adam", help="what one step does (default: an Adam step)")
    parser.add_argument("--skip-torch", action="store_true")
    parser.add_argument("--worker", choices=sorted(WORKERS), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(WORKERS[args.worker](int(args.layers), args.steps, args.mode)))
        return
    what = {"adam": "training step (Adam)", "grads": "forward+backward", "forward": "forward"}[args.mode]
    print(f"pre-LN transformer {what}: d_model {D_MODEL}, {HEADS} heads, ffn {FFN}, seq {SEQ}, batch {BATCH}")
    for layers in map(int, args.layers.split(",")):
        ours = in_subprocess("ours", layers, args.steps, args.mode)
        torch_row = {} if args.skip_torch else in_subprocess("torch", layers, args.steps, args.mode)
        if "error" in ours:
            print(f"{layers} layer(s): ours failed: {ours['error']}")
            continue
        share = 100 * ours["arena_bytes"] / max(ours["naive_bytes"], 1)
        print(f"{layers} layer(s): {ours['kernels']} kernels, arena {ours['arena_bytes'] / 2**20:.1f} MiB vs naive "
              f"{ours['naive_bytes'] / 2**20:.1f} MiB ({share:.1f}% of naive; bound {ours['live_bytes'] / 2**20:.1f} "
              f"MiB, {ours['in_place']} in place, {ours['recomputed']} recomputed); compile {ours['compile_s']} s, "
              f"step {ours['step_s'] * 1e3:.1f} ms; peak RSS ours {ours['peak_rss_mib']:.0f} MiB "
              f"(steps {ours['steps_rss_mib']:.0f}), torch eager {torch_row.get('peak_rss_mib', float('nan')):.0f} "
              f"MiB (steps {torch_row.get('steps_rss_mib', float('nan')):.0f}, "
              f"step {torch_row.get('step_s', float('nan')) * 1e3:.1f} ms)")


if __name__ == "__main__":
    main()
