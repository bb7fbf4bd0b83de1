"""Benchmark: a compiled training step before and after the kernel search (`plan.kernel_search`).

    .venv/bin/python bench/kernel_search.py [--models mlp,enc1] [--steps 20] [--rounds 3] [--budget SECONDS]

Per model of bench/train.py (the MLP 784-1024-1024-10 at batch 256, the 1-layer pre-LN encoder at batch 8 x 128):
the step compiled with the lowering's schedules ("before"), then its generated kernels searched (as `tg tune`
does, until `--budget` seconds have passed: the kernels left keep the lowering's schedule; the search time is the
compile of the searching step, minus an ordinary compile), then the step compiled
again with the stored schedules ("after"). Before and after are timed interleaved, `--rounds` rounds of `--steps`
steps each; each figure is the median step time. Runs in a fresh kernel database and compile cache (a temporary
TG_CACHE_DIR) unless TG_CACHE_DIR is set.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections import OrderedDict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def _median_step(step, steps: int) -> float:
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def run(model: str, steps: int, rounds: int, budget: float) -> dict[str, float]:
    from train import MODELS, tg_training_step

    import tensorgraphs as tg
    from tensorgraphs.backends.cpu import CPU
    from tensorgraphs.plan import kernel_search

    step, inputs, targets = tg_training_step(MODELS[model])

    def compiled_step():
        CPU._programs = OrderedDict()  # a new program, built with what the database holds now
        function = tg.compile(step)
        start = time.perf_counter()
        function(inputs, targets)
        return (lambda: function(inputs, targets)), time.perf_counter() - start

    before, compile_seconds = compiled_step()
    with kernel_search.searching(time.perf_counter() + budget), kernel_search.recording() as seen:
        _, searching_seconds = compiled_step()
    kernels = {kernel.key: kernel.choice for kernel in seen}
    after, _ = compiled_step()
    timed: dict[str, list[float]] = {"before": [], "after": []}
    for _ in range(rounds):
        for name, function in (("before", before), ("after", after)):
            function()  # warm-up
            timed[name].append(_median_step(function, steps))
    return {"before_ms": 1e3 * statistics.median(timed["before"]), "after_ms": 1e3 * statistics.median(timed["after"]),
            "kernels": len(kernels), "searched": sum(c is not None for c in kernels.values()),
            "changed": sum(c is not None and c.options != "default" for c in kernels.values()),
            "search_s": searching_seconds - compile_seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="mlp,enc1", help="comma-separated models of bench/train.py")
    parser.add_argument("--steps", type=int, default=20, help="timed steps per round")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds of before and after")
    parser.add_argument("--budget", type=float, default=float("inf"), help="seconds of searching per model")
    args = parser.parse_args()
    if not os.environ.get("TG_CACHE_DIR"):
        os.environ["TG_CACHE_DIR"] = tempfile.mkdtemp(prefix="tg-kernel-search-")
    print(f"{'model':<6} {'before ms':>10} {'after ms':>10} {'speedup':>8} {'kernels':>8} {'searched':>9} "
          f"{'changed':>8} {'search s':>9}")
    for model in args.models.split(","):
        r = run(model, args.steps, args.rounds, args.budget)
        print(f"{model:<6} {r['before_ms']:>10.2f} {r['after_ms']:>10.2f} {r['before_ms'] / r['after_ms']:>7.2f}x "
              f"{r['kernels']:>8} {r['searched']:>9} {r['changed']:>8} {r['search_s']:>9.1f}")


if __name__ == "__main__":
    main()
