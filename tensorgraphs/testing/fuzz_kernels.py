"""Fuzzer of the hand-written GEMM and conv2d kernels (tensorgraphs/kernels/gemm): random problems against torch
in float64.

    python -m tensorgraphs.testing.fuzz_kernels --count 2000 --start 0   # seeds 0..1999, 1 and 2 threads
    python -m tensorgraphs.testing.fuzz_kernels --seed 17 --threads 2    # the case a failure names

Each seed draws one case: a product (`gemm.matmul`) or a convolution (`gemm.conv2d`, every algorithm of
`CONV_ALGORITHMS`, Winograd also with prepared weights). Sizes are biased to the edges of the kernels' paths:
few rows (gemv.c), the register tile (6 x 64) and its remainders, a last few columns (n % 16 in 0..4), short
reductions and reductions just past a K block (384), row and column blocks (256, 2048), empty products and
sums, batches broadcast or folded; operands plain, transposed, strided or slices, with prologues, every
epilogue, an output with padded rows or in a slice of a wider one (whose other elements must stay untouched) or,
for a conv, over its own residual, bfloat16, and now and then NaN or Inf. The comparison is the kernel tests'
(tests/kernels: assert_close's tolerance, Winograd's relative one, the bfloat16 bound), widened for float32's
rounding of very long sums.

The thread count picks the path (bands, a shared team, a problem per thread), and OpenMP reads it from the
environment, so each thread count runs in its own process with OMP_NUM_THREADS set.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from tensorgraphs import dtypes
from tensorgraphs.kernels import gemm

Case = dict[str, Any]

ACTIVATIONS = {
    "none": lambda t: t,
    "relu": torch.relu,
    "gelu_tanh": lambda t: torch.nn.functional.gelu(t, approximate="tanh"),
}
SENTINEL = np.float32(-12345.0)
"""What the output's elements outside the result hold before the call and must hold after it."""


def _edge(rng: np.random.Generator, edges: Sequence[int], small: int, limit: int) -> int:
    """A size: small, near a multiple of an edge, or anywhere up to `limit`."""
    draw = rng.random()
    if draw < 0.3:
        size = int(rng.integers(1, small + 1))
    elif draw < 0.85:
        size = int(rng.choice(edges)) * int(rng.integers(1, 3)) + int(rng.integers(-2, 4))
    else:
        size = int(rng.integers(1, limit + 1))
    return max(1, min(size, limit))


def _rows(rng: np.random.Generator) -> int:
    return _edge(rng, (4, 6, 12, 16, 64, 256, 512), 7, 700)


def _columns(rng: np.random.Generator) -> int:
    if rng.random() < 0.4:  # a last few columns past whole vectors (dot-product tails)
        return 16 * int(rng.choice((1, 2, 3, 4, 8, 9, 16, 64, 128))) + int(rng.integers(0, 5))
    return _edge(rng, (16, 32, 64, 128, 256, 2048), 20, 2200)


def _reduction(rng: np.random.Generator) -> int:
    draw = rng.random()
    if draw < 0.25:
        return int(rng.integers(1, 34))  # short reductions (< 32)
    if draw < 0.6:
        return int(rng.choice((384, 768, 1152))) + int(rng.integers(-2, 6))  # around K blocks
    return _edge(rng, (8, 16, 64, 256), 40, 1300)


def _batches(rng: np.random.Generator) -> tuple[tuple[int, ...], tuple[int, ...]]:
    draw = rng.random()
    if draw < 0.55:
        return (), ()
    sizes = [int(rng.choice((1, 2, 3, 4, 5, 8))) for _ in range(int(rng.integers(1, 3)))]
    a_batch = tuple(size if rng.random() < 0.7 else 1 for size in sizes)
    b_batch = tuple(size if rng.random() < 0.7 else 1 for size in sizes)
    if rng.random() < 0.2:  # one operand without batch dims
        a_batch, b_batch = (a_batch, ()) if rng.random() < 0.5 else ((), b_batch)
    return a_batch, b_batch


