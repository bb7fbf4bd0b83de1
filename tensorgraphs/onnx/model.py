"""Reading a model: from a path (with its external data) or a ModelProto, checked, with what it computes on."""

from __future__ import annotations

import os
from typing import Any

import onnx
import onnx.inliner

from tensorgraphs.errors import ArgumentError, ArgumentTypeError, UnsupportedError, fail
from tensorgraphs.onnx.importer import Opsets, check_supported

OP = "onnx.load"


def read_model(model: Any) -> onnx.ModelProto:
    """A checked ModelProto from a path or a ModelProto whose standard-domain opset this onnx knows and whose ops
    all have lowerings; anything else fails with the reason."""
    if isinstance(model, (str, os.PathLike)):
        path = os.fspath(model)
        if not os.path.isfile(path):
            fail(OP, f"no such model file: {path!r}", kind=ArgumentError)
        try:
            model = onnx.load(path)
        except Exception as error:  # a truncated or foreign file: protobuf's own error is the reason
            fail(OP, f"{path!r} is not a readable ONNX model ({type(error).__name__}: {error})", kind=ArgumentError)
    if not isinstance(model, onnx.ModelProto):
        fail(OP, f"expected a path or an onnx.ModelProto, got {type(model).__name__}", kind=ArgumentTypeError)
    _check(model)
    return onnx.inliner.inline_local_functions(model) if model.functions else model


def _check(model: onnx.ModelProto) -> None:
    try:
        onnx.checker.check_model(model)
    except (onnx.checker.ValidationError, ValueError) as error:
        fail(OP, f"malformed model: {str(error).strip().splitlines()[0]}", kind=ArgumentError)
    opsets = Opsets(model.opset_import)
    newest = onnx.defs.onnx_opset_version()
    if opsets.of("") > newest:
        fail(OP, f"the model imports opset {opsets.of('')} of the standard domain; the installed onnx knows up to "
             f"{newest}", kind=UnsupportedError)
    for initializer in model.graph.initializer:
        if onnx.external_data_helper.uses_external_data(initializer) and not initializer.raw_data:
            fail(OP, f"initializer {initializer.name!r} is stored in external data that was not loaded: pass the "
                 "model's path, or call onnx.load_external_data_for_model first", kind=ArgumentError)
    check_supported(model.graph, opsets)
