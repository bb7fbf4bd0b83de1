"""Benchmark: one compiled program for many shapes (`tg.compile(fn, dynamic=...)`) against a program per shape.

    .venv/bin/python bench/dynamic.py [--models mlp,enc2] [--repeats 15] [--clock wall|cpu]

Models (inference, no grad): bench/train.py's MLP (784-1024-1024-10) with a dynamic batch, and its 2-layer encoder
(width 256, 4 heads, ffn 1024) with dynamic batch and sequence length. Each is called with 20 sizes; the dynamic
function compiles at most a few programs (`compiled_programs`), the static one (`tg.compile(fn)`) one per size.
For every size, ms is the median of `--repeats` calls of each, interleaved (the machine is shared: the ratio is the
figure to read; `--clock cpu` counts the process's CPU time, every thread's, instead of wall time). First-call
seconds (wall) are the trace and compile costs (gcc's cache is warm after the first run).
Every size's result must equal the static program's (a check, reported).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

import tensorgraphs as tg
import tensorgraphs.nn as nn
import tensorgraphs.nn.functional as F

sys.path.insert(0, str(Path(__file__).parent))
from train import D_MODEL, ModelSpec, build_model  # noqa: E402

MLP_BATCHES = (1, 3, 7, 8, 16, 25, 32, 50, 64, 77, 100, 128, 150, 200, 256, 300, 384, 400, 500, 512)
ENCODER_SIZES = ((1, 16), (2, 16), (1, 37), (4, 8), (2, 50), (8, 16), (3, 64), (1, 128), (4, 33), (2, 100),
                 (8, 32), (5, 47), (6, 64), (1, 200), (3, 90), (8, 64), (2, 128), (7, 55), (4, 128), (8, 128))


def model_and_shapes(name: str) -> tuple[Any, list[tuple[int, ...]], dict]:
    tg.manual_seed(0)
    if name == "mlp":
        model = build_model(nn, F, ModelSpec(0, 1))
        return model, [(b, 784) for b in MLP_BATCHES], {"x": {0: tg.Dim("batch", 1, 4096)}}
    model = build_model(nn, F, ModelSpec(2, 1))
    dims = {"x": {0: tg.Dim("batch", 1, 64), 1: tg.Dim("seq", 1, 1024)}}
    return model, [(b, t, D_MODEL) for b, t in ENCODER_SIZES], dims


CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}
clock = CLOCKS["wall"]


def timed(call: Callable[[], Any], by: Callable[[], float] | None = None) -> float:
    """Seconds `call` takes by the chosen `clock` (or `by`)."""
    read = by or clock
    start = read()
    call()
    return read() - start


def run(name: str, repeats: int) -> None:
    model, shapes, dims = model_and_shapes(name)
    model.eval()
    dynamic = tg.compile(lambda x: model(x), dynamic=dims)
    static = tg.compile(lambda x: model(x))
    functions = {"dynamic": dynamic, "static": static}
    rng = np.random.default_rng(0)
    print(f"\n{name}: dynamic {dims}")
    print(f"{'shape':>16} {'dyn ms':>9} {'static ms':>9} {'ratio':>6} {'dyn 1st s':>9} {'static 1st s':>12}  "
          "programs  same")
    ratios = []
    with tg.no_grad():
        for shape in shapes:
            x = rng.standard_normal(shape, dtype=np.float32)
            wall = time.perf_counter  # gcc runs in a child process, whose CPU time the process's leaves out
            first_dynamic, first_static = timed(lambda: dynamic(x), wall), timed(lambda: static(x), wall)
            same = np.array_equal(dynamic(x).numpy(), static(x).numpy())
            times: dict[str, list[float]] = {"dynamic": [], "static": []}
            for repeat in range(repeats):  # in turns, each first every other time (no bias from the order)
                for key in ("dynamic", "static")[::1 if repeat % 2 == 0 else -1]:
                    times[key].append(timed(lambda: functions[key](x)))
            ms = {k: statistics.median(v) * 1e3 for k, v in times.items()}
            ratios.append(ms["dynamic"] / ms["static"])
            print(f"{str(shape):>16} {ms['dynamic']:9.3f} {ms['static']:9.3f} {ratios[-1]:6.2f} "
                  f"{first_dynamic:9.2f} {first_static:12.2f}  {dynamic.compiled_programs:8d}  {same}")
    print(f"programs compiled: dynamic {dynamic.compiled_programs}, static {static.compiled_programs}; "
          f"time ratio dynamic/static median {statistics.median(ratios):.3f}, max {max(ratios):.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="mlp,enc2")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--clock", choices=CLOCKS, default="wall", help="wall-clock or process CPU time")
    args = parser.parse_args()
    global clock
    clock = CLOCKS[args.clock]
    for name in args.models.split(","):
        run(name, args.repeats)


if __name__ == "__main__":
    main()