def draw_matmul(rng: np.random.Generator) -> Case:
    while True:
        m, n, k = _rows(rng), _columns(rng), _reduction(rng)
        if rng.random() < 0.03:  # an empty product or an empty sum (the epilogue of zero)
            m, n, k = ((0 if axis == rng.integers(0, 3) else size) for axis, size in enumerate((m, n, k)))
        a_batch, b_batch = _batches(rng)
        batch = int(np.prod(np.broadcast_shapes(a_batch, b_batch), dtype=np.int64))
        if m * n * k * batch <= 6e7 and m * n * batch <= 2e6:
            break
    dtype = str(rng.choice(("float32", "bfloat16", "bfloat16_f32"), p=(0.8, 0.1, 0.1)))
    return dict(
        kind="matmul", m=m, n=n, k=k, a_batch=a_batch, b_batch=b_batch,
        a_layout=str(rng.choice(("plain", "transposed", "slice", "strided", "expanded"), p=(.4, .25, .2, .1, .05))),
        b_layout=str(rng.choice(("plain", "transposed", "slice", "strided", "expanded"), p=(.4, .25, .2, .1, .05))),
        bias=str(rng.choice(("none", "row", "column", "full"), p=(0.4, 0.3, 0.2, 0.1))),
        residual=bool(rng.random() < 0.35),
        activation=str(rng.choice(("none", "relu", "gelu_tanh", "gelu_tanh_grad"), p=(0.4, 0.3, 0.2, 0.1))),
        after_residual=bool(rng.random() < 0.3),
        alpha=float(rng.choice((1.0, 1.0, 0.5, -2.0))),
        a_prologue=str(rng.choice(("none", "relu", "gelu_tanh"), p=(0.7, 0.2, 0.1))),
        b_prologue=str(rng.choice(("none", "relu", "gelu_tanh"), p=(0.7, 0.2, 0.1))),
        out=str(rng.choice(("new", "padded_rows"), p=(0.7, 0.3))),
        dtype=dtype,
        special=bool(dtype == "float32" and rng.random() < 0.08),
    )


def draw_conv(rng: np.random.Generator) -> Case:
    while True:
        winograd_like = rng.random() < 0.35
        kh, kw = (3, 3) if winograd_like else (int(rng.choice((1, 1, 2, 3, 3, 5, 7))), int(rng.choice((1, 2, 3, 7))))
        if not winograd_like and rng.random() < 0.5:
            kw = kh
        stride = (1, 1) if winograd_like else tuple(int(rng.choice((1, 1, 2, 3))) for _ in range(2))
        dilation = (1, 1) if winograd_like or rng.random() < 0.8 else (int(rng.integers(1, 3)), 2)
        padding = tuple(int(rng.choice((0, 0, 1, 1, 2, 3, 5))) for _ in range(2))
        if rng.random() < 0.6:
            padding = (padding[0], padding[0])
        batch = int(rng.choice((1, 1, 2, 3, 4, 8, 10, 17)))
        cin = _edge(rng, (3, 16, 32, 64, 128, 384), 6, 800)
        cout = _edge(rng, (4, 6, 16, 32, 64, 256), 8, 300)
        h, w = _edge(rng, (4, 7, 14, 16, 28, 56), 9, 70), _edge(rng, (4, 7, 14, 16, 28, 56), 9, 70)
        oh = (h + 2 * padding[0] - dilation[0] * (kh - 1) - 1) // stride[0] + 1
        ow = (w + 2 * padding[1] - dilation[1] * (kw - 1) - 1) // stride[1] + 1
        if oh > 0 and ow > 0 and batch * cout * oh * ow * cin * kh * kw <= 4e7 and batch * cin * h * w <= 3e6:
            break
    return dict(
        kind="conv", batch=batch, cin=cin, h=h, w=w, cout=cout, kernel=(kh, kw), stride=stride, padding=padding,
        dilation=dilation,
        bias=bool(rng.random() < 0.5), residual=bool(rng.random() < 0.35),
        activation=str(rng.choice(("none", "relu", "gelu_tanh"), p=(0.4, 0.4, 0.2))),
        after_residual=bool(rng.random() < 0.4), alpha=float(rng.choice((1.0, 1.0, 0.5, -2.0))),
        x_layout=str(rng.choice(("plain", "permuted"), p=(0.85, 0.15))),
        out=str(rng.choice(("new", "channel_slice", "residual"), p=(0.5, 0.3, 0.2))),
        special=bool(rng.random() < 0.08),
    )


