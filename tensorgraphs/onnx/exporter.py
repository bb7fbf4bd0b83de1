"""`tg.onnx.export`: a module or function, traced on example inputs, written as an ONNX model.

The traced graph's primitives map one to one onto ONNX ops (integer DIV, a floor division, as the exact
(a - Mod(a, b)) / b); matmul, conv2d, softmax and log_softmax become MatMul, Conv, Softmax and LogSoftmax; other
composites are written as their decompositions. Parameters and buffers are initializers under their module
names. A dynamic axis is found by tracing once more with that axis one larger: a shape argument that changes
with it (as a * size + b) is computed from the input's Shape in the model; anything else that changes fails.
"""

from __future__ import annotations

import math
import os
from typing import Any, Callable, Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from tensorgraphs.errors import ArgumentError, UnsupportedError, fail
from tensorgraphs.frontend.grad_mode import no_grad
from tensorgraphs.frontend.tensor import Tensor
from tensorgraphs.graph.composite import decompose, is_composite, params_of
from tensorgraphs.graph.node import Node, toposort
from tensorgraphs.graph.ops import Op
from tensorgraphs.nn.module import Module
from tensorgraphs.onnx.dtypes import element_type

OPSET = 18
OP = "onnx.export"
DIRECT = {"matmul", "conv2d", "softmax", "log_softmax"}
SIMPLE = {Op.SIN: "Sin", Op.SQRT: "Sqrt", Op.ADD: "Add", Op.MUL: "Mul", Op.MAX: "Max", Op.CMPLT: "Less",
          Op.WHERE: "Where", Op.MOD: "Mod"}
LOGIC = {Op.AND: ("And", "BitwiseAnd"), Op.OR: ("Or", "BitwiseOr"), Op.XOR: ("Xor", "BitwiseXor")}
DynamicAxis = tuple[int, int]  # (input position, axis)


def trace(target: Callable[..., Any], arrays: Sequence[np.ndarray]) -> tuple[list[Node], list[Node]]:
    """The input leaves and output roots of the graph `target(*arrays)` builds."""
    leaves = [Tensor.from_numpy(a) for a in arrays]
    with no_grad():
        out = target(*leaves)
    outputs = out if isinstance(out, (tuple, list)) else (out,)
    if not all(isinstance(t, Tensor) for t in outputs):
        fail(OP, "the function must return a Tensor or a tuple of Tensors", kind=ArgumentError)
    return [t.node for t in leaves], [t.node for t in outputs]


