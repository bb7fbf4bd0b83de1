"""Batch norms after convolutions and the windows reading them (ResNet's stem, ShuffleNet's units): values against
ONNX Runtime, and the structure that makes them fast (folded scales, one buffer per window input, unchecked
interiors), so it cannot silently regress."""

from __future__ import annotations

import numpy as np
import pytest
from onnx_models import conv_bn_block

import tensorgraphs as tg
from tensorgraphs.codegen.loop_ir import ConvCall, Let, Loop, walk
from tensorgraphs.graph.ops import Op
from tensorgraphs.schedule import schedule_kernels
from tensorgraphs.schedule.extern import gemm_enabled

ort = pytest.importorskip("onnxruntime")


def _inputs(batch: int, channels: int = 4) -> np.ndarray:
    return np.random.default_rng(batch).standard_normal((batch, channels, 12, 12)).astype(np.float32)


@pytest.mark.parametrize("batch", [1, 3])
def test_conv_batch_norm_pool_depthwise_block_matches_onnxruntime(batch: int) -> None:
    model, x = conv_bn_block(), _inputs(batch)
    (expected,) = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x})
    forward = tg.compile(tg.onnx.load(model).requires_grad_(False).forward)
    np.testing.assert_allclose(forward(tg.tensor(x)).numpy(), expected, rtol=1e-5, atol=1e-5)


def _kernels(inputs: int = 4) -> list:
    module = tg.onnx.load(conv_bn_block(inputs=inputs)).requires_grad_(False)
    return schedule_kernels([module(tg.tensor(_inputs(1, inputs))).node]).kernels


def _lets(kernels: list, op: Op | str) -> int:
    return sum(isinstance(s, Let) and s.op == op for k in kernels for s in walk(k.body))


@pytest.mark.skipif(not gemm_enabled(), reason="the conv kernel (its epilogue) needs the GEMM library")
def test_batch_norm_folds_into_the_conv_and_each_relu_runs_once_per_element() -> None:
    """The first batch norm scales the conv's weights and shifts its bias, so the call applies it and the relu; the
    depthwise conv's batch norm and relu, read by the average pool's nine taps, get a buffer (one relu compare in
    one kernel computes a relu); the max pool stays selections only, its and the average pool's column results
    staged in the kernel reading them (separable windows: one kernel each)."""
    kernels = _kernels()
    (call,) = [s for k in kernels for s in k.body if isinstance(s, ConvCall)]
    assert call.bias is not None and call.activation == "relu"
    (relu,) = [k for k in kernels if _lets([k], Op.CMPLT)]
    assert kernels[-1] is not relu and len(kernels) == 5


@pytest.mark.skipif(not gemm_enabled(), reason="the conv kernel (its epilogue) needs the GEMM library")
def test_batch_norm_stays_a_pass_where_the_weights_outweigh_the_output() -> None:
    """32 input channels: the conv's weights (8 x 32 x 3 x 3) are larger than its output (8 x 12 x 12), so the batch
    norm stays a pass over the output (scaling the weights would read and write more)."""
    kernels = _kernels(inputs=32)
    (call,) = [s for k in kernels for s in k.body if isinstance(s, ConvCall)]
    assert call.activation == "none" and len([k for k in kernels if _lets([k], Op.CMPLT)]) == 2


def _innermost_loops(body: list, trips: int = 1):
    """(loop, how often its body runs) for every loop without loops inside."""
    for stmt in body:
        if isinstance(stmt, Loop):
            inner = list(_innermost_loops(stmt.body, trips * stmt.var.extent))
            yield from inner or [(stmt, trips * stmt.var.extent)]


def test_padded_windows_read_their_interior_without_checks() -> None:
    """The depthwise conv's and the pools' loops are cut where the padding ends: the innermost loop that runs most
    reads without bounds checks or selects (so it vectorizes); only the borders check."""
    for kernel in _kernels():
        if not any(isinstance(s, Let) and s.op == "in_range" for s in walk(kernel.body)):
            continue
        busiest, _ = max(_innermost_loops(kernel.body), key=lambda loop_trips: loop_trips[1])
        assert not any(isinstance(s, Let) and s.op in ("in_range", "zero_unless") for s in walk(busiest.body)), kernel


@pytest.mark.parametrize("op,attributes", [
    ("MaxPool", {"kernel_shape": [200], "strides": [10], "pads": [100, 100], "dilations": [10]}),
    ("MaxPool", {"kernel_shape": [9, 8], "strides": [1, 3], "pads": [4, 2, 4, 3], "storage_order": 1}),
    ("AveragePool", {"kernel_shape": [9, 8], "strides": [2, 1], "pads": [4, 2, 4, 3], "ceil_mode": 1}),
    ("LpPool", {"kernel_shape": [150], "strides": [7], "pads": [3, 70]}),
    ("MaxPool", {"kernel_shape": [3, 3], "strides": [1, 1], "pads": [1, 1, 1, 1]}),
    ("MaxPool", {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1, "dilations": [1, 2]}),
    ("AveragePool", {"kernel_shape": [3, 3], "strides": [1, 1], "pads": [1, 1, 1, 1], "count_include_pad": 1}),
    ("AveragePool", {"kernel_shape": [3, 2], "strides": [2, 1], "pads": [1, 0, 1, 1]}),
])
def test_pools_match_onnxruntime(op: str, attributes: dict) -> None:
    """Short windows as chains of their taps' views, windows of more than LONG_WINDOW_TAPS taps by doubling: the
    same values and MaxPool's first-maximum indices (column-major with storage_order), from a graph of a few
    hundred nodes rather than one per tap."""
    from onnx import TensorProto, helper

    spatial = [2200] if len(attributes["kernel_shape"]) == 1 else [12, 13]
    dims = ["n", "c", *(f"out{i}" for i in range(len(spatial)))]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, dims)]
    if op == "MaxPool":
        outputs.append(helper.make_tensor_value_info("i", TensorProto.INT64, dims))
    node = helper.make_node(op, ["x"], [o.name for o in outputs], **attributes)
    graph = helper.make_graph([node], "pool", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, *spatial])],
                              outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    x = np.round(np.random.default_rng(5).standard_normal((2, 3, *spatial)) * 2).astype(np.float32) / 2
    expected = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    got = tg.onnx.load(model)(tg.tensor(x))
    got = got if isinstance(got, tuple) else (got,)
    for ours, theirs in zip(got, expected, strict=True):
        np.testing.assert_allclose(ours.numpy(), theirs, rtol=1e-5, atol=1e-5)
    assert len(got[-1].node.toposort()) < 400