def draw(seed: int) -> Case:
    rng = np.random.default_rng(seed)
    return draw_matmul(rng) if rng.random() < 0.6 else draw_conv(rng)


# ---------------------------------------------------------------------------------------------------------------
# operands


def _values(rng: np.random.Generator, shape: tuple[int, ...], special: bool) -> np.ndarray:
    x = rng.standard_normal(shape, dtype=np.float32)
    if special and x.size:
        for value in (np.nan, np.inf, -np.inf):
            if rng.random() < 0.5:
                x.flat[int(rng.integers(0, x.size))] = value
    return x


def _laid_out(rng: np.random.Generator, shape: tuple[int, ...], layout: str, special: bool) -> np.ndarray:
    """An array of `shape` (batch..., rows, cols) with the given memory layout."""
    *batch, rows, cols = shape
    if layout == "transposed":
        return np.swapaxes(_values(rng, (*batch, cols, rows), special), -1, -2)
    if layout == "slice":  # rows a stride apart, wider than a row
        return _values(rng, (*batch, rows, cols + 7), special)[..., 3 : 3 + cols]
    if layout == "strided":  # neither stride 1
        return _values(rng, (*batch, 2 * rows, 2 * cols), special)[..., ::2, ::2]
    if layout == "expanded" and batch:  # a stride-0 batch dim
        return np.broadcast_to(_values(rng, (1, *batch[1:], rows, cols), special), shape)
    return _values(rng, shape, special)


def _as64(x: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.asarray(x, np.float64))


def _bf16(x: np.ndarray) -> np.ndarray:
    return dtypes.round_to_storage(np.asarray(x, np.float32), dtypes.bfloat16)


def _gelu_slope(h: torch.Tensor) -> torch.Tensor:
    """gelu'(h) of the tanh form written as h sigmoid(2u), as the kernels write it: torch's 0.5 h (1 + tanh(u))
    rounds to 0 from h about -6 on (float64's tanh is -1 there), which makes inf * gelu'(h) NaN, where the kernels'
    float32 slope, still about 1e-29, leaves it infinite."""
    x = h.detach().clone().requires_grad_()
    u = (2 / np.pi) ** 0.5 * (x + 0.044715 * x**3)
    (slope,) = torch.autograd.grad((x * torch.sigmoid(2 * u)).sum(), [x])
    return slope


def _epilogue(y: torch.Tensor, case: Case, bias: np.ndarray | None, residual: np.ndarray | None) -> torch.Tensor:
    """gemm.h's epilogue on alpha * product, in float64."""
    y = case["alpha"] * y
    if bias is not None:
        y = y + _as64(bias)
    if case["activation"] == "gelu_tanh_grad":
        return y * _gelu_slope(_as64(residual))
    if residual is not None and case["after_residual"]:
        y = y + _as64(residual)
    y = ACTIVATIONS[case["activation"]](y)
    if residual is not None and not case["after_residual"]:
        y = y + _as64(residual)
    return y


