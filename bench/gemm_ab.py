"""A/B of builds of the GEMM library on the products of bench/train.py's compiled training steps, in one process.

    .venv/bin/python bench/gemm_ab.py --builds main=DIR_A,new=tensorgraphs/kernels/gemm [--models enc1,mlp]
                                      [--rounds 9] [--product TEXT]

A build is a folder of the library's sources, e.g. an older revision's: `git archive REV tensorgraphs/kernels/gemm |
tar -x -C /tmp/old` gives DIR_A = /tmp/old/tensorgraphs/kernels/gemm. Each is compiled as the package compiles
its own (cached by content) and dlopened. The products are the float32 GemmCalls of each model's compiled step
(shapes, strides, prologues, epilogue), each on random operands of its own; every round calls every product three
times in each build in turn (the order flips every round), timed by the calling thread's CPU time on one OpenMP
thread (or, with OMP_NUM_THREADS set above 1, by the process's CPU time: see CLOCK). Operands stay in the
last-level cache between calls, so the figures compare the code, not the step's cache state. On a shared machine
the load moves whole rounds: compare the builds within a round (the per-round ratios of the step-weighted
totals), not across runs (bench/NOTES.md, "Without AVX-512").
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")  # before any OpenMP runtime loads

import argparse  # noqa: E402
import ctypes  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections import Counter  # noqa: E402
from dataclasses import replace  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))

from builds import load_builds  # noqa: E402
from peak import fma_peak  # noqa: E402
from train import MODELS, tg_training_step  # noqa: E402

from tensorgraphs.codegen.loop_ir import GemmCall, walk  # noqa: E402
from tensorgraphs.kernels import gemm  # noqa: E402

CALLS_PER_TURN = 3
# one thread: its CPU time; more (OMP_NUM_THREADS): the CPU time of all, e.g. two threads pinned to one core by
# `OMP_WAIT_POLICY=passive taskset -c 1` add up what the split costs beyond one thread's work
CLOCK = time.thread_time if os.environ["OMP_NUM_THREADS"] == "1" else time.process_time


def step_products(model: str) -> Counter[GemmCall]:
    """The float32 GemmCalls of the model's compiled step, as products of no buffer in particular (so the same
    product in several kernels counts once, with how often it runs per step)."""
    import tensorgraphs as tg

    step, x, y = tg_training_step(MODELS[model])
    compiled = tg.compile(step)
    compiled(x, y)
    program = compiled.traced(x, y).program
    found = [node for kernel in program.kernels for node in walk(kernel.body)]
    return Counter(anonymous(node) for node in found if isinstance(node, GemmCall) and node.function == "tg_gemm_f32")


def anonymous(call: GemmCall) -> GemmCall:
    ep = call.epilogue
    epilogue = replace(ep, bias=ep.bias and "bias", residual=ep.residual and "residual", bias_offset=0)
    return replace(call, a="a", b="b", c="c", a_offset=0, b_offset=0, epilogue=epilogue)


def span(strides: tuple[int, ...], extents: tuple[int, ...]) -> int:
    """Elements an operand with these strides and extents reaches (at least 1)."""
    return 1 + sum(stride * (extent - 1) for stride, extent in zip(strides, extents, strict=True))


def output_size(call: GemmCall) -> int:
    return span(call.c_strides, (call.batch, call.m)) - 1 + call.n


def arguments(call: GemmCall, builds: int, rng: np.random.Generator, keep: list[np.ndarray]) -> list[tuple]:
    """tg_gemm_f32's arguments for `call` on random operands, an output of its own per build (`keep` holds the
    arrays)."""

    def array(size: int) -> int:
        keep.append(rng.standard_normal(size, dtype=np.float32))
        return keep[-1].ctypes.data

    ep, extents = call.epilogue, (call.batch, call.m)
    a = array(span(call.a_strides, (call.batch, call.m, call.k)))
    b = array(span(call.b_strides, (call.batch, call.k, call.n)))
    bias = array(span(ep.bias_strides, (call.batch, call.m, call.n))) if ep.bias else None
    residual = array(span(ep.residual_strides, extents) - 1 + call.n) if ep.residual else None
    codes = (
        gemm.epilogue_code(ep.activation, ep.activation_after_residual),
        gemm.ACTIVATIONS[call.a_prologue],
        gemm.ACTIVATIONS[call.b_prologue],
    )
    return [
        (
            call.batch,
            call.m,
            call.n,
            call.k,
            a,
            *call.a_strides,
            b,
            *call.b_strides,
            array(output_size(call)),
            *call.c_strides,
            ep.alpha,
            bias,
            *ep.bias_strides,
            residual,
            *ep.residual_strides,
            *codes,
        )
        for _ in range(builds)
    ]


def label(call: GemmCall) -> str:
    """M x N x K, A's and B's (row, column) strides, prologues and epilogue."""
    prologues = "".join(f" {side}:{p}" for side, p in (("A", call.a_prologue), ("B", call.b_prologue)) if p != "none")
    epilogue = "".join(f" +{part}" for part in ("bias", "residual") if getattr(call.epilogue, part))
    activation = f" {call.epilogue.activation}" if call.epilogue.activation != "none" else ""
    activation += " after residual" if activation and call.epilogue.activation_after_residual else ""
    strides = f"A{list(call.a_strides[1:])} B{list(call.b_strides[1:])}"
    return f"{call.m}x{call.n}x{call.k} {strides}{prologues}{epilogue}{activation}"


def check_agreement(builds: dict[str, object], calls: dict[GemmCall, list[tuple]]) -> None:
    """Every build computes every product as the first one does."""
    for call, per_build in calls.items():
        outputs = []
        for function, call_args in zip(builds.values(), per_build, strict=True):
            assert function(*call_args) == 0, label(call)
            pointer = ctypes.cast(call_args[12], ctypes.POINTER(ctypes.c_float))
            outputs.append(np.ctypeslib.as_array(pointer, (output_size(call),)).copy())
        for output in outputs[1:]:
            assert np.allclose(output, outputs[0], rtol=1e-4, atol=1e-4), f"builds disagree on {label(call)}"


def timed_rounds(
    builds: dict[str, object], calls: dict[GemmCall, list[tuple]], rounds: int
) -> dict[GemmCall, dict[str, list[float]]]:
    """Thread CPU seconds of each call, CALLS_PER_TURN per build in turn, round after round."""
    seconds = {call: {name: [] for name in builds} for call in calls}
    for round_index in range(rounds):
        order = list(builds.items()) if round_index % 2 == 0 else list(builds.items())[::-1]
        for call, per_build in calls.items():
            for name, function in order:
                call_args = per_build[list(builds).index(name)]
                for _ in range(CALLS_PER_TURN):
                    start = CLOCK()
                    function(*call_args)
                    seconds[call][name].append(CLOCK() - start)
    return seconds


def report(
    products: Counter[GemmCall], seconds: dict[GemmCall, dict[str, list[float]]], rounds: int, peak: float
) -> None:
    names = list(next(iter(seconds.values())))
    flops = {call: 2.0 * call.batch * call.m * call.n * call.k for call in seconds}
    print(
        f"FMA peak {peak:.1f} GFLOP/s, load average {os.getloadavg()[0]:.1f}; medians, ms (% of the peak), "
        f"ratios to {names[0]}"
    )
    print(f"{'product':64s} per step " + "  ".join(f"{name:>14s}" for name in names))
    for call in seconds:
        medians = [statistics.median(seconds[call][name]) for name in names]
        cells = "  ".join(f"{t * 1e3:7.2f} ({flops[call] / t / peak / 1e7:3.0f}%)" for t in medians)
        ratios = " ".join(f"{t / medians[0]:.3f}" for t in medians[1:])
        print(f"{label(call):64s} x{products[call]:<7d} {cells}  {ratios}")
    totals = [
        [
            sum(
                products[c] * statistics.fmean(seconds[c][name][r * CALLS_PER_TURN : (r + 1) * CALLS_PER_TURN])
                for c in seconds
            )
            for name in names
        ]
        for r in range(rounds)
    ]
    print(
        "each round's step total over the first build's: "
        + " | ".join(" ".join(f"{t / round_totals[0]:.3f}" for t in round_totals[1:]) for round_totals in totals)
    )
    floor = sum(products[c] * flops[c] for c in seconds) / peak / 1e6
    medians = [statistics.median(round_totals[i] for round_totals in totals) * 1e3 for i in range(len(names))]
    print(
        "step total, median round: "
        + ", ".join(
            f"{name} {t:.2f} ms ({floor / t * 100:.0f}% of the peak)" for name, t in zip(names, medians, strict=True)
        )
        + f"; floor {floor:.2f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--builds", required=True, help="comma-separated NAME=SOURCE_DIR, the first the reference")
    parser.add_argument("--models", default="enc1,mlp", help=f"comma-separated subset of {','.join(MODELS)}")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--product", default="", help="only the products whose printed label contains this text")
    args = parser.parse_args()
    builds = load_builds(args.builds, "tg_gemm_f32", gemm.GEMM_ARGTYPES)
    products: Counter[GemmCall] = Counter()
    for model in args.models.split(","):
        products.update(call for call in step_products(model).elements() if args.product in label(call))
    rng, keep = np.random.default_rng(0), []
    calls = {call: arguments(call, len(builds), rng, keep) for call in products}
    check_agreement(builds, calls)
    peak = fma_peak(True)
    report(products, timed_rounds(builds, calls, args.rounds), args.rounds, peak)


if __name__ == "__main__":
    main()
