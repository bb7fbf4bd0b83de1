"""Benchmark: tg.compile (cpu backend) vs torch eager vs torch.compile on memory-bound ops.

    python bench/ops.py [--repeat 10] [--bandwidth 25] [--only gelu,softmax] [--no-torch-compile]

Each op runs `--repeat` times after two warm-up calls; the table shows medians.
Compile time is measured separately (first call minus a run): cold (empty
on-disk cache) and warm (in-process caches cleared, the library found on disk,
as a new process would). GB/s counts
the bytes an op must move at least (inputs read once, output written once);
"% bw" compares it with the machine's bandwidth (`--bandwidth`, GB/s; 25 is
STREAM add measured on the development machine).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import tensorgraphs as tg  # noqa: E402
import tensorgraphs.nn.functional as F  # noqa: E402
from tensorgraphs.backends.cpu import CPU  # noqa: E402
from tensorgraphs.codegen import compiler  # noqa: E402

M16 = 1 << 24


@dataclass
class Case:
    name: str
    inputs: Callable[[np.random.Generator], list[np.ndarray]]
    tg_fn: Callable[..., Any]
    torch_fn: Callable[..., Any]
    bytes_moved: int


def _gelu_tg(x: Any, a: Any, b: Any) -> Any:
    return F.gelu(x * a + b, approximate="tanh")


def _gelu_torch(x: Any, a: Any, b: Any) -> Any:
    import torch

    return torch.nn.functional.gelu(x * a + b, approximate="tanh")


def _chain(x: Any) -> Any:
    """Ten cheap elementwise ops (mul, add, max, ...), written once for both libraries."""
    y = x * 1.5 + 0.25
    y = y * y - 0.5
    y = y * 0.75 + x
    y = y - x * 0.125
    y = y * 2.0 + 1.0
    return y


def _softmax_torch(x: Any) -> Any:
    import torch

    return torch.softmax(x, -1)


def _layer_norm_torch(x: Any, w: Any, b: Any) -> Any:
    import torch

    return torch.nn.functional.layer_norm(x, (x.shape[-1],), w, b)


def _normal(*shape: int) -> Callable[[np.random.Generator], np.ndarray]:
    return lambda rng: rng.standard_normal(shape, dtype=np.float32)


CASES = [
    Case("gelu(x*a+b) 16M", lambda r: [_normal(M16)(r), _normal(1)(r), _normal(1)(r)], _gelu_tg, _gelu_torch,
         2 * 4 * M16),
    Case("softmax 4096x4096", lambda r: [_normal(4096, 4096)(r)], lambda x: F.softmax(x, -1), _softmax_torch,
         2 * 4 * M16),
    Case("layer_norm 4096x4096", lambda r: [_normal(4096, 4096)(r), _normal(4096)(r), _normal(4096)(r)],
         lambda x, w, b: F.layer_norm(x, (4096,), w, b), _layer_norm_torch, 2 * 4 * M16),
    Case("sum 64M", lambda r: [_normal(4 * M16)(r)], lambda x: x.sum(), lambda x: x.sum(), 4 * 4 * M16),
    Case("10-op chain 16M", lambda r: [_normal(M16)(r)], _chain, _chain, 2 * 4 * M16),
    Case("transpose 4096x4096", lambda r: [_normal(4096, 4096)(r)], lambda x: x.T.contiguous(),
         lambda x: x.t().contiguous(), 2 * 4 * M16),
]


def median_ms(fn: Callable[[], Any], repeat: int) -> float:
    for _ in range(2):
        fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def clear_compile_caches() -> None:
    CPU._programs.clear()
    compiler.load.cache_clear()


def bench_tg(case: Case, arrays: list[np.ndarray], repeat: int) -> tuple[float, float, float]:
    """(run ms, cold compile s, warm compile ms); compile = first call minus a run."""
    with tempfile.TemporaryDirectory() as cache:
        previous = os.environ.get("TG_CACHE_DIR")
        os.environ["TG_CACHE_DIR"] = cache
        try:
            clear_compile_caches()
            tensors = [tg.tensor(a) for a in arrays]
            start = time.perf_counter()
            tg.compile(case.tg_fn)(*tensors)
            cold = time.perf_counter() - start
            clear_compile_caches()
            compiled = tg.compile(case.tg_fn)
            start = time.perf_counter()
            compiled(*tensors)
            warm = time.perf_counter() - start
            run = median_ms(lambda: compiled(*tensors), repeat)
            cold, warm = cold - run / 1e3, max(warm - run / 1e3, 0.0)
        finally:
            if previous is None:
                del os.environ["TG_CACHE_DIR"]
            else:
                os.environ["TG_CACHE_DIR"] = previous
    return run, cold, warm * 1e3


def bench_torch(case: Case, arrays: list[np.ndarray], repeat: int, use_compile: bool) -> tuple[float, float | None]:
    import torch

    tensors = [torch.from_numpy(a) for a in arrays]
    eager = median_ms(lambda: case.torch_fn(*tensors), repeat)
    if not use_compile:
        return eager, None
    compiled = torch.compile(case.torch_fn)
    compiled(*tensors)
    return eager, median_ms(lambda: compiled(*tensors), repeat)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--bandwidth", type=float, default=25.0, help="machine bandwidth in GB/s")
    parser.add_argument("--only", default="", help="comma-separated substrings of case names")
    parser.add_argument("--no-torch-compile", action="store_true")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    header = (f"{'op':22} {'tg ms':>8} {'GB/s':>6} {'% bw':>5} {'eager ms':>9} {'compile ms':>10} "
              f"{'vs best':>7} {'tg cold s':>9} {'warm ms':>8}")
    print(f"load average {os.getloadavg()[0]:.2f} (other processes share the cores: timings are noisy)")
    print(header)
    print("-" * len(header))
    for case in CASES:
        if args.only and not any(part in case.name for part in args.only.split(",")):
            continue
        arrays = case.inputs(rng)
        run, cold, warm = bench_tg(case, arrays, args.repeat)
        eager, compiled = bench_torch(case, arrays, args.repeat, not args.no_torch_compile)
        best_torch = min(t for t in (eager, compiled) if t is not None)
        gbs = case.bytes_moved / run / 1e6
        compiled_text = f"{compiled:10.1f}" if compiled is not None else f"{'-':>10}"
        print(f"{case.name:22} {run:8.1f} {gbs:6.1f} {100 * gbs / args.bandwidth:5.0f} {eager:9.1f} "
              f"{compiled_text} {best_torch / run:6.1f}x {cold:9.2f} {warm:8.1f}", flush=True)
    print(f"load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
