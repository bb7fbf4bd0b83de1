"""A ResNet basic block from ONNX (Conv, Relu, Conv, Add, Relu): values against ONNX Runtime, and the relu after the
Add run by the second conv's epilogue, no pass of its own (gemm.h's TG_ACT_AFTER_RESIDUAL)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx_models import conv_residual_block

import tensorgraphs as tg
from tensorgraphs.codegen.loop_ir import ConvCall
from tensorgraphs.schedule import schedule_kernels
from tensorgraphs.schedule.extern import gemm_enabled

ort = pytest.importorskip("onnxruntime")


@pytest.mark.parametrize("shape", [(1, 8, 12, 12), (3, 8, 7, 7), (2, 8, 40, 36)], ids=["one", "merged", "large"])
def test_conv_add_relu_matches_onnxruntime(shape: tuple[int, ...]) -> None:
    model = conv_residual_block()
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    x[0, 0, 0, :3] = [np.nan, np.inf, -np.inf]  # the residual's: relu(NaN) is NaN, relu(-inf) 0 and so on
    (expected,) = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x})
    module = tg.onnx.load(model).requires_grad_(False)
    got = tg.compile(module.forward)(tg.tensor(x)).numpy()
    np.testing.assert_array_equal(np.isnan(got), np.isnan(expected))
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(not gemm_enabled(), reason="the conv kernel (its epilogue) needs the GEMM library")
def test_the_relu_after_the_add_is_the_second_convs_epilogue() -> None:
    module = tg.onnx.load(conv_residual_block()).requires_grad_(False)
    x = np.random.default_rng(2).standard_normal((2, 8, 9, 9)).astype(np.float32)
    kernels = schedule_kernels([module(tg.tensor(x)).node]).kernels
    first, second = (s for k in kernels for s in k.body if isinstance(s, ConvCall))
    assert len(kernels) == 2, kernels
    assert (first.activation, first.activation_after_residual, first.residual) == ("relu", False, None)
    assert second.activation == "relu" and second.activation_after_residual and second.residual is not None