class Emitter:
    """Writes the nodes of one trace as ONNX nodes. Integer arguments go through `ints`: recorded in a first
    pass over each grown trace, compared with them in the writing pass (`grown`: one list per dynamic axis)."""

    def __init__(self, inputs: list[Node], input_names: list[str], names: dict[Node, str],
                 dynamic: list[DynamicAxis], grown: list[list[tuple]] | None, traced_sizes: list[int]) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[TensorProto] = []
        self.names = dict(zip(inputs, input_names))
        self.parameter_names = names
        self.input_names, self.dynamic, self.grown = input_names, dynamic, grown
        self.traced_sizes = traced_sizes
        self.recorded: list[tuple] = []
        self.count = 0

    def fresh(self, hint: str) -> str:
        self.count += 1
        return f"{hint}_{self.count}"

    def add(self, op_type: str, inputs: list[str], **attributes: Any) -> str:
        out = self.fresh(op_type.lower())
        self.nodes.append(helper.make_node(op_type, inputs, [out], **attributes))
        return out

    def constant(self, array: np.ndarray, hint: str = "const") -> str:
        name = self.fresh(hint)
        self.initializers.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def ints(self, values: Sequence[int], dynamic_ok: bool) -> str:
        """An int64 tensor input holding `values`; entries that grow with a dynamic axis are computed."""
        values = tuple(int(v) for v in values)
        index = len(self.recorded)
        self.recorded.append(values)
        if self.grown is None:
            return self.constant(np.asarray(values, np.int64), "ints")
        parts, changed = [], False
        for position, value in enumerate(values):
            deltas = [grown[index][position] - value for grown in self.grown]
            moving = [i for i, d in enumerate(deltas) if d]
            if not moving:
                parts.append(self.constant(np.asarray([value], np.int64), "ints"))
                continue
            if len(moving) > 1 or not dynamic_ok:
                fail(OP, f"an argument {values} depends on the dynamic axes in a way the exporter cannot write "
                     "(only shapes linear in one dynamic axis are)", kind=UnsupportedError)
            changed = True
            parts.append(self.dim(moving[0], deltas[moving[0]], value))
        return self.add("Concat", parts, axis=0) if changed else self.constant(np.asarray(values, np.int64))

    def dim(self, which: int, slope: int, value: int) -> str:
        """slope * size + offset for dynamic axis `which`, whose traced size gives `value`."""
        position, axis = self.dynamic[which]
        size = self.add("Gather", [self.add("Shape", [self.input_names[position]]),
                                   self.constant(np.asarray([axis], np.int64))], axis=0)
        traced = self.traced_sizes[which]
        offset = value - slope * traced
        scaled = self.add("Mul", [size, self.constant(np.asarray([slope], np.int64))]) if slope != 1 else size
        return self.add("Add", [scaled, self.constant(np.asarray([offset], np.int64))]) if offset else scaled

    def emit(self, root: Node) -> str:
        for node in toposort([root], stop=self.names.__contains__):
            if node not in self.names:
                self.names[node] = self.write(node)
        return self.names[root]

    def write(self, node: Node) -> str:
        if is_composite(node):
            return self.write_composite(node)
        src = [self.emit(s) for s in node.src]
        op = node.op
        if op is Op.BUFFER:
            name = self.parameter_names.get(node) or self.fresh("constant")
            self.initializers.append(numpy_helper.from_array(np.asarray(node.arg.data), name))
            return name
        if op is Op.CONST:
            value = np.asarray(node.arg, dtype=node.dtype.storage)
            return self.add("Expand", [self.constant(value), self.ints(node.shape, True)])
        if op is Op.IOTA:
            length = self.ints(node.shape, True)
            start, step = self.constant(np.asarray(0, np.int64)), self.constant(np.asarray(1, np.int64))
            limit = self.add("Squeeze", [length])
            return self.add("Cast", [self.add("Range", [start, limit, step])], to=element_type(node.dtype))
        if op in SIMPLE:
            return self.add(SIMPLE[op], src, **({"fmod": 0} if op is Op.MOD else {}))
        if op in LOGIC:
            return self.add(LOGIC[op][0 if node.dtype.is_bool else 1], src)
        if op is Op.EXP2:
            return self.add("Pow", [self.constant(np.asarray(2, node.dtype.storage)), src[0]])
        if op is Op.LOG2:
            return self.add("Div", [self.add("Log", src), self.constant(np.asarray(math.log(2), node.dtype.storage))])
        if op is Op.CAST:
            return self.add("Cast", src, to=element_type(node.dtype))
        if op is Op.CMPNE:
            return self.add("Not", [self.add("Equal", src)])
        if op is Op.DIV:
            if node.dtype.is_floating_point:
                return self.add("Div", src)
            return self.add("Div", [self.add("Sub", [src[0], self.add("Mod", src, fmod=0)]), src[1]])
        if op in (Op.REDUCE_SUM, Op.REDUCE_MAX):
            kind = "ReduceSum" if op is Op.REDUCE_SUM else "ReduceMax"
            return self.add(kind, [src[0], self.ints(node.arg, False)], keepdims=1)
        if op is Op.RESHAPE:
            return self.add("Reshape", [src[0], self.ints(node.arg, True)])
        if op is Op.PERMUTE:
            return self.add("Transpose", src, perm=list(node.arg))
        if op is Op.EXPAND:
            return self.add("Expand", [src[0], self.ints(node.arg, True)])
        if op is Op.PAD:
            widths = [w[0] for w in node.arg] + [w[1] for w in node.arg]
            return self.add("Pad", [src[0], self.ints(widths, False)])
        if op is Op.SHRINK:
            return self.add("Slice", [src[0], self.ints([b[0] for b in node.arg], False),
                                      self.ints([b[1] for b in node.arg], True)])
        if op is Op.FLIP:
            axes = list(node.arg)
            return self.add("Slice", [src[0], self.ints([-1] * len(axes), False),
                                      self.ints([-(2**63 - 1)] * len(axes), False), self.ints(axes, False),
                                      self.ints([-1] * len(axes), False)])
        if op is Op.GATHER:
            return self.add("GatherElements", src, axis=node.arg)
        if op is Op.SCATTER_ADD:
            return self.add("ScatterElements", src, axis=node.arg, reduction="add")
        if op is Op.COPY:
            return self.add("Identity", src)
        return fail(OP, f"{op.name} has no ONNX counterpart (a traced function must not assign in place)",
                    kind=UnsupportedError)

    def write_composite(self, node: Node) -> str:
        name = node.op.name
        if name not in DIRECT:
            return self.emit(decompose(node))
        src = [self.emit(s) for s in node.src]
        params = params_of(node)
        if name == "matmul":
            return self.add("MatMul", src)
        if name in ("softmax", "log_softmax"):
            return self.add("Softmax" if name == "softmax" else "LogSoftmax", src, axis=params["dim"])
        pads = [p[0] for p in params["padding"]] + [p[1] for p in params["padding"]]
        return self.add("Conv", src, strides=list(params["stride"]), dilations=list(params["dilation"]),
                        pads=pads, group=params["groups"])


