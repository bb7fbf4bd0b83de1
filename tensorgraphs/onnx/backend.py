"""The standard ONNX backend interface (`onnx.backend.base`), as `onnxruntime.backend` offers it: a model is
loaded as a module (`tensorgraphs.onnx.module`) and run on the cpu device, which compiles its graph to C (small
graphs are interpreted; see `CpuBackend.interpret_below`)."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import onnx
from onnx.backend.base import Backend, BackendRep

from tensorgraphs.errors import UnsupportedError, fail
from tensorgraphs.frontend.grad_mode import no_grad
from tensorgraphs.frontend.tensor import Tensor
from tensorgraphs.onnx.dtypes import numpy_dtype
from tensorgraphs.onnx.module import OnnxModule, load
from tensorgraphs.runtime.realize import device, realize

DEVICE = "cpu"


class TensorgraphsRep(BackendRep):
    """A prepared model: `run(inputs)` gives its outputs as numpy arrays."""

    def __init__(self, module: OnnxModule, device_name: str = DEVICE) -> None:
        self.module, self.device = module, device_name

    def run(self, inputs: Any, **kwargs: Any) -> tuple[np.ndarray, ...]:
        arrays = _ordered(self.module, inputs)
        with no_grad(), device(self.device):
            outputs = self.module(*arrays)
            outputs = outputs if isinstance(outputs, tuple) else (outputs,)
            values = realize([t.node for t in outputs])
        declared = [numpy_dtype(o.type.tensor_type.elem_type) for o in self.module.model.graph.output]
        return tuple(np.asarray(v).astype(d) if v.dtype != d else np.asarray(v).copy()
                     for v, d in zip(values, declared))


def _ordered(module: OnnxModule, inputs: Any) -> list[Any]:
    """The graph inputs in order, from a list, a single array or a dict by name."""
    if isinstance(inputs, dict):
        return [inputs[proto.name] for proto in module.inputs]
    if isinstance(inputs, (np.ndarray, Tensor)):
        return [inputs]
    return list(inputs)


class TensorgraphsBackend(Backend):
    @classmethod
    def is_compatible(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> bool:
        return cls.supports_device(device)

    @classmethod
    def prepare(cls, model: onnx.ModelProto | str, device: str = "CPU", **kwargs: Any) -> TensorgraphsRep:
        if not cls.supports_device(device):
            fail("onnx backend", f"device {device!r} is not supported; tensorgraphs runs ONNX models on 'CPU'",
                 kind=UnsupportedError)
        return TensorgraphsRep(load(model))

    @classmethod
    def run_model(cls, model: onnx.ModelProto, inputs: Any, device: str = "CPU",
                  **kwargs: Any) -> tuple[np.ndarray, ...]:
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def run_node(cls, node: onnx.NodeProto, inputs: Sequence[Any], device: str = "CPU",
                 outputs_info: Sequence[tuple[Any, tuple]] | None = None, **kwargs: Any) -> tuple[np.ndarray, ...]:
        """One node as a model of its own: its inputs' types and shapes from `inputs`, its outputs' inferred (else
        the first input's type)."""
        arrays = [np.asarray(a) for a in inputs]
        graph_inputs = [onnx.helper.make_tensor_value_info(name, onnx.helper.np_dtype_to_tensor_dtype(a.dtype),
                                                           a.shape) for name, a in zip(node.input, arrays) if name]
        opset = kwargs.get("opset_version", onnx.defs.onnx_opset_version())
        imports = [onnx.helper.make_opsetid(node.domain, opset)]
        probe = onnx.helper.make_model(onnx.helper.make_graph([node], "run_node", graph_inputs, []),
                                       opset_imports=imports)
        inferred = {v.name: v for v in onnx.shape_inference.infer_shapes(probe).graph.value_info}
        fallback = graph_inputs[0].type.tensor_type.elem_type if graph_inputs else onnx.TensorProto.FLOAT
        graph_outputs = [inferred.get(name) or onnx.helper.make_tensor_value_info(name, fallback, None)
                         for name in node.output if name]
        graph = onnx.helper.make_graph([node], "run_node", graph_inputs, graph_outputs)
        model = onnx.helper.make_model(graph, opset_imports=imports)
        return cls.run_model(model, [a for name, a in zip(node.input, arrays) if name], device)

    @classmethod
    def supports_device(cls, device: str) -> bool:
        return device.upper().split(":")[0] == "CPU"


prepare = TensorgraphsBackend.prepare
run_model = TensorgraphsBackend.run_model
run_node = TensorgraphsBackend.run_node
supports_device = TensorgraphsBackend.supports_device
