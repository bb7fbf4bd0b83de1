"""Benchmark: int8 quantization (issue 20) in one run, one table.

    .venv/bin/python bench/quant.py [--min-time 0.5] [--epochs 10] [--threads N] [--clock wall|cpu]

Rows, each timed after warm-up, the candidates of a row interleaved (a, b, a, b, ...) so background load hits
them alike, medians reported:
- the int8 GEMM at 1024^3 (u8 x s8 -> s32 on weights packed once) against our float32 GEMM, in ops/s
  (target: at least 2.5x): activations of 7 bits (what dynamic quantization makes without VNNI) and of 8;
  without AVX-512 VNNI the two take different inner-product steps (gemm_int8.c);
- the MLP 784-1024-1024-10 at batch 256, compiled: our float32, our `quantize_dynamic`, torch's float32 and
  torch's `quantize_dynamic` (its default per-tensor weights, and per-channel as ours) (target: at least 2x our
  float32 and faster than torch's quantized);
- the 2-layer pre-LN transformer encoder of bench/train.py (d_model 256, 4 heads, ffn 1024, seq 128, batch 8),
  its forward in eval mode, compiled, the same four ways (as torch, `quantize_dynamic` swaps the feed-forward
  Linears; attention's projections stay float32) (target: at least 2x our float32 and faster than torch's
  quantized);
- the digits MLP (tensorgraphs.examples.digits_mlp) trained in float32, its test accuracy in float32 and
  dynamically quantized (target: within 0.5 points).

On a machine shared with other work, `--threads 1 --clock cpu` compares by the CPU time of the one thread (time
the thread was descheduled does not count), far less noisy than wall-clock time.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from torch.ao.quantization import per_channel_dynamic_qconfig

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import train  # noqa: E402  # bench/train.py, beside this file: the same models

import tensorgraphs as tg  # noqa: E402
import tensorgraphs.nn.functional as tgF  # noqa: E402
from tensorgraphs.examples import digits_mlp  # noqa: E402
from tensorgraphs.kernels import gemm  # noqa: E402
from tensorgraphs.kernels.gemm import int8  # noqa: E402

warnings.filterwarnings("ignore", category=UserWarning)  # torch's deprecation of its quantized tensors
warnings.filterwarnings("ignore", category=DeprecationWarning)
CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}
clock = time.perf_counter


def interleaved_medians(candidates: dict[str, Callable[[], object]], min_time: float) -> dict[str, float]:
    """Seconds per call of each candidate: 3 warm-up calls each, then rounds of one call each until every
    candidate has run `min_time` seconds (at least 5 rounds); the median."""
    for run in candidates.values():
        for _ in range(3):
            run()
    samples: dict[str, list[float]] = {name: [] for name in candidates}
    while min(len(s) for s in samples.values()) < 5 or min(sum(s) for s in samples.values()) < min_time:
        for name, run in candidates.items():
            start = clock()
            run()
            samples[name].append(clock() - start)
    return {name: statistics.median(s) for name, s in samples.items()}


def gemm_row(min_time: float) -> list[tuple[str, str, str]]:
    m = n = k = 1024
    rng = np.random.default_rng(0)
    a8 = rng.integers(0, 256, (m, k), dtype=np.uint8)
    a7 = a8 >> 1
    packed, colsum = int8.pack_weights(rng.integers(-128, 128, (n, k), dtype=np.int8))
    a, b = rng.standard_normal((m, k), dtype=np.float32), rng.standard_normal((k, n), dtype=np.float32)
    times = interleaved_medians({"int8 7-bit": lambda: int8.qgemm(a7, packed, colsum),
                                 "int8 8-bit": lambda: int8.qgemm(a8, packed, colsum),
                                 "float32": gemm.bind_matmul(a, b)}, min_time)
    ops = 2.0 * m * n * k
    step = "VPDPBUSD" if int8.vnni() else "VPMADDUBSW"
    rows = []
    for name, note in (("int8 7-bit", "activations in [0, 127]"), ("int8 8-bit", "activations in [0, 255]")):
        rows.append((f"GEMM 1024^3 {name} (u8 x s8 -> s32, {step})", f"{ops / times[name] * 1e-9:.0f} Gop/s",
                     f"{times['float32'] / times[name]:.2f}x our float32 (target >= 2.5x), {note}"))
    return [*rows, ("GEMM 1024^3 float32 (ours)", f"{ops / times['float32'] * 1e-9:.0f} Gflop/s", "")]


def mlp_row(min_time: float) -> list[tuple[str, str, str]]:
    x = np.random.default_rng(1).standard_normal((256, 784), dtype=np.float32)
    return model_rows("MLP 784-1024-1024-10 b256", train.ModelSpec(0, 256), x, min_time)


def encoder_row(min_time: float) -> list[tuple[str, str, str]]:
    spec = train.MODELS["enc2"]
    x = np.random.default_rng(1).standard_normal((spec.batch, train.SEQ, train.D_MODEL), dtype=np.float32)
    return model_rows("encoder 2 layers b8 seq128 forward", spec, x, min_time)


def model_rows(label: str, spec: train.ModelSpec, x: np.ndarray, min_time: float) -> list[tuple[str, str, str]]:
    """bench/train.py's model `spec` in eval mode, its forward on `x`: ours float32 and dynamically quantized
    (compiled), torch's float32 and `quantize_dynamic` (per tensor, and per channel as ours), same weights."""
    torch.manual_seed(0)
    reference = train.build_model(torch.nn, torch.nn.functional, spec).eval()
    model = train.build_model(tg.nn, tgF, spec).eval()
    model.load_state_dict({key: value.numpy() for key, value in reference.state_dict().items()})
    quantized = tg.quantization.quantize_dynamic(model, {tg.nn.Linear}, dtype=tg.qint8)
    torch_quantized = torch.ao.quantization.quantize_dynamic(reference, {torch.nn.Linear}, dtype=torch.qint8)
    torch_per_channel = torch.ao.quantization.quantize_dynamic(
        reference, {torch.nn.Linear: per_channel_dynamic_qconfig}, dtype=torch.qint8)
    tx, gx = torch.from_numpy(x), tg.tensor(x)
    ours_f32 = tg.compile(lambda x: model(x).detach())
    ours_int8 = tg.compile(lambda x: quantized(x))

    def torch_run(module: torch.nn.Module) -> Callable[[], object]:
        def run() -> object:
            with torch.no_grad():
                return module(tx)
        return run

    times = interleaved_medians({
        "ours f32": lambda: ours_f32(gx).numpy(), "ours int8": lambda: ours_int8(gx).numpy(),
        "torch f32": torch_run(reference), "torch int8": torch_run(torch_quantized),
        "torch int8 per channel": torch_run(torch_per_channel)}, min_time)
    ours = times["ours int8"]
    rows = [(f"{label} ours int8", f"{ours * 1e3:.2f} ms",
             f"{times['ours f32'] / ours:.2f}x our f32 (target >= 2x), {times['torch int8'] / ours:.2f}x torch int8 "
             f"(target > 1x)")]
    for name in ("ours f32", "torch f32", "torch int8", "torch int8 per channel"):
        rows.append((f"{label} {name}", f"{times[name] * 1e3:.2f} ms", ""))
    return rows


