"""A/B of builds of the GEMM library's conv kernels with the weights cold, in one process.

    .venv/bin/python bench/conv_ab.py --builds main=DIR_A,new=tensorgraphs/kernels/gemm
                                      --convs 1x512x7x7:2048x512x1x1/1p0,1x128x56x56:128x128x3x3/2p1 [--rounds 5]
                                      [--hot] [--algorithm implicit_gemm|winograd|direct]

A build is a folder of the library's sources, as in bench/gemm_ab.py (`git archive REV tensorgraphs/kernels/gemm |
tar -x -C /tmp/old` gives an older revision's). A conv is IMAGE:WEIGHT/STRIDEpPADDING, shapes NCHW and OIHW; each
runs on a random image with a bias and relu, into an output of its own per build. In a whole model a layer's weights
come from memory (ResNet-50's 100 MB pass through L3 between two calls), so each call takes the next of enough
copies of the weights to exceed the last-level cache (COLD_BYTES); --hot keeps one copy, as a loop over one layer
would. --algorithm picks the kernel, the implicit GEMM by default (winograd transforms the weights in every call).
Each round runs every conv CALLS_PER_TURN times per build in turn (the order flips every round), timed by the
calling thread's CPU time on one OpenMP thread; on a shared machine compare the builds within a round.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")  # before any OpenMP runtime loads

import argparse  # noqa: E402
import re  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))

from builds import load_builds  # noqa: E402

from tensorgraphs.kernels import gemm  # noqa: E402

CALLS_PER_TURN = 3
COLD_BYTES = 96 << 20  # three times this machine's 32 MiB L3
CONV_SPEC = re.compile(r"(\d+(?:x\d+){3}):(\d+(?:x\d+){3})/(\d+)p(\d+)")


@dataclass(frozen=True)
class Conv:
    image: tuple[int, ...]
    weight: tuple[int, ...]
    stride: int
    padding: int

    @classmethod
    def parse(cls, text: str) -> Conv:
        match = CONV_SPEC.fullmatch(text)
        if match is None:
            raise SystemExit(f"conv {text!r}: expected IMAGE:WEIGHT/STRIDEpPADDING, e.g. 1x64x56x56:64x64x3x3/1p1")
        image, weight = (tuple(int(d) for d in shape.split("x")) for shape in match.group(1, 2))
        return cls(image, weight, int(match.group(3)), int(match.group(4)))

    def __str__(self) -> str:
        shape = "x".join
        return f"{shape(map(str, self.image))}:{shape(map(str, self.weight))}/{self.stride}p{self.padding}"


@dataclass
class Operands:
    """A conv's image, bias, weight copies (the next one each call) and one output per build."""

    image: np.ndarray
    bias: np.ndarray
    weights: np.ndarray
    outputs: list[np.ndarray]
    calls: int = 0

    def next_weight(self) -> np.ndarray:
        self.calls += 1
        return self.weights[self.calls % len(self.weights)]


def operands(conv: Conv, builds: int, hot: bool, rng: np.random.Generator) -> Operands:
    copies = 1 if hot else max(2, -(-COLD_BYTES // (4 * int(np.prod(conv.weight)))))
    image = rng.standard_normal(conv.image, dtype=np.float32)
    weights = rng.standard_normal((copies, *conv.weight), dtype=np.float32)
    bias = rng.standard_normal(conv.weight[0], dtype=np.float32)
    return Operands(image, bias, weights, [np.empty(0, np.float32)] * builds)


def run(function: object, conv: Conv, data: Operands, build: int) -> np.ndarray:
    out = data.outputs[build] if data.outputs[build].size else None
    result = gemm.call_conv(
        function, data.image, data.next_weight(), data.bias, conv.stride, conv.padding, activation="relu", out=out
    )
    data.outputs[build] = result
    return result


def check_agreement(builds: dict[str, object], convs: dict[Conv, Operands]) -> None:
    """Every build computes every conv (on the same weights) as the first one does, to within 1e-4 of the largest
    output: builds may round differently (Winograd's transforms, summation orders)."""
    for conv, data in convs.items():
        results = []
        for index, function in enumerate(builds.values()):
            data.calls = -1  # the next call takes copy 0
            results.append(run(function, conv, data, index).copy())
        for result in results[1:]:
            scale = float(np.abs(results[0]).max())
            assert np.abs(result - results[0]).max() <= 1e-4 * scale, f"builds disagree on {conv}"


def timed_rounds(builds: dict[str, object], convs: dict[Conv, Operands], rounds: int) -> dict[Conv, dict[str, list]]:
    """Thread CPU seconds of each call, CALLS_PER_TURN per build in turn, round after round."""
    seconds = {conv: {name: [] for name in builds} for conv in convs}
    for round_index in range(rounds):
        order = list(enumerate(builds.items()))
        for conv, data in convs.items():
            for index, (name, function) in order if round_index % 2 == 0 else order[::-1]:
                for _ in range(CALLS_PER_TURN):
                    start = time.thread_time()
                    run(function, conv, data, index)
                    seconds[conv][name].append(time.thread_time() - start)
    return seconds


def report(seconds: dict[Conv, dict[str, list[float]]], hot: bool) -> None:
    names = list(next(iter(seconds.values())))
    print(
        f"weights {'hot' if hot else 'cold'}, load average {os.getloadavg()[0]:.1f}; medians, ms (GFLOP/s), "
        f"ratios to {names[0]}"
    )
    print(f"{'conv':44s} " + "  ".join(f"{name:>16s}" for name in names))
    totals = [0.0] * len(names)
    for conv, per_build in seconds.items():
        n, _, h, w = conv.image
        cout, _, kh, kw = conv.weight
        out_h, out_w = ((size + 2 * conv.padding - k) // conv.stride + 1 for size, k in ((h, kh), (w, kw)))
        flops = 2.0 * n * out_h * out_w * int(np.prod(conv.weight))
        medians = [statistics.median(per_build[name]) for name in names]
        totals = [total + t for total, t in zip(totals, medians, strict=True)]
        cells = "  ".join(f"{t * 1e3:8.3f} ({flops / t / 1e9:5.1f})" for t in medians)
        ratios = " ".join(f"{t / medians[0]:.3f}" for t in medians[1:])
        print(f"{conv!s:44s} {cells}  {ratios}")
    print("sum of medians: " + ", ".join(f"{name} {t * 1e3:.3f} ms" for name, t in zip(names, totals, strict=True)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--builds", required=True, help="comma-separated NAME=SOURCE_DIR, the first the reference")
    parser.add_argument("--convs", required=True, help="comma-separated IMAGE:WEIGHT/STRIDEpPADDING")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--hot", action="store_true", help="one copy of the weights, in cache from call to call")
    parser.add_argument("--algorithm", choices=gemm.CONV_ALGORITHMS, default="implicit_gemm")
    args = parser.parse_args()
    conv_function = gemm.C_FUNCTIONS[gemm.CONV_ALGORITHMS[args.algorithm]]
    builds = load_builds(args.builds, conv_function, gemm.CONV_ARGTYPES)
    rng = np.random.default_rng(0)
    convs = {conv: operands(conv, len(builds), args.hot, rng) for conv in map(Conv.parse, args.convs.split(","))}
    check_agreement(builds, convs)
    report(timed_rounds(builds, convs, args.rounds), args.hot)


if __name__ == "__main__":
    main()
