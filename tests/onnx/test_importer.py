"""The importer folds what a model computes from shapes and constants into known values, so a symbolic batch
dim flows through Shape -> Gather -> Concat -> Reshape, eagerly and under tg.compile."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import tensorgraphs as tg  # noqa: E402


def flatten_by_shape() -> onnx.ModelProto:
    """y = Reshape(x, Concat(Shape(x)[0], [-1])) * 2: the shape is computed inside the model."""
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Gather", ["shape", "zero"], ["batch"], axis=0),
        helper.make_node("Unsqueeze", ["batch", "zero"], ["batch_1d"]),
        helper.make_node("Concat", ["batch_1d", "minus_one"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["flat"]),
        helper.make_node("Mul", ["flat", "two"], ["y"]),
    ]
    initializers = [numpy_helper.from_array(np.asarray(0, np.int64), "zero"),
                    numpy_helper.from_array(np.asarray([-1], np.int64), "minus_one"),
                    numpy_helper.from_array(np.asarray(2.0, np.float32), "two")]
    graph = helper.make_graph(nodes, "flatten", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 12])], initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


@pytest.mark.parametrize("batch", [2, 7])
def test_shapes_computed_in_the_model_follow_the_batch(batch: int) -> None:
    model = flatten_by_shape()
    x = np.random.default_rng(batch).standard_normal((batch, 3, 4)).astype(np.float32)
    expected = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    module = tg.onnx.load(model)
    np.testing.assert_allclose(module(x).detach().numpy(), expected[0], rtol=1e-6)
    compiled = tg.compile(module)
    np.testing.assert_allclose(compiled(tg.tensor(x)).detach().numpy(), expected[0], rtol=1e-6)


def test_integer_initializers_are_buffers_and_fold() -> None:
    module = tg.onnx.load(flatten_by_shape())
    assert {name for name, _ in module.named_buffers()} == {"zero", "minus_one"}
    assert [name for name, _ in module.named_parameters()] == ["two"]
