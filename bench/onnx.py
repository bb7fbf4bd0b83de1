"""Benchmark: ONNX models on tensorgraphs (`tg.onnx.load`, compiled with `tg.compile`) vs ONNX Runtime.

    .venv/bin/python bench/onnx.py [--models resnet50,squeezenet] [--batches 1,8] [--repeat 10] [--min-time 1]
                                   [--threads 1] [--clock wall|cpu] [--layers]

Models: the graphs the onnx wheel ships under backend/test/data/light (their weights are ConstantOfShape
placeholders), given seeded random weights (He-scaled normal; vectors (biases, batch-norm statistics) uniform in
[0.5, 1.5], so variances are positive and activations stay in range) and the batch size (a Reshape to a constant
batch of 1 gets -1).
Each (framework, model, batch) runs in its own subprocess: the median latency of `--repeat` calls after one
warm-up, and of more until they took `--min-time` seconds (a model of a few milliseconds is otherwise timed over a
fraction of a second, which one phase of a shared machine's neighbours decides), the compile time (tg: trace and
compile; ORT: session creation) and the process's peak RSS. Both use `--threads` threads, every core by default
(ORT: intra_op_num_threads; tg: OMP_NUM_THREADS). On a machine shared with other work, `--threads 1 --clock cpu`
times each call by the process's CPU time (time it was descheduled does not count), as bench/gemm.py does.

`--layers` times each distinct conv of the models instead (its input shape, weight, strides, padding, groups, at the
first batch of `--batches`), as a small model (Conv with a bias, and the Relu where the model's conv is followed by
one, through a batch norm or not; then a global average pool, so the output is small) on both, in one process, the
two interleaved; the table is sorted by the time tg loses against ORT over all of a model's convs of that shape, net
of each framework's cost of a call (a whole model pays it once). ORT's session also converts to and from its
blocked layout (NCHWc) around the conv, which the whole model does once; tg may fuse the pool into the loops of a
conv it does not run by a kernel (depthwise, grouped), which the whole model does not. `--layers --conv winograd`
runs tg's convs by that candidate of the planner (`plan.choices.forced`; `schedule.convolution.CONV_CANDIDATES`)
and times only the layers it applies to.
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


def conv_layers(name: str, batch: int) -> dict[tuple, int]:
    """The distinct convs of model `name` at `batch`: (x shape, weight shape, strides, pads, dilations, group,
    relu after) -> how many times the model runs it."""
    import onnx
    from onnx import helper

    model = onnx.shape_inference.infer_shapes(light_model(name, batch))
    graph = model.graph
    shapes = {v.name: tuple(d.dim_value for d in v.type.tensor_type.shape.dim)
              for v in (*graph.value_info, *graph.input)}
    shapes.update({i.name: tuple(i.dims) for i in graph.initializer})
    consumers: dict[str, list] = {}
    for node in graph.node:
        for source in node.input:
            consumers.setdefault(source, []).append(node)

    def relu_after(output: str) -> bool:
        users = consumers.get(output, [])
        if len(users) == 1 and users[0].op_type == "BatchNormalization":
            users = consumers.get(users[0].output[0], [])
        return len(users) == 1 and users[0].op_type == "Relu"

    layers: dict[tuple, int] = {}
    for node in graph.node:
        if node.op_type != "Conv":
            continue
        weight = shapes[node.input[1]]
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        key = (shapes[node.input[0]], weight, tuple(attrs.get("strides", (1, 1))),
               tuple(attrs.get("pads", (0, 0, 0, 0))), tuple(attrs.get("dilations", (1, 1))), attrs.get("group", 1),
               relu_after(node.output[0]))
        layers[key] = layers.get(key, 0) + 1
    return layers


def out_size(layer: tuple) -> list[int]:
    """The output height and width of `layer` (conv_layers' key)."""
    x_shape, w_shape, strides, pads, dilations, _, _ = layer
    return [(x_shape[2 + i] + pads[i] + pads[2 + i] - dilations[i] * (w_shape[2 + i] - 1) - 1) // strides[i] + 1
            for i in range(2)]


def conv_model(layer: tuple):
    """A small model of `layer` (conv_layers' key): Conv with a seeded bias, then Relu if the layer has one, then a
    GlobalAveragePool, so the output is small: a fresh conv-sized output per call (page faults, a copy out) would
    cost tg's call more than the conv at batch 1 (a whole model's convs write into its arena)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    x_shape, w_shape, strides, pads, dilations, group, relu = layer
    rng = np.random.default_rng(0)
    weight = (rng.standard_normal(w_shape) * np.sqrt(2.0 / int(np.prod(w_shape[1:])))).astype(np.float32)
    bias = rng.uniform(-0.5, 0.5, w_shape[0]).astype(np.float32)
    conv = helper.make_node("Conv", ["x", "w", "b"], ["conv" if relu else "features"], strides=list(strides),
                            pads=list(pads), dilations=list(dilations), group=group)
    nodes = [conv, *([helper.make_node("Relu", ["conv"], ["features"])] if relu else []),
             helper.make_node("GlobalAveragePool", ["features"], ["y"])]
    graph = helper.make_graph(nodes, "conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [x_shape[0], w_shape[0], 1, 1])],
                              [numpy_helper.from_array(weight, "w"), numpy_helper.from_array(bias, "b")])
    return onnx.helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=7)


def conv_nodes(layer: tuple) -> list:
    """The conv2d composites of conv_model(layer)'s lazy graph (not run)."""
    import tensorgraphs as tg
    from tensorgraphs.graph.node import toposort

    out = tg.onnx.load(conv_model(layer)).requires_grad_(False).forward(tg.tensor(np.zeros(layer[0], np.float32)))
    return [n for n in toposort([out.node]) if n.op.name == "conv2d"]


def candidate_applies(layer: tuple, candidate: str) -> bool:
    """Whether the planner's `candidate` can run the conv of conv_model(layer)."""
    from tensorgraphs.plan.choices import candidates_of

    return all(candidate in (c.name for c in candidates_of(n)) for n in conv_nodes(layer))


def time_layer(layer: tuple, repeat: int, clock: str, threads: int,
               candidate: str | None = None) -> tuple[float, float, float]:
    """(tg ms, ORT ms, max error relative to ORT's largest output) of conv_model(layer), interleaved rounds; tg runs
    the conv by `candidate` where given, else by the planner's choice."""
    import onnxruntime as ort

    import tensorgraphs as tg
    from tensorgraphs.plan.choices import forced
    from tensorgraphs.plan.signature import signature_of

    model = conv_model(layer)
    x = np.random.default_rng(1).standard_normal(layer[0]).astype(np.float32)
    routes = {signature_of(n): candidate for n in conv_nodes(layer)} if candidate else {}
    forward = tg.compile(tg.onnx.load(model).requires_grad_(False).forward)
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    with forced(routes):  # around every call: a program built with other routes is rebuilt
        ours, theirs = forward(tg.tensor(x)).numpy(), session.run(None, {"x": x})[0]
        error = float(np.abs(ours - theirs).max() / max(np.abs(theirs).max(), 1e-6))
        tg_ms, ort_ms = [], []
        for _ in range(3):  # interleaved rounds: load that comes and goes hits both
            tg_ms.append(median_ms(lambda: forward(tg.tensor(x)).numpy(), repeat, clock))
            ort_ms.append(median_ms(lambda: session.run(None, {"x": x}), repeat, clock))
    return statistics.median(tg_ms), statistics.median(ort_ms), error


def compare_layers(names: list[str], batch: int, repeat: int, threads: int, clock: str,
                   candidate: str | None = None) -> None:
    """Print each distinct conv of `names` timed on tg and ORT (conv_model), by time lost over the models. The time
    lost is net of each framework's cost of a call (a 1x1x1x1 conv's time), which a whole model pays once. With a
    `candidate`, tg runs the convs by it, and only those it applies to are timed."""
    os.environ["OMP_NUM_THREADS"] = str(threads)  # before tensorgraphs starts OpenMP
    counts: dict[tuple, dict[str, int]] = {}
    for name in names:
        for layer, count in conv_layers(name, batch).items():
            if candidate is None or candidate_applies(layer, candidate):
                counts.setdefault(layer, {})[name] = count
    tg_call, ort_call, _ = time_layer(((1, 1, 1, 1), (1, 1, 1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 1, False), repeat,
                                      clock, threads)
    rows, lost = [], dict.fromkeys(names, 0.0)
    for layer, used in counts.items():
        tg_t, ort_t, error = time_layer(layer, repeat, clock, threads, candidate)
        net = (tg_t - tg_call) - (ort_t - ort_call)
        for name, count in used.items():
            lost[name] += count * net
        x_shape, w_shape, strides, pads, _, group, relu = layer
        flops = 2 * int(np.prod(w_shape)) * batch * int(np.prod(out_size(layer)))
        rows.append((sum(used.values()) * net, layer, used, tg_t, ort_t, flops / (tg_t - tg_call) / 1e6, error))
        print(f"  measured {layer}", file=sys.stderr, flush=True)
    print(f"clock {clock}, threads {threads}, batch {batch}, convs by {candidate or 'the planner'}, load average "
          f"{os.getloadavg()[0]:.1f}; a call of a "
          f"1x1x1x1 conv: tg {tg_call:.3f} ms, ORT {ort_call:.3f} ms")
    print("| x | weight | stride | pad | group | relu | count | tg ms | ORT ms | ORT / tg | tg GFLOP/s (net) |"
          " lost ms (net) | max rel. error |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for total, (x_shape, w_shape, strides, pads, _, group, relu), used, tg_t, ort_t, rate, error in sorted(
            rows, key=lambda row: -row[0]):
        where = " ".join(f"{name[:4]}:{count}" for name, count in used.items())
        print(f"| {'x'.join(map(str, x_shape))} | {'x'.join(map(str, w_shape))} | {strides[0]} | {pads[0]} | {group} "
              f"| {'yes' if relu else ''} | {where} | {tg_t:.3f} | {ort_t:.3f} | {ort_t / tg_t:.2f}x | {rate:.1f} | "
              f"{total:.2f} | {error:.1e} |")
    print("lost over each model's convs, net (ms): " + ", ".join(f"{name} {ms:.1f}" for name, ms in lost.items()))


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def example(model, batch: int) -> np.ndarray:
    """Seeded standard-normal data for the model's one input."""
    dims = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    return np.random.default_rng(1).standard_normal([batch, *dims[1:]]).astype(np.float32)


def median_ms(call: Callable[[], object], repeat: int, clock: str, min_seconds: float = 0.0) -> float:
    """Median milliseconds of at least `repeat` calls by `clock` (CLOCKS), and of as many more as take the calls to
    `min_seconds` in all."""
    now, times, total = CLOCKS[clock], [], 0.0
    while len(times) < repeat or total < min_seconds:
        start = now()
        call()
        times.append(now() - start)
        total += times[-1]
    return statistics.median(times) * 1e3


def run_ours(name: str, batch: int, repeat: int, clock: str, min_seconds: float) -> dict:
    import tensorgraphs as tg

    model = light_model(name, batch)
    x = example(model, batch)
    module = tg.onnx.load(model).requires_grad_(False)
    forward = tg.compile(module.forward)
    start = time.perf_counter()
    out = forward(tg.tensor(x)).numpy()
    compile_s = time.perf_counter() - start
    return {"ms": median_ms(lambda: forward(tg.tensor(x)).numpy(), repeat, clock, min_seconds), "compile_s": compile_s,
            "rss": peak_rss_mib(), "checksum": float(np.abs(out).sum())}


def run_ort(name: str, batch: int, repeat: int, clock: str, min_seconds: float) -> dict:
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
    return {"ms": median_ms(lambda: session.run(None, feed), repeat, clock, min_seconds), "compile_s": compile_s,
            "rss": peak_rss_mib(), "checksum": float(np.abs(out).sum())}


def measure(framework: str, name: str, batch: int, repeat: int, threads: int, clock: str, min_seconds: float) -> dict:
    """One measurement in a fresh process (so its peak RSS is its own) with `threads` threads."""
    command = [sys.executable, __file__, "--child", framework, name, str(batch), str(repeat), clock, str(min_seconds)]
    done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": str(threads)})
    if done.returncode:
        return {"error": done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"exit {done.returncode}"}
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure_rounds(name: str, batch: int, args: argparse.Namespace) -> tuple[dict, dict]:
    """tg's and ORT's measurements of a row: `args.rounds` alternating pairs of processes (load that comes and goes
    hits both), each framework's first with the median of its rounds' times."""
    frameworks = ("tg", "ort")
    rounds = [tuple(measure(framework, name, batch, args.repeat, args.threads, args.clock, args.min_time)
                    for framework in frameworks) for _ in range(args.rounds)]
    failed = [r for pair in rounds for r in pair if "error" in r]
    if failed:
        return failed[0], failed[0]
    return tuple({**first, "ms": statistics.median(r[i]["ms"] for r in rounds)}
                 for i, first in enumerate(rounds[0]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--min-time", type=float, default=1.0, help="seconds of calls at least, per measurement")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--clock", choices=CLOCKS, default="wall", help="cpu needs --threads 1")
    parser.add_argument("--rounds", type=int, default=1,
                        help="rounds of one tg and one ORT process per row, alternating; their median times shown")
    parser.add_argument("--layers", action="store_true", help="time each distinct conv against ORT's")
    parser.add_argument("--conv", help="with --layers: the conv candidate tg runs (e.g. winograd, implicit_gemm)")
    parser.add_argument("--child", nargs=6, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        framework, name, batch, repeat, clock, min_seconds = args.child
        run = run_ours if framework == "tg" else run_ort
        print(json.dumps(run(name, int(batch), int(repeat), clock, float(min_seconds))))
        return
    if args.clock == "cpu" and args.threads != 1:
        parser.error("--clock cpu measures one thread: add --threads 1")
    if args.layers:
        compare_layers(args.models.split(","), int(args.batches.split(",")[0]), args.repeat, args.threads, args.clock,
                       args.conv)
        return
    print(f"clock {args.clock}, threads {args.threads}, load average {os.getloadavg()[0]:.1f}")
    print("| model | batch | tg ms | ORT ms | ORT / tg | tg compile s | ORT session s | tg RSS MiB | ORT RSS MiB |"
          " outputs agree |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for name in args.models.split(","):
        for batch in (int(b) for b in args.batches.split(",")):
            ours, theirs = measure_rounds(name, batch, args)
            if "error" in ours or "error" in theirs:
                print(f"| {name} | {batch} | {ours.get('error', '')} | {theirs.get('error', '')} |", flush=True)
                continue
            agree = abs(ours["checksum"] - theirs["checksum"]) <= 1e-3 * max(abs(theirs["checksum"]), 1e-6)
            print(f"| {name} | {batch} | {ours['ms']:.1f} | {theirs['ms']:.1f} | {theirs['ms'] / ours['ms']:.2f}x | "
                  f"{ours['compile_s']:.1f} | {theirs['compile_s']:.2f} | {ours['rss']:.0f} | {theirs['rss']:.0f} | "
                  f"{'yes' if agree else 'NO'} |", flush=True)


if __name__ == "__main__":
    main()
