"""`tg.onnx.load`: an ONNX model as a `tg.nn.Module`.

Float initializers become Parameters (so an imported model fine-tunes with `tg.optim` and saves with `tg.save`),
the others buffers, whose values are read when the graph is built (at each call; once per trace under
tg.compile); their attribute names are the ONNX names made identifiers (`initializer_names` maps them back).
Forward evaluates the graph on tensorgraphs ops for the shapes it is called with, so a symbolic dim (`batch`)
takes any size.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx

from tensorgraphs.dtypes import DType
from tensorgraphs.errors import ArgumentError, ShapeError, fail
from tensorgraphs.frontend.tensor import Tensor, as_tensor
from tensorgraphs.nn.module import Module
from tensorgraphs.nn.parameter import Parameter
from tensorgraphs.onnx.dtypes import tg_dtype
from tensorgraphs.onnx.importer import Opsets, run_graph
from tensorgraphs.onnx.lowering import Value, known, tensor
from tensorgraphs.onnx.model import read_model
from tensorgraphs.onnx.names import attribute_name


class OnnxModule(Module):
    """The graph of a ModelProto; forward(*inputs) -> Tensor, or a tuple for several outputs."""

    def __init__(self, model: onnx.ModelProto) -> None:
        super().__init__()
        object.__setattr__(self, "model", model)
        object.__setattr__(self, "opsets", Opsets(model.opset_import))
        graph = model.graph
        taken: set[str] = set()
        names: dict[str, str] = {}
        for initializer in graph.initializer:
            array = onnx.numpy_helper.to_array(initializer)
            dtype = tg_dtype(initializer.data_type, f"initializer {initializer.name!r}")
            names[initializer.name] = attribute_name(initializer.name, taken)
            value = Tensor.from_numpy(array, dtype)
            if dtype.is_floating_point:
                self.register_parameter(names[initializer.name], Parameter(value))
            else:
                self.register_buffer(names[initializer.name], value)
        object.__setattr__(self, "initializer_names", names)
        object.__setattr__(self, "inputs", [i for i in graph.input if i.name not in names])
        object.__setattr__(self, "output_names", [o.name for o in graph.output])

    def forward(self, *args: Any) -> Tensor | tuple[Tensor, ...]:
        if len(args) != len(self.inputs):
            fail("onnx model", f"takes {len(self.inputs)} inputs ({', '.join(i.name for i in self.inputs)}), got "
                 f"{len(args)}", kind=ArgumentError)
        values: dict[str, Value] = {name: _initializer(getattr(self, attribute)) for name, attribute in
                                    self.initializer_names.items()}
        for proto, arg in zip(self.inputs, args):
            values[proto.name] = _input(proto, arg)
        outputs = tuple(tensor(value) for value in run_graph(self.model.graph, values, self.opsets))
        return outputs[0] if len(outputs) == 1 else outputs


def _initializer(value: Tensor) -> Value:
    """A Parameter as itself (gradients reach it); an integer or bool buffer as its current array, known when the
    graph is built (shapes, axes and indices fold; no gradient flows through integers)."""
    return value if value.dtype.is_floating_point else known(value)


def _input(proto: onnx.ValueInfoProto, arg: Any) -> Tensor:
    """`arg` as the tensor input `proto` declares: its element type, its rank and its fixed dims (symbolic and
    unknown dims take any size)."""
    kind = proto.type.WhichOneof("value")
    if kind != "tensor_type":
        fail("onnx model", f"input {proto.name!r} is a {kind}; only tensor inputs are supported", kind=ArgumentError)
    declared = proto.type.tensor_type
    dtype = tg_dtype(declared.elem_type, f"input {proto.name!r}")
    value = arg if isinstance(arg, Tensor) else as_tensor(host_array(proto.name, arg, dtype), dtype)
    if value.dtype is not dtype:
        fail("onnx model", f"input {proto.name!r} must be {dtype}, got {value.dtype}", kind=ArgumentError)
    if declared.HasField("shape"):
        dims = [d.dim_value if d.HasField("dim_value") else None for d in declared.shape.dim]
        if len(dims) != value.ndim or any(d is not None and d != s for d, s in zip(dims, value.shape)):
            shown = tuple(d if d is not None else "?" for d in dims)
            fail("onnx model", f"input {proto.name!r} must have shape {shown}, got {tuple(value.shape)}",
                 kind=ShapeError)
    return value


def host_array(name: str, arg: Any, dtype: DType) -> np.ndarray:
    """`arg` as a numpy array tensorgraphs takes: 8-bit-exponent floats (ml_dtypes' bfloat16) as float32; an
    unsigned type computed in a wider signed one must fit it."""
    array = np.asarray(arg)
    if array.dtype.kind == "V" or array.dtype.name == "bfloat16":
        return array.astype(np.float32)
    if array.dtype.kind == "u" and array.size and array.max() > np.iinfo(dtype.storage).max:
        fail("onnx model", f"input {name!r}: values above {np.iinfo(dtype.storage).max} do not fit {dtype}, in "
             f"which tensorgraphs computes {array.dtype}", kind=ArgumentError)
    return array


def load(model: Any) -> OnnxModule:
    return OnnxModule(read_model(model))
