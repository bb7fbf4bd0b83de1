"""Benchmark: exported C libraries (tg.export) called from a C program vs the same compiled program called from
Python, per model; with the library's size and its build time.

    .venv/bin/python bench/export.py [--models mlp,cnn,gpt,gpt_step] [--repeats 200] [--rounds 3]

Each model is exported (tg.export: trace, the Python program compiled or taken from the cache, the library
built; "build s" is all of it), then called `repeats` times after 10 warm-up calls on the same inputs: from C by a
harness linked against libNAME.a (clock_gettime around each NAME_run), from Python by the tg.compile'd function
(around each call, results as numpy arrays). Times are medians; C and Python alternate `rounds` times and the
best median of each is shown. Both see GOMP_SPINCOUNT=3000, the setting the
Python process gives itself (codegen/compiler.py), and the same OMP_NUM_THREADS (set it to 1 for one-thread
figures, steadier on a busy machine). gpt_step is a whole AdamW training step of the shipped GPT.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

import tensorgraphs as tg
import tensorgraphs.nn as nn
from tensorgraphs.examples.cnn import digits_cnn
from tensorgraphs.examples.gpt import GPT, GPTConfig, make_train_step
from tensorgraphs.export import Exported

WARMUP = 10
ENVIRONMENT = {"GOMP_SPINCOUNT": "3000"}

HARNESS = r"""
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "NAME.h"

static int compare(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* bench INPUTS WARMUP REPEATS: prints the median microseconds of one NAME_run. */
int main(int argc, char **argv) {
    if (argc < 4) return 2;
    NAME_ctx *ctx = NAME_create("NAME.safetensors");
    if (!ctx) {
        fprintf(stderr, "%s\n", NAME_last_error());
        return 1;
    }
    int warmup = atoi(argv[2]), repeats = atoi(argv[3]), n_in = NAME_num_inputs(), n_out = NAME_num_outputs();
    FILE *in = fopen(argv[1], "rb");
    const void *inputs[n_in + 1];
    void *outputs[n_out + 1];
    for (int i = 0; i < n_in; i++) {
        void *data = malloc(NAME_input_bytes(i) + 1);
        if (fread(data, 1, NAME_input_bytes(i), in) != NAME_input_bytes(i)) return 3;
        inputs[i] = data;
    }
    for (int j = 0; j < n_out; j++) outputs[j] = malloc(NAME_output_bytes(j) + 1);
    double *seconds = malloc(sizeof(double) * (size_t)repeats);
    for (int r = -warmup; r < repeats; r++) {
        struct timespec start, end;
        clock_gettime(CLOCK_MONOTONIC, &start);
        if (NAME_run(ctx, inputs, outputs)) {
            fprintf(stderr, "%s\n", NAME_last_error());
            return 1;
        }
        clock_gettime(CLOCK_MONOTONIC, &end);
        if (r >= 0) seconds[r] = (double)(end.tv_sec - start.tv_sec) + 1e-9 * (double)(end.tv_nsec - start.tv_nsec);
    }
    qsort(seconds, (size_t)repeats, sizeof(double), compare);
    printf("%.3f\n", 1e6 * seconds[repeats / 2]);
    NAME_destroy(ctx);
    return 0;
}
"""


def mlp() -> tuple[Any, tuple[Any, ...]]:
    tg.manual_seed(0)
    return nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 10)), (tg.randn(64, 784),)


def cnn() -> tuple[Any, tuple[Any, ...]]:
    tg.manual_seed(0)
    return digits_cnn().eval(), (tg.randn(64, 1, 8, 8),)


CONFIG = GPTConfig(vocab_size=65, block_size=64, n_layer=4, n_head=4, n_embd=128)


def tokens(seed: int) -> tg.Tensor:
    return tg.tensor(np.random.default_rng(seed).integers(0, CONFIG.vocab_size, (16, CONFIG.block_size)))


def gpt() -> tuple[Any, tuple[Any, ...]]:
    tg.manual_seed(0)
    return GPT(CONFIG).eval(), (tokens(0),)


def gpt_step() -> tuple[Any, tuple[Any, ...]]:
    tg.manual_seed(0)
    model = GPT(CONFIG)
    return make_train_step(model, tg.optim.AdamW(model.parameters(), lr=1e-3), compiled=False), (tokens(0), tokens(1))


MODELS: dict[str, Callable[[], tuple[Any, tuple[Any, ...]]]] = {"mlp": mlp, "cnn": cnn, "gpt": gpt,
                                                                  "gpt_step": gpt_step}


def python_microseconds(compiled: Any, args: tuple[Any, ...], repeats: int) -> float:
    times = []
    for r in range(-WARMUP, repeats):
        start = time.perf_counter()
        results = compiled(*args)
        for result in results if isinstance(results, tuple) else (results,):
            result.detach().numpy()
        if r >= 0:
            times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def c_harness(exported: Exported, args: tuple[Any, ...]) -> Callable[[int], float]:
    """The C harness built against the library, with the inputs written for it: repeats -> median µs."""
    directory = exported.files["header"].parent
    prefix = exported.files["header"].stem
    (directory / "bench.c").write_text(HARNESS.replace("NAME", prefix))
    subprocess.run(["gcc", "-O2", "-o", "bench", "bench.c", f"lib{prefix}.a", "-fopenmp", "-lm"], cwd=directory,
                   check=True)
    values = [np.asarray(a.numpy() if isinstance(a, tg.Tensor) else a) for a in args]
    lr = [np.float32(1e-3)] * (len(exported.program.inputs) - len(values))  # the training step's live input
    (directory / "inputs.bin").write_bytes(b"".join(np.ascontiguousarray(v, spec.storage).tobytes() for v, spec
                                                    in zip([*values, *lr], exported.program.inputs)))

    def run(repeats: int) -> float:
        result = subprocess.run(["./bench", "inputs.bin", str(WARMUP), str(repeats)], cwd=directory, check=True,
                                capture_output=True, text=True, env={**os.environ, **ENVIRONMENT})
        return float(result.stdout)

    return run


def row(name: str, repeats: int, rounds: int, directory: Path) -> list[str]:
    model, args = MODELS[name]()
    compiled = tg.CompiledFunction(model)
    exported = tg.export(compiled, args, directory / name, name=name)
    c_run = c_harness(exported, args)
    c, python = float("inf"), float("inf")
    for _ in range(rounds):  # alternating, the best median of each: a busy machine slows either at random
        c = min(c, c_run(repeats))
        python = min(python, python_microseconds(compiled, args, repeats))
    kib = {kind: exported.files[kind].stat().st_size / 1024 for kind in ("shared", "static", "weights")}
    return [name, f"{c:,.0f}", f"{python:,.0f}", f"{c / python:.2f}", f"{kib['shared']:,.0f}", f"{kib['static']:,.0f}",
            f"{kib['weights']:,.0f}", f"{exported.build_seconds:.1f}"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    for name, value in ENVIRONMENT.items():
        os.environ.setdefault(name, value)
    header = ["model", "C µs", "Python µs", "C/Python", ".so KiB", ".a KiB", "weights KiB", "build s"]
    rows = []
    with tempfile.TemporaryDirectory(prefix="tg-bench-export-") as directory:
        for name in args.models.split(","):
            rows.append(row(name, args.repeats, args.rounds, Path(directory)))
            print(" | ".join(rows[-1]), file=sys.stderr)
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for line in [header, ["-" * w for w in widths], *rows]:
        print("| " + " | ".join(cell.rjust(w) for cell, w in zip(line, widths)) + " |")


if __name__ == "__main__":
    main()
