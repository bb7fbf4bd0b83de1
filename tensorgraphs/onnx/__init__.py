"""ONNX in and out: `load` turns a model into a `tg.nn.Module`, `export` writes one; `backend` is the standard
`onnx.backend` interface.

Importing this package does not import onnx: each entry point imports it when called, so tensorgraphs works
where onnx is not installed (it comes with the `onnx` extra).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tensorgraphs.onnx.module import OnnxModule


def load(model: Any) -> OnnxModule:
    """A path to a .onnx file (external data next to it is read) or a ModelProto, as a `tg.nn.Module` whose forward
    takes the graph's inputs in order and returns a Tensor (one output) or a tuple; see `tensorgraphs.onnx.module`."""
    from tensorgraphs.onnx.module import load as load_module

    return load_module(model)


def export(target: Any, example_args: Any, path: Any = None, **options: Any) -> Any:
    """Trace a module or function on `example_args` and write it as an ONNX model (see
    `tensorgraphs.onnx.exporter`): input_names=, output_names=, dynamic_axes= as torch.onnx.export takes them."""
    from tensorgraphs.onnx.exporter import export as export_model

    return export_model(target, example_args, path, **options)


def __getattr__(name: str) -> Any:
    if name in ("backend", "module", "importer", "exporter"):
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
