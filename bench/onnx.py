"""Benchmark: ONNX models on tensorgraphs (`tg.onnx.load`, compiled with `tg.compile`) vs ONNX Runtime.

    .venv/bin/python bench/onnx.py [--models resnet50,squeezenet] [--batches 1,8] [--repeat 10] [--threads 1]
                                   [--clock wall|cpu]

Models: the graphs the onnx wheel ships under backend/test/data/light (their weights are ConstantOfShape
placeholders), given seeded random weights (He-scaled normal; vectors (biases, batch-norm statistics) uniform in
[0.5, 1.5], so variances are positive and activations stay in range) and the batch size (a Reshape to a constant
batch of 1 gets -1).
Each (framework, model, batch) runs in its own subprocess: the median latency of `--repeat` calls after one
warm-up, the compile time (tg: trace and compile; ORT: session creation) and the process's peak RSS. Both use
`--threads` threads, every core by default (ORT: intra_op_num_threads; tg: OMP_NUM_THREADS). On a machine shared
with other work, `--threads 1 --clock cpu` times each call by the process's CPU time (time it was descheduled
does not count), as bench/gemm.py does.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path[0] = str(Path(__file__).resolve().parents[1])  # the repository, not bench/ (this file would shadow onnx)

MODELS = ("resnet50", "squeezenet", "densenet121", "inception_v1", "shufflenet", "vgg19")
CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}


def light_model(name: str, batch: int, seed: int = 0):
    """The wheel's light graph `name` with random weights in place of its ConstantOfShape placeholders."""
    import onnx
    from onnx import numpy_helper

    path = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light" / f"light_{name}.onnx"
    model = onnx.load(str(path))
    rng = np.random.default_rng(seed)
    shapes = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    kept = []
    for node in model.graph.node:
        if node.op_type == "ConstantOfShape" and node.input[0] in shapes:
            shape = tuple(int(d) for d in shapes[node.input[0]])
            if len(shape) > 1:
                scale = np.sqrt(2.0 / max(int(np.prod(shape[1:])), 1))
                weights = (rng.standard_normal(shape) * scale).astype(np.float32)
            else:
                weights = rng.uniform(0.5, 1.5, shape).astype(np.float32)
            model.graph.initializer.append(numpy_helper.from_array(weights, node.output[0]))
        else:
            kept.append(node)
    reshaped = {node.input[1] for node in kept if node.op_type == "Reshape"}
    for i, initializer in enumerate(model.graph.initializer):
        if initializer.name in reshaped and numpy_helper.to_array(initializer)[:1].tolist() == [1]:
            target = numpy_helper.to_array(initializer).copy()
            target[0] = -1
            model.graph.initializer[i].CopyFrom(numpy_helper.from_array(target, initializer.name))
    used = {name for node in kept for name in node.input}
    weights = {i.name for i in model.graph.initializer}
    (data,) = [i for i in model.graph.input if i.name in used and i.name not in weights]
    data.type.tensor_type.shape.dim[0].dim_value = batch
    produced = {name for node in kept for name in node.output}
    outputs = [o for o in model.graph.output if o.name in produced]
    for output in outputs:
        output.type.tensor_type.shape.dim[0].dim_value = batch
    graph = onnx.helper.make_graph(kept, model.graph.name, [data], outputs,
                                   [i for i in model.graph.initializer if i.name in used])
    return onnx.helper.make_model(graph, opset_imports=model.opset_import, ir_version=7)


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def example(model, batch: int) -> np.ndarray:
    """Seeded standard-normal data for the model's one input."""
    dims = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    return np.random.default_rng(1).standard_normal([batch, *dims[1:]]).astype(np.float32)


def median_ms(call: Callable[[], object], repeat: int, clock: str) -> float:
    """Median milliseconds of `repeat` calls by `clock` (CLOCKS)."""
    now, times = CLOCKS[clock], []
    for _ in range(repeat):
        start = now()
        call()
        times.append(now() - start)
    return statistics.median(times) * 1e3


def run_ours(name: str, batch: int, repeat: int, clock: str) -> dict:
    import tensorgraphs as tg

    model = light_model(name, batch)
    x = example(model, batch)
    module = tg.onnx.load(model).requires_grad_(False)
    forward = tg.compile(module.forward)
    start = time.perf_counter()
    out = forward(tg.tensor(x)).numpy()
    compile_s = time.perf_counter() - start
    return {"ms": median_ms(lambda: forward(tg.tensor(x)).numpy(), repeat, clock), "compile_s": compile_s,
            "rss": peak_rss_mib(), "checksum": float(np.abs(out).sum())}


def run_ort(name: str, batch: int, repeat: int, clock: str) -> dict:
    import onnxruntime as ort

    model = light_model(name, batch)
    x = example(model, batch)
    options = ort.SessionOptions()
    options.intra_op_num_threads = int(os.environ["OMP_NUM_THREADS"])
    start = time.perf_counter()
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    feed = {model.graph.input[0].name: x}
    out = session.run(None, feed)[0]
    compile_s = time.perf_counter() - start
    return {"ms": median_ms(lambda: session.run(None, feed), repeat, clock), "compile_s": compile_s,
            "rss": peak_rss_mib(), "checksum": float(np.abs(out).sum())}


def measure(framework: str, name: str, batch: int, repeat: int, threads: int, clock: str) -> dict:
    """One measurement in a fresh process (so its peak RSS is its own) with `threads` threads."""
    command = [sys.executable, __file__, "--child", framework, name, str(batch), str(repeat), clock]
    done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": str(threads)})
    if done.returncode:
        return {"error": done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"exit {done.returncode}"}
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--clock", choices=CLOCKS, default="wall", help="cpu needs --threads 1")
    parser.add_argument("--child", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        framework, name, batch, repeat, clock = args.child
        run = run_ours if framework == "tg" else run_ort
        print(json.dumps(run(name, int(batch), int(repeat), clock)))
        return
    if args.clock == "cpu" and args.threads != 1:
        parser.error("--clock cpu measures one thread: add --threads 1")
    print(f"clock {args.clock}, threads {args.threads}, load average {os.getloadavg()[0]:.1f}")
    print("| model | batch | tg ms | ORT ms | ORT / tg | tg compile s | ORT session s | tg RSS MiB | ORT RSS MiB |"
          " outputs agree |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for name in args.models.split(","):
        for batch in (int(b) for b in args.batches.split(",")):
            ours = measure("tg", name, batch, args.repeat, args.threads, args.clock)
            theirs = measure("ort", name, batch, args.repeat, args.threads, args.clock)
            if "error" in ours or "error" in theirs:
                print(f"| {name} | {batch} | {ours.get('error', '')} | {theirs.get('error', '')} |", flush=True)
                continue
            agree = abs(ours["checksum"] - theirs["checksum"]) <= 1e-3 * max(abs(theirs["checksum"]), 1e-6)
            print(f"| {name} | {batch} | {ours['ms']:.1f} | {theirs['ms']:.1f} | {theirs['ms'] / ours['ms']:.2f}x | "
                  f"{ours['compile_s']:.1f} | {theirs['compile_s']:.2f} | {ours['rss']:.0f} | {theirs['rss']:.0f} | "
                  f"{'yes' if agree else 'NO'} |", flush=True)


if __name__ == "__main__":
    main()
