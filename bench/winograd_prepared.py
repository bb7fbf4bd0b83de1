"""Winograd F(4x4, 3x3) with the weights' transform made once (`gemm.winograd_weights`, outside the timing) against
the conv that makes it in each call and against the implicit GEMM, on 3x3 stride-1 convs with bias and relu.

    .venv/bin/python bench/winograd_prepared.py [--baseline DIR] [--rounds 5] [--cold]

--baseline DIR (a folder of the library's sources, e.g. `git archive REV tensorgraphs/kernels/gemm | tar -x -C
/tmp/old` gives /tmp/old/tensorgraphs/kernels/gemm) adds that build's tg_conv2d_winograd_f32, loaded in the same
process. Every round times each kernel in turn (each a median of its calls over 0.2 s of the calling thread's CPU
time, one OpenMP thread); the table shows the medians of the rounds in ms. With --cold every call first finds the
caches holding other data (64 MiB read before it, untimed), as a layer of a whole model finds them: the prepared
conv then reads its weights' transform (four times the weights) from memory.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")  # before any OpenMP runtime loads

import argparse  # noqa: E402
import ctypes  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

from tensorgraphs.kernels import gemm  # noqa: E402
from tensorgraphs.kernels.gemm.build import load_library  # noqa: E402

SHAPES = [  # (x, weight): ResNet's 3x3 stride-1 layers, then DenseNet's, SqueezeNet's and VGG's first
    ((1, 256, 14, 14), (256, 256, 3, 3)),
    ((1, 512, 7, 7), (512, 512, 3, 3)),
    ((1, 128, 28, 28), (128, 128, 3, 3)),
    ((1, 64, 56, 56), (64, 64, 3, 3)),
    ((8, 256, 14, 14), (256, 256, 3, 3)),
    ((8, 512, 7, 7), (512, 512, 3, 3)),
    ((8, 128, 28, 28), (128, 128, 3, 3)),
    ((8, 64, 56, 56), (64, 64, 3, 3)),
    ((1, 128, 56, 56), (32, 128, 3, 3)),
    ((1, 16, 55, 55), (64, 16, 3, 3)),
    ((8, 16, 55, 55), (64, 16, 3, 3)),
    ((1, 64, 224, 224), (64, 64, 3, 3)),
]


def median_ms(call: Callable[[], object], cold: bool, seconds: float = 0.2) -> float:
    times, end = [], time.thread_time() + seconds * (4 if cold else 1)
    while time.thread_time() < end:
        if cold:
            OTHER_DATA.sum()
        start = time.thread_time()
        call()
        times.append(time.thread_time() - start)
    return statistics.median(times) * 1e3


OTHER_DATA = np.ones(16 << 20, np.float32)


def kernels(x_shape: tuple, w_shape: tuple, baseline: Callable[..., int] | None) -> dict[str, Callable[[], object]]:
    rng = np.random.default_rng(0)
    x, weight = rng.standard_normal(x_shape, np.float32), rng.standard_normal(w_shape, np.float32)
    bias, u = rng.standard_normal(w_shape[0], np.float32), gemm.winograd_weights(weight)
    conv = dict(bias=bias, padding=1, activation="relu")
    calls = {
        "implicit_gemm": lambda: gemm.conv2d(x, weight, algorithm="implicit_gemm", **conv),
        "winograd": lambda: gemm.conv2d(x, weight, algorithm="winograd", **conv),
        "prepared": lambda: gemm.conv2d(x, weight, algorithm="winograd", prepared=u, **conv),
    }
    if baseline:
        calls["baseline winograd"] = lambda: gemm.call_conv(baseline, x, weight, **conv)
    expected = calls["implicit_gemm"]()
    for name, call in calls.items():  # every kernel computes the same conv
        error = np.abs(call() - expected).max() / np.abs(expected).max()
        assert error < 1e-4, f"{name} {x_shape} {w_shape}: relative error {error}"
    return calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", help="a folder of the GEMM library's sources to time its winograd conv")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--cold", action="store_true", help="evict the caches before each call")
    args = parser.parse_args()
    baseline = None
    if args.baseline:
        library = load_library(gemm.LIBRARY, gemm.SOURCES, source_dir=Path(args.baseline).resolve())
        baseline = library.tg_conv2d_winograd_f32
        baseline.argtypes, baseline.restype = gemm.CONV_ARGTYPES, ctypes.c_int
    for x_shape, w_shape in SHAPES:
        calls = kernels(x_shape, w_shape, baseline)
        times: dict[str, list[float]] = {name: [] for name in calls}
        for _ in range(args.rounds):
            for name, call in calls.items():
                times[name].append(median_ms(call, args.cold))
        row = "  ".join(f"{name} {statistics.median(t):.3f}" for name, t in times.items())
        print(f"x {x_shape} w {w_shape}: {row} ms  (load {os.getloadavg()[0]:.1f})", flush=True)


if __name__ == "__main__":
    main()
