"""Control flow whose path is known when the graph is built: If on a known condition, Loop with a known trip
count or condition (unrolled). Subgraphs see the enclosing graph's values."""

from __future__ import annotations

import numpy as np
import onnx

import tensorgraphs as tg
from tensorgraphs.onnx.dtypes import numpy_dtype
from tensorgraphs.onnx.lowering import OnnxNode, Value, is_known, lowers, scalar, tensor


def _run(node: OnnxNode, graph_name: str, inputs: list[Value]) -> list[Value]:
    from tensorgraphs.onnx.importer import run_graph, scope

    values, opsets = node.scope
    graph = node.attr(graph_name)
    inner = scope(values)
    for proto, value in zip(graph.input, inputs):
        inner[proto.name] = value
    return run_graph(graph, inner, opsets)


@lowers("If", fold=False)
def if_(node: OnnxNode, condition: Value) -> tuple:
    if not is_known(condition):
        condition = np.asarray(tensor(condition).numpy())
    return tuple(_run(node, "then_branch" if bool(scalar(condition)) else "else_branch", []))


@lowers("Loop", fold=False)
def loop(node: OnnxNode, trip_count: Value | None, condition: Value | None, *carried: Value) -> tuple:
    """Unrolled: the body runs while the iteration is below the trip count and its condition (known at each
    step) holds; scan outputs are stacked."""
    limit = None if trip_count is None else int(scalar(trip_count))
    going = True if condition is None else bool(scalar(condition))
    state, scanned, step = list(carried), [], 0
    while going and (limit is None or step < limit):
        outputs = _run(node, "body", [np.asarray(step, np.int64), np.asarray(going), *state])
        going = bool(scalar(outputs[0])) if is_known(outputs[0]) else bool(tensor(outputs[0]).item())
        state = outputs[1:1 + len(carried)]
        scanned.append(outputs[1 + len(carried):])
        step += 1
    body_outputs = node.attr("body").output[1 + len(carried):]
    stacks = [tg.stack([tensor(s[i]) for s in scanned]) if scanned else _empty(proto) for i, proto in
              enumerate(body_outputs)]
    return (*state, *stacks)


def _empty(proto: onnx.ValueInfoProto) -> np.ndarray:
    return np.zeros((0,), numpy_dtype(proto.type.tensor_type.elem_type))


@lowers("Scan", fold=False)
def scan(node: OnnxNode, *inputs: Value) -> tuple:
    """Unrolled over the scan axis: the body maps (states, one slice of each scan input) to (new states, one
    slice of each scan output); the slices are stacked (reversed where a direction is 1)."""
    if node.opset < 9:
        node.fail("Scan before opset 9 (with sequence_lens and a batch axis) is not supported")
    count = node.attr("num_scan_inputs")
    states, sequences = [tensor(v) for v in inputs[:-count]], [tensor(v) for v in inputs[-count:]]
    in_axes = [a % s.ndim for a, s in zip(node.attr("scan_input_axes") or [0] * count, sequences)]
    in_directions = node.attr("scan_input_directions") or [0] * count
    length = sequences[0].shape[in_axes[0]]
    slices: list[list[Value]] = []
    for step in range(length):
        parts = [tg.squeeze(tg.narrow(s, a, length - 1 - step if d else step, 1), a) for s, a, d in
                 zip(sequences, in_axes, in_directions)]
        outputs = _run(node, "body", [*states, *parts])
        states = [tensor(v) for v in outputs[:len(states)]]
        slices.append(outputs[len(states):])
    produced = len(slices[0]) if slices else 0
    out_axes = node.attr("scan_output_axes") or [0] * produced
    out_directions = node.attr("scan_output_directions") or [0] * produced
    stacked = []
    for i in range(produced):
        parts = [tensor(s[i]) for s in slices]
        parts = parts[::-1] if out_directions[i] else parts
        stacked.append(tg.stack(parts, dim=out_axes[i] % (parts[0].ndim + 1)))
    return (*states, *stacked)
