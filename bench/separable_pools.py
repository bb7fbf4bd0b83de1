"""Same-process A/B of separable pool windows (`pooling.SEPARABLE_MIN_TAPS` 9 against never): the pools alone
(F.max_pool2d: SqueezeNet's stem 3x3/2, Inception's 3x3/1) and whole ONNX models (bench/onnx.py's light graphs),
on one thread by thread CPU time, the variants interleaved; the pools also by their kernels' CPU time.

    OMP_NUM_THREADS=1 .venv/bin/python bench/separable_pools.py [--models squeezenet,inception_v1] [--rounds 7]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TG_KERNEL_CLOCK", "cpu")
sys.path[0] = str(Path(__file__).resolve().parents[1])
import numpy as np  # noqa: E402

import tensorgraphs as tg  # noqa: E402
import tensorgraphs.nn.functional as F  # noqa: E402
from tensorgraphs.nn.functional import pooling  # noqa: E402

POOLS = {"stem 64x111x111 3x3/2": ((1, 64, 111, 111), 3, 2, 0),
         "inception 192x28x28 3x3/1": ((1, 192, 28, 28), 3, 1, 1),
         "inception 480x14x14 3x3/1": ((1, 480, 14, 14), 3, 1, 1)}
VARIANTS = {"one kernel": 1 << 30, "separable": 9}


def onnx_bench():
    """bench/onnx.py (its name would shadow the onnx package on the path)."""
    spec = importlib.util.spec_from_file_location("onnx_bench", Path(__file__).with_name("onnx.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def compiled(function, x: tg.Tensor) -> dict:
    """Each variant's compiled `function`, traced (by a first call) with its threshold."""
    out = {}
    for label, threshold in VARIANTS.items():
        pooling.SEPARABLE_MIN_TAPS = threshold
        out[label] = tg.compile(function)
        out[label](x).numpy()
    pooling.SEPARABLE_MIN_TAPS = VARIANTS["separable"]
    return out


def call_ms(function, x: tg.Tensor, calls: int) -> float:
    start = time.thread_time()
    for _ in range(calls):
        function(x).numpy()
    return (time.thread_time() - start) / calls * 1e3


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default="squeezenet,inception_v1")
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    cases = {}
    for name, (shape, k, s, p) in POOLS.items():
        x = tg.tensor(np.random.default_rng(0).standard_normal(shape).astype(np.float32))
        cases[name] = (compiled(lambda t, k=k, s=s, p=p: F.max_pool2d(t, k, s, p), x), x, 50)
    for name in filter(None, args.models.split(",")):
        model = onnx_bench().light_model(name, 1)
        x = tg.tensor(onnx_bench().example(model, 1))
        cases[name] = (compiled(tg.onnx.load(model).requires_grad_(False).forward, x), x, 3)
    for name, (functions, x, _) in cases.items():
        outs = [f(x).numpy() for f in functions.values()]
        np.testing.assert_allclose(outs[0], outs[1], rtol=1e-4, atol=1e-4)
        print(name, {label: str(f.stats) for label, f in functions.items()}, flush=True)
    times = {(name, label): [] for name, (functions, _, _) in cases.items() for label in functions}
    kernels = {(name, label): [] for name in POOLS for label in VARIANTS}
    for _ in range(args.rounds):
        for name, (functions, x, calls) in cases.items():
            for label, f in functions.items():
                times[name, label].append(call_ms(f, x, calls))
                if name in POOLS:
                    kernels[name, label].append(sum(t for _, t in f.kernel_times(x, repeat=20)) * 1e3)
    print(f"threads {os.environ['OMP_NUM_THREADS']}, load average {os.getloadavg()[0]:.1f}, median of {args.rounds}")
    for name in cases:
        row = {label: statistics.median(times[name, label]) for label in VARIANTS}
        line = ", ".join(f"{label} {ms:.3f} ms" for label, ms in row.items())
        if name in POOLS:
            medians = (f"{statistics.median(kernels[name, label]):.3f}" for label in VARIANTS)
            line += f" (kernels {', '.join(medians)} ms)"
        print(f"{name}: {line}")


if __name__ == "__main__":
    main()