def digits_row(epochs: int) -> list[tuple[str, str, str]]:
    args = argparse.Namespace(epochs=epochs, batch_size=64, lr=1e-2, seed=0)
    train_set, test_set = digits_mlp.load_digits_split(args.seed)
    tg.manual_seed(args.seed)
    model = digits_mlp.digits_mlp()
    with tg.device("planned"):
        digits_mlp.train(model, train_set, test_set, args)
    float_accuracy = digits_mlp.accuracy(model, test_set)
    quantized_accuracy = digits_mlp.accuracy(tg.quantization.quantize_dynamic(model), test_set)
    gap = 100 * (float_accuracy - quantized_accuracy)
    return [("digits MLP test accuracy f32 / int8", f"{float_accuracy:.1%} / {quantized_accuracy:.1%}",
             f"{gap:+.2f} points (target within 0.5)")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--min-time", type=float, default=0.5, help="seconds each candidate of a row runs at least")
    parser.add_argument("--epochs", type=int, default=10, help="training epochs of the digits MLP")
    parser.add_argument("--threads", type=int, default=None, help="threads for ours and torch")
    parser.add_argument("--clock", choices=CLOCKS, default="wall", help="cpu needs --threads 1")
    args = parser.parse_args()
    if not int8.available():
        raise SystemExit("the int8 GEMM needs AVX2 (or AVX-512) and a C compiler")
    if args.clock == "cpu" and args.threads != 1:
        parser.error("--clock cpu measures one thread: add --threads 1")
    if args.threads:
        torch.set_num_threads(args.threads)
        os.environ["OMP_NUM_THREADS"] = str(args.threads)  # read when our first native library starts OpenMP
    global clock
    clock = CLOCKS[args.clock]
    print(f"threads {args.threads or 'default'}, clock {args.clock}, load average {os.getloadavg()[0]:.1f}, "
          f"AVX-512 VNNI {'yes' if int8.vnni() else 'no'} (dynamic quantization's activations: "
          f"{'7' if tg.quantization.dynamic.default_reduce_range() else '8'} bits)")
    rows = [*gemm_row(args.min_time), *mlp_row(args.min_time), *encoder_row(args.min_time), *digits_row(args.epochs)]
    width = max(len(row[0]) for row in rows)
    value_width = max(len(row[1]) for row in rows)
    for name, value, note in rows:
        print(f"{name:<{width}}  {value:>{value_width}}  {note}")


if __name__ == "__main__":
    main()