def _compare(actual: np.ndarray, expected: np.ndarray, k: int, bound: np.ndarray | None = None,
             rounded: bool = False, spread: np.ndarray | float = 0.0) -> str | None:
    """None if `actual` agrees with `expected` (float64), else what is wrong. NaN and ±Inf must sit where they do
    in `expected`; finite values follow tests/kernels' assert_close (scaled by the largest finite |expected|), or,
    given `bound` (sum |a||b| of bfloat16 operands), the bfloat16 tests' bound; plus `spread`, float32's rounding of
    a long sum (a conv's depth runs to tens of thousands, where assert_close's rule, made for K of a few hundred,
    is tighter than a correct sum)."""
    if actual.shape != expected.shape:
        return f"shape {actual.shape} != {expected.shape}"
    finite = np.isfinite(expected)
    wrong = ~finite & ~((actual == expected) | (np.isnan(actual) & np.isnan(expected)))
    if wrong.any():
        index = tuple(int(i) for i in np.argwhere(wrong)[0])
        return f"{int(wrong.sum())} non-finite results wrong, first at {index}: {actual[index]} != {expected[index]}"
    largest = float(np.abs(expected[finite]).max(initial=0.0))
    if bound is None:
        scale = np.sqrt(max(k, 1)) * max(1.0, largest / np.sqrt(max(k, 1)))
        tolerance = 1e-5 * np.abs(expected) + 2e-6 * scale + spread
    else:
        tolerance = (2.0**-8 if rounded else 1e-6) * np.abs(expected) + k * 2.0**-23 * bound + 1e-5 + spread
    with np.errstate(invalid="ignore"):
        excess = np.where(finite, np.abs(actual - expected) - tolerance, -1.0)
    excess = np.where(np.isnan(excess), np.inf, excess)  # a NaN where a finite value belongs
    if excess.max(initial=-1.0) > 0:
        index = tuple(int(i) for i in np.unravel_index(int(np.argmax(excess)), excess.shape))
        count = int((excess > 0).sum())
        return (f"{count} of {expected.size} results off, worst at {index}: {actual[index]} != {expected[index]} "
                f"(tolerance {tolerance[index]:.3g})")
    return None


def _rounding_spread(k: int, squares: torch.Tensor, alpha: float) -> np.ndarray:
    """A bound in practice on float32's rounding of a sum of k terms whose squares sum to `squares` (rms
    sqrt(squares / k) each): the i-th partial sum, about sqrt(i) rms, is rounded by about 2^-24 of it, and the k
    roundings add as a random walk, to about 2^-24 k rms = 2^-24 sqrt(k squares). Four times that."""
    return 2.0**-22 * abs(alpha) * np.sqrt(k * squares.numpy())


def _output(shape: tuple[int, ...], padded: bool, axis: int) -> tuple[np.ndarray, np.ndarray]:
    """(out, its whole buffer filled with SENTINEL): out is the buffer itself, or a slice along `axis` of a wider
    one."""
    if not padded:
        return (buffer := np.full(shape, SENTINEL, np.float32)), buffer
    wider = list(shape)
    wider[axis] += 5
    buffer = np.full(wider, SENTINEL, np.float32)
    index = [slice(None)] * len(shape)
    index[axis] = slice(2, 2 + shape[axis])
    return buffer[tuple(index)], buffer


def _outside_untouched(out: np.ndarray, buffer: np.ndarray) -> str | None:
    """What the kernel wrote into `buffer` outside `out` (a view of it), if anything. Call after comparing."""
    saved = out.copy()
    out[...] = SENTINEL
    changed = int((buffer != SENTINEL).sum())
    out[...] = saved
    return f"{changed} elements outside the output written" if changed else None


# ---------------------------------------------------------------------------------------------------------------
# cases