def _parameter_names(target: Any) -> dict[Node, str]:
    module = target if isinstance(target, Module) else getattr(target, "__self__", None)
    if not isinstance(module, Module):
        return {}
    named = {**dict(module.named_buffers()), **dict(module.named_parameters())}
    return {tensor.node: name for name, tensor in named.items()}


def export(target: Callable[..., Any], example_args: Sequence[Any], path: str | os.PathLike | None = None, *,
           input_names: Sequence[str] | None = None, output_names: Sequence[str] | None = None,
           dynamic_axes: dict[str, dict[int, str] | list[int]] | None = None,
           opset_version: int = OPSET) -> onnx.ModelProto:
    """Trace `target` (a module or function) on `example_args` and write it to `path` (also returned)."""
    arrays = [a.detach().numpy() if isinstance(a, Tensor) else np.asarray(a) for a in example_args]
    input_names = list(input_names or [f"input_{i}" for i in range(len(arrays))])
    dynamic_axes = dynamic_axes or {}
    unknown = sorted(set(dynamic_axes) - set(input_names) - set(output_names or []))
    if unknown:
        fail(OP, f"dynamic_axes names {unknown}, which are neither inputs nor outputs", kind=ArgumentError)
    symbols = {name: (axes if isinstance(axes, dict) else {a: f"{name}_{a}" for a in axes})
               for name, axes in dynamic_axes.items()}
    dynamic = [(input_names.index(n), a) for n, axes in symbols.items() if n in input_names for a in axes]
    inputs, outputs = trace(target, arrays)
    names = _parameter_names(target)
    sizes = [arrays[p].shape[a] for p, a in dynamic]
    grown_records = []
    for position, axis in dynamic:
        bigger = [np.concatenate([a, a.take([0], axis)], axis) if i == position else a for i, a in enumerate(arrays)]
        grown_inputs, grown_outputs = trace(target, bigger)
        recorder = Emitter(grown_inputs, input_names, names, dynamic, None, sizes)
        for root in grown_outputs:
            recorder.emit(root)
        grown_records.append(recorder.recorded)
    emitter = Emitter(inputs, input_names, names, dynamic, grown_records if dynamic else None, sizes)
    roots = [emitter.emit(root) for root in outputs]
    output_names = list(output_names or [f"output_{i}" for i in range(len(outputs))])
    emitter.nodes += [helper.make_node("Identity", [r], [n]) for r, n in zip(roots, output_names)]

    def info(name: str, node: Node) -> onnx.ValueInfoProto:
        axes = symbols.get(name, {})
        return helper.make_tensor_value_info(name, element_type(node.dtype),
                                             [axes.get(i, d) for i, d in enumerate(node.shape)])

    graph = helper.make_graph(emitter.nodes, "tensorgraphs", [info(n, x) for n, x in zip(input_names, inputs)],
                              [info(n, x) for n, x in zip(output_names, outputs)], emitter.initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset_version)],
                              producer_name="tensorgraphs")
    onnx.checker.check_model(model)
    if path is not None:
        onnx.save(model, os.fspath(path))
    return model
