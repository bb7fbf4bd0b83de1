"""Benchmark: the generated GEMM and conv2d kernels and the BLAS kernel against torch (MKL), in one run.

    .venv/bin/python bench/gemm.py [--big] [--min-time 0.3] [--only squares,transformer,resnet,fused,prologue]
                                   [--threads N] [--clock wall|cpu] [--tuned]

Every row times ours and torch interleaved (ours, torch, ours, ...) so background load hits them alike, then
BLAS, all after warm-up. It prints medians in GFLOP/s; the ratio to torch (median over adjacent pairs of runs)
against the targets of issue 5 (GEMM >= 95% of torch, conv2d >= 80%, fused linear+gelu faster than torch's
linear then gelu, gelu(h) @ W with gelu applied while packing h faster than torch's gelu then linear); the
fraction of this machine's FMA peak (measured at start with a register-only FMA loop on every thread); and the
spread of ours (interquartile range / median), which says how noisy the row was. A 3x3 stride-1 conv row has a
second line, "winograd": our Winograd F(4x4, 3x3) kernel (its GFLOP/s count the direct algorithm's flops); a conv of
few input channels (the stem) a line "direct": our direct conv (direct.c); every
conv row has a line "im2col": the explicit im2col and OpenBLAS sgemm kernel (im2col.c), where scipy-openblas32 is
installed. On a machine without AVX-512 only that kernel runs (the GEMM library's rows are left out): --only resnet.
With --tuned, every conv row has a line "tuned: <candidate>": the conv as a compiled program (`tg.compile`) runs it
after `tg tune`, the candidate the planner measured fastest (implicit_gemm, winograd, im2col or decompose).

On a machine shared with other work, `--threads 1 --clock cpu` compares the kernels by the CPU time of the one
thread (time the thread was descheduled does not count), which is far less noisy than wall-clock time.
Ours and torch share torch's OpenMP runtime (torch is imported first), so --threads sets both.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from peak import fma_peak  # noqa: E402

from tensorgraphs.kernels import blas, gemm  # noqa: E402
from tensorgraphs.schedule.convolution import DIRECT_MAX_CHANNELS  # noqa: E402

CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}
clock = time.perf_counter


def timed_runs(candidates: dict[str, Callable[[], object]], min_time: float) -> dict[str, list[float]]:
    """Seconds per call of each candidate, timed round-robin after warm-up, until each has run min_time."""
    for run in candidates.values():
        for _ in range(2):
            run()
    times: dict[str, list[float]] = {name: [] for name in candidates}
    while min(sum(t) for t in times.values()) < min_time or min(len(t) for t in times.values()) < 7:
        for name, run in candidates.items():
            start = clock()
            run()
            times[name].append(clock() - start)
        if len(times[next(iter(times))]) >= 200:
            break
    return times


def measure(candidates: dict[str, Callable[[], object]], min_time: float) -> dict[str, list[float]]:
    """Ours (and our Winograd conv, where a row has it) and torch interleaved (they share torch's OpenMP pool); BLAS
    alone afterwards, then a pause, because OpenBLAS's own threads keep spinning after a call and would slow
    whatever runs next."""
    times = timed_runs({name: run for name, run in candidates.items() if name != "blas"}, min_time)
    if "blas" in candidates:
        times |= timed_runs({"blas": candidates["blas"]}, min_time)
        time.sleep(0.2)
    return times


def random(shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape, dtype=np.float32)


def matmul_row(batch: int, m: int, k: int, n: int, transpose_b: bool = False) -> tuple[float, dict]:
    a = random((batch, m, k) if batch > 1 else (m, k), 1)
    b = (
        random((batch, n, k) if batch > 1 else (n, k), 2).swapaxes(-1, -2)
        if transpose_b
        else random((batch, k, n) if batch > 1 else (k, n), 2)
    )
    out = np.empty(a.shape[:-1] + (n,), np.float32)
    ta, tb, tout = (
        torch.from_numpy(a),
        torch.from_numpy(np.ascontiguousarray(b.swapaxes(-1, -2))),
        torch.from_numpy(out.copy()),
    )
    tb = tb.transpose(-1, -2) if transpose_b else torch.from_numpy(b)
    candidates = {"ours": gemm.bind_matmul(a, b, out=out), "torch": lambda: torch.matmul(ta, tb, out=tout)}
    if blas.available():
        candidates["blas"] = blas.bind_matmul(a, b, out=out)
    return 2.0 * batch * m * n * k, candidates


def fused_row(m: int, k: int, n: int) -> tuple[float, dict]:
    x, weight, bias = random((m, k), 1), random((n, k), 2), random((n,), 3)
    out = np.empty((m, n), np.float32)
    tx, tw, tbias = torch.from_numpy(x), torch.from_numpy(weight), torch.from_numpy(bias)
    gelu = torch.nn.functional.gelu
    candidates = {
        "ours": gemm.bind_matmul(x, weight.T, bias=bias, activation="gelu_tanh", out=out),
        "torch": lambda: gelu(torch.nn.functional.linear(tx, tw, tbias), approximate="tanh"),
    }
    if blas.available():
        candidates["blas"] = blas.bind_matmul(x, weight.T, bias=bias, activation="gelu_tanh", out=out)
    return 2.0 * m * n * k, candidates


def prologue_row(m: int, k: int, n: int) -> tuple[float, dict]:
    """gelu(h) @ W.T (a transformer's second FFN linear): ours activates h while packing it (gemm.h prologue)."""
    h, weight = random((m, k), 1), random((n, k), 2)
    out = np.empty((m, n), np.float32)
    th, tw = torch.from_numpy(h), torch.from_numpy(weight)
    gelu = torch.nn.functional.gelu
    candidates = {
        "ours": gemm.bind_matmul(h, weight.T, a_prologue="gelu_tanh", out=out),
        "torch": lambda: torch.nn.functional.linear(gelu(th, approximate="tanh"), tw),
    }
    if blas.available():
        candidates["blas"] = blas.bind_matmul(h, weight.T, a_prologue="gelu_tanh", out=out)
    return 2.0 * m * n * k, candidates


def planned_conv(x: np.ndarray, weight: np.ndarray, stride: int, padding: int) -> tuple[str, Callable[[], object]]:
    """The conv as a compiled program runs it after `tg tune`: its candidates measured first where the kernel
    database (of TG_CACHE_DIR) lacks them, then the planner's choice. (That choice, a call of the program.)"""
    import tensorgraphs as tg
    import tensorgraphs.nn.functional as F
    from tensorgraphs.plan.choices import collecting, compiled_planner, tuning

    conv = tg.compile(lambda a, b: F.conv2d(a, b, stride=stride, padding=padding))
    with tuning(), collecting() as found:
        conv(x, weight)
    (node,) = [node for uses in found.values() for use, node in uses.items() if use.signature.name == "conv2d"]
    return compiled_planner().route(node), lambda: conv(x, weight)


def conv_row(batch: int, cin: int, size: int, cout: int, kernel: int, stride: int, padding: int,
             tuned: bool = False) -> tuple[float, dict]:
    x, weight = random((batch, cin, size, size), 1), random((cout, cin, kernel, kernel), 2)
    tx, tw = torch.from_numpy(x), torch.from_numpy(weight)
    out_size = (size + 2 * padding - kernel) // stride + 1
    candidates = {"torch": lambda: torch.nn.functional.conv2d(tx, tw, stride=stride, padding=padding)}
    if gemm.available():
        candidates["ours"] = lambda: gemm.conv2d(x, weight, stride=stride, padding=padding)
    if gemm.available() and kernel == 3 and stride == 1:
        candidates["winograd"] = lambda: gemm.conv2d(x, weight, stride=stride, padding=padding, algorithm="winograd")
    if gemm.available() and cin <= DIRECT_MAX_CHANNELS and kernel > 1:
        candidates["direct"] = lambda: gemm.conv2d(x, weight, stride=stride, padding=padding, algorithm="direct")
    if blas.conv_available():
        candidates["im2col"] = lambda: blas.conv2d(x, weight, stride=stride, padding=padding)
    if tuned:
        route, run = planned_conv(x, weight, stride, padding)
        candidates[f"tuned: {route}"] = run
    return 2.0 * batch * cout * out_size * out_size * cin * kernel * kernel, candidates


RESNET18 = [  # (name, cin, input size, cout, kernel, stride, padding) at batch 8, 224x224 images
    ("conv1", 3, 224, 64, 7, 2, 3),
    ("layer1 3x3", 64, 56, 64, 3, 1, 1),
    ("layer2.0 3x3/2", 64, 56, 128, 3, 2, 1),
    ("layer2 3x3", 128, 28, 128, 3, 1, 1),
    ("layer2 down 1x1/2", 64, 56, 128, 1, 2, 0),
    ("layer3.0 3x3/2", 128, 28, 256, 3, 2, 1),
    ("layer3 3x3", 256, 14, 256, 3, 1, 1),
    ("layer3 down 1x1/2", 128, 28, 256, 1, 2, 0),
    ("layer4.0 3x3/2", 256, 14, 512, 3, 2, 1),
    ("layer4 3x3", 512, 7, 512, 3, 1, 1),
    ("layer4 down 1x1/2", 256, 14, 512, 1, 2, 0),
]


GROUPS = ("squares", "transformer", "fused", "prologue", "resnet")


def rows(groups: set[str], big: bool, tuned: bool) -> list[tuple[str, str, float, Callable[[], tuple[float, dict]]]]:
    """(group, label, target ratio to torch, builder) for every benchmark row."""
    table = []
    if "squares" in groups:
        for size in (256, 512, 1024, 2048, *((4096,) if big else ())):
            target = 0.95 if size >= 512 else 0.0
            table.append(("square", f"{size}^3", target, lambda s=size: matmul_row(1, s, s, s)))
    if "transformer" in groups:
        for m, k, n in ((1024, 256, 768), (1024, 256, 256), (1024, 256, 1024), (1024, 1024, 256)):
            table.append(("transformer", f"{m}x{k}x{n}", 0.95, lambda m=m, k=k, n=n: matmul_row(1, m, k, n)))
        table.append(("transformer", "32x128x64x128 q@kT", 0.95, lambda: matmul_row(32, 128, 64, 128, True)))
        table.append(("transformer", "32x128x128x64 p@v", 0.95, lambda: matmul_row(32, 128, 128, 64)))
    if "fused" in groups:
        for m, k, n in ((1024, 256, 1024), (1024, 768, 3072)):
            table.append(("linear+gelu", f"{m}x{k}x{n}", 1.0, lambda m=m, k=k, n=n: fused_row(m, k, n)))
    if "prologue" in groups:
        for m, k, n in ((1024, 1024, 256), (1024, 3072, 768)):
            table.append(("gelu+linear", f"{m}x{k}x{n}", 1.0, lambda m=m, k=k, n=n: prologue_row(m, k, n)))
    if "resnet" in groups:
        for name, cin, size, cout, kernel, stride, padding in RESNET18:
            table.append(("conv2d b8", name, 0.8,
                          lambda c=(cin, size, cout, kernel, stride, padding): conv_row(8, *c, tuned=tuned)))
    return table


def print_row(group: str, label: str, target: float, flops: float, times: dict[str, list[float]], ours: str,
              peak: float) -> str:
    """One row of the table for our implementation `ours` (GFLOP/s count the direct algorithm's flops); whether it
    met the target ("ok", "MISS", or "" with none)."""
    gflops = {name: flops / statistics.median(t) / 1e9 for name, t in times.items()}
    quartiles = statistics.quantiles(times[ours], n=4)
    ratio = statistics.median(t / o for o, t in zip(times[ours], times["torch"], strict=True))
    met = "" if target == 0 else ("ok" if ratio >= target else "MISS")
    print(
        f"{group:<12} {label:<20} {gflops[ours]:6.0f} {gflops.get('blas', float('nan')):6.0f} "
        f"{gflops['torch']:6.0f} {ratio:9.2f}x {target:5.2f} {met:<4} {100 * gflops[ours] / peak:4.0f}% "
        f"{100 * (quartiles[2] - quartiles[0]) / statistics.median(times[ours]):5.0f}%",
        flush=True,
    )
    return met


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--big", action="store_true", help="add the 4096^3 square")
    parser.add_argument("--min-time", type=float, default=0.3, help="seconds of runs per implementation and row")
    parser.add_argument("--only", default=",".join(GROUPS), help="comma-separated row groups")
    parser.add_argument("--threads", type=int, default=None, help="threads for ours, torch and BLAS")
    parser.add_argument("--clock", choices=CLOCKS, default="wall", help="cpu needs --threads 1")
    parser.add_argument("--tuned", action="store_true",
                        help="add to each conv row the compiled path's choice after tuning (measured where the "
                             "kernel database of TG_CACHE_DIR lacks it)")
    options = parser.parse_args()
    unknown = set(options.only.split(",")) - set(GROUPS)
    if unknown:
        parser.error(f"unknown row groups {sorted(unknown)}: choose from {','.join(GROUPS)}")
    if not gemm.available() and set(options.only.split(",")) != {"resnet"}:
        parser.error("only the resnet rows run without the AVX-512 GEMM library (their im2col kernel): --only resnet")
    if options.clock == "cpu" and options.threads != 1:
        parser.error("--clock cpu measures one thread: add --threads 1")
    if options.threads:
        torch.set_num_threads(options.threads)
        os.environ["OPENBLAS_NUM_THREADS"] = str(options.threads)  # read when the BLAS kernel loads OpenBLAS
    global clock
    clock = CLOCKS[options.clock]
    os.environ["TG_KERNEL_CLOCK"] = options.clock  # what tuning measures by
    peak = fma_peak(options.clock == "cpu")
    blocking = gemm.blocking() if gemm.available() else "none (no AVX-512 GEMM library)"
    print(
        f"threads {torch.get_num_threads()} (ours and torch), clock {options.clock}; "
        f"blocking {blocking}; FMA peak {peak:.0f} GFLOP/s; load average {os.getloadavg()[0]:.1f}"
    )
    print(
        f"{'group':<12} {'shape (M x K x N)':<20} {'ours':>6} {'blas':>6} {'torch':>6} {'ours/torch':>10} "
        f"{'target':>6} {'peak%':>6} {'spread':>6}"
    )
    misses = 0
    for group, label, target, build in rows(set(options.only.split(",")), options.big, options.tuned):
        flops, candidates = build()
        times = measure(candidates, options.min_time)
        for ours in times:
            if ours not in ("torch", "blas"):
                suffix = "" if ours == "ours" else f" {ours}"
                misses += print_row(group, label + suffix, target, flops, times, ours, peak) == "MISS"
    print(f"rows below target: {misses}; load average now {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
