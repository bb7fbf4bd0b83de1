"""What `tg build` builds from: an ONNX model (through `tensorgraphs.onnx.load`, with example inputs of the types
and shapes its graph declares) or a Python file that defines `model` and `example_args`."""

from __future__ import annotations

import math
import runpy
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from tensorgraphs.errors import ArgumentError, UnsupportedError, fail


@dataclass(frozen=True)
class BuildSource:
    model: Any  # a Module or a function tg.compile takes
    example_args: tuple[Any, ...]
    input_names: list[str] | None  # None: the function's parameter names
    output_names: list[str] | None = None  # None: output, output.0, ...


def load_source(path: Path, shapes: Mapping[str, tuple[int, ...]]) -> BuildSource:
    """The model in `path`; `shapes` gives the sizes of an ONNX input's symbolic dims (unnamed ones are 1)."""
    if path.suffix == ".py":
        found = runpy.run_path(str(path))
        if "model" not in found or "example_args" not in found:
            fail("build", f"{path} must define `model` (a Module or function) and `example_args` (a tuple)",
                 kind=ArgumentError)
        args = found["example_args"]
        return BuildSource(found["model"], args if isinstance(args, tuple) else (args,), None)
    if path.suffix != ".onnx":
        fail("build", f"{path}: expected an ONNX model (.onnx) or a Python file (.py)", kind=ArgumentError)
    try:
        import onnx

        from tensorgraphs.onnx import load
    except ImportError as error:
        fail("build", f"building an ONNX model needs tensorgraphs.onnx and the onnx package ({error})",
             kind=UnsupportedError)
    module = load(str(path)).eval()
    graph = onnx.load(str(path), load_external_data=False).graph
    initializers = {i.name for i in graph.initializer}
    inputs = [i for i in graph.input if i.name not in initializers]
    unknown = set(shapes) - {i.name for i in inputs}
    if unknown:
        fail("build", f"--shape names {sorted(unknown)}, which are not inputs of the model "
             f"({', '.join(i.name for i in inputs)})", kind=ArgumentError)
    args = tuple(_zeros(i, shapes.get(i.name), onnx) for i in inputs)
    return BuildSource(module, args, [i.name for i in inputs], [o.name for o in graph.output])


def _zeros(value: Any, shape: tuple[int, ...] | None, onnx: Any) -> np.ndarray:
    """An array of zeros of the input's declared element type and shape (`shape` if given, symbolic dims 1)."""
    declared = value.type.tensor_type
    dtype = onnx.helper.tensor_dtype_to_np_dtype(declared.elem_type)
    dims = [d.dim_value if d.HasField("dim_value") else 1 for d in declared.shape.dim]
    if shape is not None:
        if len(shape) != len(dims):
            fail("build", f"--shape {value.name}: {len(shape)} dims for an input of rank {len(dims)}",
                 kind=ArgumentError)
        dims = list(shape)
    if math.prod(dims) < 0:
        fail("build", f"input {value.name!r} has a negative dim", kind=ArgumentError)
    return np.zeros(dims, dtype)
