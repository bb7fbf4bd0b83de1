"""Ops without a lowering of their own that ONNX defines as a function of other ops (Attention, the losses,
CenterCropPad, ...): the node is expanded into its function body (the opset's version; for context-dependent
functions, the one for its inputs' types) and the body's nodes are lowered instead."""

from __future__ import annotations

import functools
from typing import Sequence

import numpy as np
import onnx
import onnx.inliner

from tensorgraphs.frontend.tensor import Tensor
from tensorgraphs.onnx.dtypes import element_type
from tensorgraphs.onnx.lowering import STANDARD_DOMAINS, Value

PRIVATE_DOMAIN = "tensorgraphs.expanded"


def schema(node: onnx.NodeProto, opset: int) -> onnx.defs.OpSchema | None:
    """The op's schema at `opset` when it defines a function body, else None."""
    try:
        found = onnx.defs.get_schema(node.op_type, opset, node.domain)
    except onnx.defs.SchemaError:
        return None
    return found if found.has_function or found.has_context_dependent_function else None


def _type_of(value: Value | None) -> onnx.TypeProto:
    if value is None:
        return onnx.TypeProto()
    if isinstance(value, Tensor):
        return onnx.helper.make_tensor_type_proto(element_type(value.dtype), tuple(value.shape))
    array = np.asarray(value)
    return onnx.helper.make_tensor_type_proto(onnx.helper.np_dtype_to_tensor_dtype(array.dtype), array.shape)


def expand(node: onnx.NodeProto, opset: int, inputs: Sequence[Value | None],
           standard: int) -> onnx.ModelProto | None:
    """A model whose graph is `node` expanded into its function body (same input and output names), with the
    body's opset imports (the model's `standard` opset where the body names none); None when the op has no
    function."""
    types = tuple(_type_of(v).SerializeToString() for v in inputs)
    return _expanded(node.SerializeToString(), opset, types, standard)


@functools.lru_cache(maxsize=512)
def _expanded(node_bytes: bytes, opset: int, types: tuple[bytes, ...], standard: int) -> onnx.ModelProto | None:
    node = onnx.NodeProto.FromString(node_bytes)
    found = schema(node, opset)
    if found is None:
        return None
    versions = [v for v in found.function_opset_versions if v <= opset]
    if versions:
        body = onnx.FunctionProto.FromString(found.get_function_with_opset_version(max(versions)))
    else:
        versions = [v for v in found.context_dependent_function_opset_versions if v <= opset]
        if not versions:
            return None
        body = onnx.FunctionProto.FromString(found.get_context_dependent_function_with_opset_version(
            max(versions), node_bytes, list(types)))
    for name, attribute in found.attributes.items():  # defaults the body may refer to
        if attribute.default_value.name and all(a.name != name for a in node.attribute):
            node.attribute.append(attribute.default_value)
    body.name, body.domain = node.op_type, PRIVATE_DOMAIN
    call = onnx.NodeProto()
    call.CopyFrom(node)
    call.domain = PRIVATE_DOMAIN
    imports = {entry.domain: entry.version for entry in body.opset_import}
    imports.setdefault("", opset if node.domain in STANDARD_DOMAINS else standard)
    graph = onnx.helper.make_graph([call], "expanded", [], [])
    model = onnx.helper.make_model(graph, functions=[body], opset_imports=[
        onnx.helper.make_opsetid(domain, version) for domain, version in imports.items()
    ] + [onnx.helper.make_opsetid(PRIVATE_DOMAIN, 1)])
    return onnx.inliner.inline_local_functions(model)