def run_matmul(case: Case, seed: int) -> list[str]:
    rng = np.random.default_rng([seed, 1])
    m, n, k, special = case["m"], case["n"], case["k"], case["special"]
    a = _laid_out(rng, (*case["a_batch"], m, k), case["a_layout"], special)
    b = _laid_out(rng, (*case["b_batch"], k, n), case["b_layout"], special)
    batch = np.broadcast_shapes(case["a_batch"], case["b_batch"])
    bias = {"none": None, "row": (n,), "column": (m, 1), "full": (*batch, m, n)}[case["bias"]]
    bias = None if bias is None else _values(rng, bias, False)
    residual = case["residual"] or case["activation"] == "gelu_tanh_grad"
    residual = _values(rng, (*batch, m, n), False) * np.float32(2) if residual else None
    after = case["after_residual"] and case["activation"] != "gelu_tanh_grad" and residual is not None
    case = {**case, "after_residual": after}
    out, buffer = _output((*batch, m, n), case["out"] == "padded_rows", -1)
    dtype, result = {"float32": ("float32", None), "bfloat16": ("bfloat16", None),
                     "bfloat16_f32": ("bfloat16", "float32")}[case["dtype"]]
    actual = gemm.matmul(a, b, dtype=dtype, result=result, bias=bias, residual=residual,
                         activation=case["activation"], alpha=case["alpha"], a_prologue=case["a_prologue"],
                         b_prologue=case["b_prologue"], activation_after_residual=after,
                         out=out if out.size else None)  # (numpy gives an empty array strides 0, which out= refuses)
    a64, b64 = (ACTIVATIONS[case[f"{x}_prologue"]](_as64(v)) for x, v in (("a", a), ("b", b)))
    bound = None
    if dtype == "bfloat16":  # operands rounded after their prologue, as the kernel packs them
        a64, b64 = (_as64(_bf16(v.numpy())) for v in (a64, b64))
        bound = abs(case["alpha"]) * torch.matmul(a64.abs(), b64.abs()).numpy()
        if "gelu_tanh" in (case["a_prologue"], case["b_prologue"]):
            # gelu in float32 a few ulp from float64's may round to the neighbouring bfloat16: 2^-8 of the operand
            bound = bound * (1 + 2.0**-8 * 2.0**23 / max(k, 1))
        for extra in (bias, residual):
            bound = bound + (0 if extra is None else np.abs(extra))
    expected = _epilogue(torch.matmul(a64, b64), case, bias, residual).numpy()
    spread = _rounding_spread(k, torch.matmul(a64**2, b64**2), case["alpha"])
    problems = [_compare(actual, expected, k, bound, result is None and dtype == "bfloat16", spread)]
    problems.append(_outside_untouched(out, buffer))
    return [problem for problem in problems if problem]


def run_conv(case: Case, seed: int) -> list[str]:
    rng = np.random.default_rng([seed, 2])
    batch, cin, h, w, cout = (case[key] for key in ("batch", "cin", "h", "w", "cout"))
    kh, kw = case["kernel"]
    x = _values(rng, (batch, cin, h, w), case["special"])
    if case["x_layout"] == "permuted":
        x = np.ascontiguousarray(x.transpose(0, 1, 3, 2)).transpose(0, 1, 3, 2)
    weight = _values(rng, (cout, cin, kh, kw), case["special"] and rng.random() < 0.3)
    bias = _values(rng, (cout,), False) if case["bias"] else None
    geometry = dict(stride=case["stride"], padding=case["padding"], dilation=case["dilation"])
    y = torch.nn.functional.conv2d(_as64(x), _as64(weight), **geometry)
    residual = _values(rng, tuple(y.shape), False) if case["residual"] else None
    case = {**case, "after_residual": case["after_residual"] and residual is not None}
    expected = _epilogue(y, case, None if bias is None else bias.reshape(-1, 1, 1), residual).numpy()
    squares = torch.nn.functional.conv2d(_as64(x) ** 2, _as64(weight) ** 2, **geometry)
    spread = _rounding_spread(cin * kh * kw, squares, case["alpha"])
    epilogue = dict(bias=bias, residual=residual, activation=case["activation"], alpha=case["alpha"],
                    activation_after_residual=case["after_residual"])
    runs = [(algorithm, None) for algorithm in gemm.CONV_ALGORITHMS]
    winograd = (kh, kw) == (3, 3) and case["stride"] == (1, 1) and case["dilation"] == (1, 1)
    if winograd:
        runs.append(("winograd", gemm.winograd_weights(weight)))
    problems = []
    for algorithm, prepared in runs:
        out, buffer = _output(tuple(expected.shape), case["out"] == "channel_slice", 1)
        over_residual = case["out"] == "residual" and residual is not None  # the residual's own array (gemm.h)
        if over_residual:
            out[...] = residual
        actual = gemm.conv2d(x, weight, **geometry, **{**epilogue, "residual": out} if over_residual else epilogue,
                             algorithm=algorithm, prepared=prepared, out=out)
        if algorithm == "winograd" and winograd:  # F(4x4, 3x3)'s own tolerance (tests/kernels/test_winograd.py)
            finite = np.isfinite(expected)
            largest = float(np.abs(expected[finite]).max(initial=0.0))
            problem = _compare(actual, expected, 1, np.full(expected.shape, 3e-5 * largest * 2.0**23), False)
        else:
            problem = _compare(actual, expected, cin * kh * kw, spread=spread)
        name = algorithm + (" prepared" if prepared is not None else "")
        problems += [f"{name}: {p}" for p in (problem, _outside_untouched(out, buffer)) if p]
    return problems


