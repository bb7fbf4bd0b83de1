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


def conv_bn_block(seed: int = 0, channels: int = 8, inputs: int = 4) -> onnx.ModelProto:
    """x (batch, inputs, 12, 12) -> Conv 3x3 pad 1 -> BatchNormalization -> Relu -> MaxPool 3x3/2 pad 1 ->
    depthwise Conv 3x3 pad 1 -> BatchNormalization -> Relu -> AveragePool 3x3/2 pad 1 -> y (batch, channels, 3, 3):
    the windows of ResNet's stem and ShuffleNet's units."""
    rng = np.random.default_rng(seed)
    weights = {"conv.weight": rng.standard_normal((channels, inputs, 3, 3)).astype(np.float32) * 0.3,
               "conv.bias": rng.standard_normal(channels).astype(np.float32) * 0.1,
               "dw.weight": rng.standard_normal((channels, 1, 3, 3)).astype(np.float32) * 0.3}
    for name in ("bn1", "bn2"):
        weights[f"{name}.scale"] = rng.uniform(0.5, 1.5, channels).astype(np.float32)
        weights[f"{name}.bias"] = rng.standard_normal(channels).astype(np.float32) * 0.1
        weights[f"{name}.mean"] = rng.standard_normal(channels).astype(np.float32) * 0.1
        weights[f"{name}.var"] = rng.uniform(0.5, 1.5, channels).astype(np.float32)
    window = {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}
    nodes = [
        helper.make_node("Conv", ["x", "conv.weight", "conv.bias"], ["c"], pads=[1, 1, 1, 1], kernel_shape=[3, 3]),
        helper.make_node("BatchNormalization", ["c", "bn1.scale", "bn1.bias", "bn1.mean", "bn1.var"], ["n"]),
        helper.make_node("Relu", ["n"], ["r"]),
        helper.make_node("MaxPool", ["r"], ["p"], **window),
        helper.make_node("Conv", ["p", "dw.weight"], ["d"], pads=[1, 1, 1, 1], kernel_shape=[3, 3], group=channels),
        helper.make_node("BatchNormalization", ["d", "bn2.scale", "bn2.bias", "bn2.mean", "bn2.var"], ["m"]),
        helper.make_node("Relu", ["m"], ["s"]),
        helper.make_node("AveragePool", ["s"], ["y"], **window),
    ]
    graph = helper.make_graph(
        nodes, "conv_bn_block", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", inputs, 12, 12])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", channels, 3, 3])],
        [numpy_helper.from_array(v, k) for k, v in weights.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def conv_residual_block(seed: int = 0, channels: int = 8) -> onnx.ModelProto:
    """x (batch, channels, h, w) -> Conv 3x3 pad 1 -> Relu -> Conv 3x3 pad 1 -> Add x -> Relu -> y: a ResNet basic
    block with its batch norms folded into the convs, as exported models have them."""
    rng = np.random.default_rng(seed)
    weights = {f"conv{i}.{part}": rng.standard_normal(shape).astype(np.float32) * scale for i in (1, 2)
               for part, shape, scale in (("weight", (channels, channels, 3, 3), 0.2), ("bias", (channels,), 0.1))}
    conv = {"pads": [1, 1, 1, 1], "kernel_shape": [3, 3]}
    nodes = [
        helper.make_node("Conv", ["x", "conv1.weight", "conv1.bias"], ["c1"], **conv),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "conv2.weight", "conv2.bias"], ["c2"], **conv),
        helper.make_node("Add", ["c2", "x"], ["s"]),
        helper.make_node("Relu", ["s"], ["y"]),
    ]
    shape = ["batch", channels, "h", "w"]
    graph = helper.make_graph(
        nodes, "conv_residual_block", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)],
        [numpy_helper.from_array(v, k) for k, v in weights.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
