"""ONNX's MatMulInteger with a constant int8 B runs on the int8 GEMM (weights packed once, at import) and agrees
with the exact integer product (numpy, int64): onnxruntime is no oracle here, as its u8 x s8 kernel for AVX2
(MLAS, VPMADDUBSW) saturates pairs of products in int16 on a machine without VNNI."""

from __future__ import annotations

import numpy as np
import pytest

import tensorgraphs as tg
from tensorgraphs.graph.node import toposort
from tensorgraphs.kernels.gemm import int8

onnx = pytest.importorskip("onnx")
pytestmark = pytest.mark.skipif(not int8.available(), reason="needs AVX2 (or AVX-512) and a C compiler")


def _model(b: np.ndarray, a_type: int, a_zero: np.ndarray | None) -> onnx.ModelProto:
    from onnx import TensorProto, helper, numpy_helper

    inputs = ["a", "B"] + (["a_zero"] if a_zero is not None else [])
    initializers = [numpy_helper.from_array(b, "B")]
    initializers += [numpy_helper.from_array(a_zero, "a_zero")] if a_zero is not None else []
    graph = helper.make_graph([helper.make_node("MatMulInteger", inputs, ["y"])], "matmul_integer",
                              [helper.make_tensor_value_info("a", a_type, ["n", b.shape[0]])],
                              [helper.make_tensor_value_info("y", TensorProto.INT32, ["n", b.shape[1]])],
                              initializers)
    return onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 13)])


@pytest.mark.parametrize(("dtype", "a_zero"), [(np.uint8, np.array(7, np.uint8)), (np.uint8, None),
                                                (np.int8, np.array(-3, np.int8))])
def test_matmul_integer_with_constant_weights_runs_on_the_int8_gemm(dtype, a_zero):
    rng = np.random.default_rng(0)
    b = rng.integers(-128, 128, (33, 70), dtype=np.int8)
    a = rng.integers(np.iinfo(dtype).min, np.iinfo(dtype).max + 1, (9, 33), dtype=dtype)
    model = _model(b, onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype)), a_zero)
    expected = (a.astype(np.int64) - (0 if a_zero is None else int(a_zero))) @ b.astype(np.int64)
    module = tg.onnx.load(model)
    result = module(a)
    assert "matmul_integer" in {node.op.name for node in toposort([result.node])}
    np.testing.assert_array_equal(result.numpy(), expected)
    np.testing.assert_array_equal(tg.compile(module)(tg.tensor(a)).numpy(), expected)