def run(seed: int) -> tuple[Case, list[str]]:
    case = draw(seed)
    try:
        return case, (run_matmul if case["kind"] == "matmul" else run_conv)(case, seed)
    except Exception:  # noqa: BLE001 - a crash is a finding like a wrong value
        return case, [traceback.format_exc(limit=3)]


def _run_seeds(seeds: range, threads: int, verbose: bool, progress: str | None) -> int:
    failures, started = 0, time.perf_counter()
    for seed in seeds:
        if progress:  # the seed a crash (SIGSEGV, SIGFPE) kills the process in
            with open(progress, "w") as file:
                file.write(str(seed))
        case, problems = run(seed)
        if problems or verbose:
            print(f"seed {seed} threads {threads}: {json.dumps(case)}", flush=True)
        for problem in problems:
            print(f"    {problem}", flush=True)
        failures += bool(problems)
    seconds = time.perf_counter() - started
    print(f"threads {threads}: {len(seeds)} cases from seed {seeds.start}, {failures} failed ({seconds:.0f} s)")
    return failures


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Random GEMM and conv2d problems: the kernels vs float64 torch.")
    parser.add_argument("--count", type=int, default=200, help="number of cases (default 200)")
    parser.add_argument("--start", type=int, default=0, help="first seed (default 0)")
    parser.add_argument("--seed", type=int, help="run only this seed's case, printing it")
    parser.add_argument("--threads", default="1,2", help="comma-separated OpenMP thread counts (default 1,2)")
    options = parser.parse_args(argv)
    if not gemm.available():
        print("the GEMM kernels need AVX-512F or AVX2 and a C compiler")
        return 0
    seeds = range(options.seed, options.seed + 1) if options.seed is not None else range(
        options.start, options.start + options.count)
    counts = [int(t) for t in options.threads.split(",")]
    if len(counts) == 1 and os.environ.get("OMP_NUM_THREADS") == str(counts[0]):
        progress = os.environ.get("TG_FUZZ_PROGRESS")
        return int(_run_seeds(seeds, counts[0], options.seed is not None, progress) > 0)
    status = 0
    for threads in counts:  # one process per thread count: OpenMP reads it from the environment
        status |= _run_process(seeds, threads, options.seed is not None)
    return status


def _run_process(seeds: range, threads: int, verbose: bool) -> int:
    """Run `seeds` in processes with `threads` OpenMP threads, one after another past each seed that crashes one."""
    status, start = 0, seeds.start
    with tempfile.NamedTemporaryFile("r") as progress:
        while start < seeds.stop:
            arguments = ["--start", str(start), "--count", str(seeds.stop - start), "--threads", str(threads)]
            if verbose:
                arguments = ["--seed", str(start), "--threads", str(threads)]
            command = [sys.executable, "-m", "tensorgraphs.testing.fuzz_kernels", *arguments]
            environment = {**os.environ, "OMP_NUM_THREADS": str(threads), "TG_FUZZ_PROGRESS": progress.name}
            returncode = subprocess.run(command, env=environment).returncode
            if returncode >= 0:
                return status | returncode
            progress.seek(0)
            crashed = int(progress.read() or start)
            print(f"seed {crashed} threads {threads}: {json.dumps(draw(crashed))}\n    crashed by signal {-returncode}")
            status, start = 1, crashed + 1
    return status


if __name__ == "__main__":
    sys.exit(main())
