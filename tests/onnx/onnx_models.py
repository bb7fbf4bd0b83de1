"""Small ONNX models built with onnx.helper, with seeded random weights, shared by the tests of tensorgraphs.onnx."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def mlp(seed: int = 0, batch: str | int = "batch", width: int = 16, classes: int = 4) -> onnx.ModelProto:
    """x (batch, 8) -> Gemm -> Relu -> MatMul + Add -> logits (batch, classes); batch symbolic by default."""
    rng = np.random.default_rng(seed)
    weights = {
        "fc1.weight": rng.standard_normal((width, 8)).astype(np.float32) * 0.3,
        "fc1.bias": rng.standard_normal(width).astype(np.float32) * 0.1,
        "fc2.weight": rng.standard_normal((width, classes)).astype(np.float32) * 0.3,
        "fc2.bias": rng.standard_normal(classes).astype(np.float32) * 0.1,
    }
    nodes = [
        helper.make_node("Gemm", ["x", "fc1.weight", "fc1.bias"], ["h"], transB=1, name="fc1"),
        helper.make_node("Relu", ["h"], ["a"], name="relu"),
        helper.make_node("MatMul", ["a", "fc2.weight"], ["m"], name="fc2"),
        helper.make_node("Add", ["m", "fc2.bias"], ["logits"], name="bias"),
    ]
    graph = helper.make_graph(
        nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 8])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [batch, classes])],
        [numpy_helper.from_array(v, k) for k, v in weights.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def cnn(seed: int = 0) -> onnx.ModelProto:
    """x (batch, 1, 8, 8) -> Conv 3x3 pad 1 -> Relu -> MaxPool 2 -> Flatten -> Gemm -> logits (batch, 3)."""
    rng = np.random.default_rng(seed)
    weights = {
        "conv.weight": rng.standard_normal((4, 1, 3, 3)).astype(np.float32) * 0.3,
        "conv.bias": rng.standard_normal(4).astype(np.float32) * 0.1,
        "fc.weight": rng.standard_normal((3, 64)).astype(np.float32) * 0.1,
        "fc.bias": rng.standard_normal(3).astype(np.float32) * 0.1,
    }
    nodes = [
        helper.make_node("Conv", ["x", "conv.weight", "conv.bias"], ["c"], pads=[1, 1, 1, 1], kernel_shape=[3, 3]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Flatten", ["p"], ["f"]),
        helper.make_node("Gemm", ["f", "fc.weight", "fc.bias"], ["logits"], transB=1),
    ]
    graph = helper.make_graph(
        nodes, "cnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 1, 8, 8])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 3])],
        [numpy_helper.from_array(v, k) for k, v in weights.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
