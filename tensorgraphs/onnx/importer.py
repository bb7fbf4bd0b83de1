"""Evaluate an ONNX graph on tensorgraphs values: each node through its lowering, in the graph's (topological)
order, with the values of an enclosing graph visible to subgraphs (If, Loop, Scan bodies)."""

from __future__ import annotations

from collections import ChainMap
from typing import Any, Iterable, Mapping, MutableMapping

import numpy as np
import onnx

from tensorgraphs.errors import ArgumentError, fail
from tensorgraphs.onnx import functions
from tensorgraphs.onnx import ops as _ops  # noqa: F401  (fills the table of lowerings)
from tensorgraphs.onnx.lowering import STANDARD_DOMAINS, OnnxNode, Value, evaluate, has_lowering, lowering_for


class Opsets:
    """The opset version per domain a model imports (the standard domain under both of its names)."""

    def __init__(self, imports: Iterable[onnx.OperatorSetIdProto]) -> None:
        self.versions = {entry.domain or "": entry.version for entry in imports}
        if "ai.onnx" in self.versions:
            self.versions.setdefault("", self.versions["ai.onnx"])

    def of(self, domain: str) -> int:
        return self.versions.get("" if domain in STANDARD_DOMAINS else domain, 0)


def check_supported(graph: onnx.GraphProto, opsets: Opsets) -> None:
    """Fail before running anything when a node (in any subgraph too) has neither a lowering nor a function."""
    for node in graph.node:
        if not has_lowering(node) and functions.schema(node, opsets.of(node.domain)) is None:
            lowering_for(node, opsets.of(node.domain))
        for attribute in node.attribute:
            for subgraph in (*([attribute.g] if attribute.HasField("g") else []), *attribute.graphs):
                check_supported(subgraph, opsets)


def run_graph(graph: onnx.GraphProto, values: MutableMapping[str, Value], opsets: Opsets) -> list[Value]:
    """The graph's outputs, given `values` holding its inputs and initializers (and an enclosing scope's values)."""
    for proto in graph.node:
        run_node(proto, values, opsets)
    missing = [output.name for output in graph.output if output.name not in values]
    if missing:
        fail("onnx", f"graph {graph.name!r}: outputs {missing} are computed by no node", kind=ArgumentError)
    return [values[output.name] for output in graph.output]


def run_node(proto: onnx.NodeProto, values: MutableMapping[str, Value], opsets: Opsets) -> None:
    node = OnnxNode(proto, opsets.of(proto.domain), (values, opsets))
    inputs = [_input(name, values, node) for name in proto.input]
    if not has_lowering(proto):
        expanded = functions.expand(proto, node.opset, inputs, opsets.of(""))
        if expanded is not None:
            run_graph(expanded.graph, values, Opsets(expanded.opset_import))
            return
    rule = lowering_for(proto, node.opset)
    if rule.fold and all(value is None or isinstance(value, np.ndarray) for value in inputs):
        results = evaluate(_as_tuple(rule.lower(node, *inputs), node))
    else:
        results = _as_tuple(rule.lower(node, *inputs), node)
    for name, result in zip(proto.output, results):
        if name:
            values[name] = result


def _input(name: str, values: Mapping[str, Value], node: OnnxNode) -> Value | None:
    if not name:
        return None
    if name not in values:
        node.fail(f"input {name!r} is neither a graph input, an initializer nor an earlier node's output",
                  ArgumentError)
    return values[name]


def _as_tuple(result: Any, node: OnnxNode) -> tuple:
    results = result if isinstance(result, tuple) else (result,)
    if len(results) < sum(1 for name in node.proto.output if name):
        node.fail(f"the lowering gives {len(results)} outputs, the node names {len(node.proto.output)}")
    return results


def scope(outer: Mapping[str, Value]) -> ChainMap:
    """A subgraph's values: its own first, then the enclosing graph's."""
    return ChainMap({}, outer)  # type: ignore[arg-type]
