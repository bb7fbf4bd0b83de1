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
