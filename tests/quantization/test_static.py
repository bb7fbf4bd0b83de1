"""Static post-training quantization: observers against torch's MinMaxObserver, prepare / calibrate / convert, and
converted layers within quantization error of the float model, compiled and eager."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tensorgraphs as tg
from tensorgraphs.kernels.gemm import int8

pytestmark = [pytest.mark.skipif(not int8.available(), reason="needs AVX2 (or AVX-512) and a C compiler"),
              pytest.mark.filterwarnings("ignore::UserWarning")]  # torch deprecates its observers' reduce_range


@pytest.mark.parametrize("batches", [[(3.0, 0.5)], [(1.0, 2.0), (0.1, 7.0)], [(0.0, 1.0)]])
@pytest.mark.parametrize("reduce_range", [False, True])
def test_observer_matches_torch(batches, reduce_range):
    observer = tg.quantization.MinMaxObserver(reduce_range=reduce_range)
    reference = torch.ao.quantization.MinMaxObserver(reduce_range=reduce_range)
    rng = np.random.default_rng(0)
    for spread, shift in batches:
        x = (rng.standard_normal((7, 13)) * spread + shift).astype(np.float32)
        observer(tg.tensor(x))
        reference(torch.from_numpy(x))
    scale, zero_point = reference.calculate_qparams()
    assert observer.calculate_qparams() == (scale.item(), zero_point.item())


def _model(seed: int) -> tg.nn.Module:
    tg.manual_seed(seed)
    return tg.nn.Sequential(tg.nn.Linear(37, 70), tg.nn.ReLU(), tg.nn.Linear(70, 5))


@pytest.mark.parametrize("compiled", [False, True])
@pytest.mark.parametrize("reduce_range", [None, False, True])
def test_prepare_calibrate_convert(compiled, reduce_range):
    """reduce_range None: [0, 127] where the machine lacks VNNI (`default_reduce_range`)."""
    model = _model(1)
    prepared = tg.quantization.prepare(model, reduce_range=reduce_range)
    reduced = not int8.vnni() if reduce_range is None else reduce_range
    expected_max = 127 if reduced else 255
    assert prepared[0].activation_post_process.quant_max == expected_max
    assert isinstance(model[0], tg.nn.Linear)  # a copy
    rng = np.random.default_rng(2)
    for _ in range(4):
        prepared(tg.tensor(rng.standard_normal((16, 37)).astype(np.float32)))
    quantized = tg.quantization.convert(prepared)
    assert [type(m).__name__ for m in quantized] == ["StaticQuantizedLinear", "ReLU", "StaticQuantizedLinear"]
    first_qparams = prepared[0].activation_post_process.calculate_qparams()
    assert quantized[0].activation_qparams == first_qparams and quantized[0].quant_max == expected_max
    x = tg.tensor(rng.standard_normal((8, 37)).astype(np.float32) * 1.5)  # some beyond the calibrated range
    run = tg.compile(lambda x: quantized(x)) if compiled else quantized
    got = run(x).numpy()
    np.testing.assert_allclose(got, _fake_quantized(quantized, x.numpy()), rtol=1e-4, atol=1e-5)
    with tg.device("numpy"):  # the reference decomposition: the kernel agrees bit for bit
        np.testing.assert_array_equal(got, quantized(x).numpy())


def _fake_quantized(model: tg.nn.Module, x: np.ndarray) -> np.ndarray:
    """The converted model in float64 on dequantized values: activations clipped to the calibrated range."""
    for layer in model:
        if isinstance(layer, tg.nn.ReLU):
            x = np.maximum(x, 0)
            continue
        scale, zero_point = layer.activation_qparams
        q = np.rint(x.astype(np.float32) * (np.float32(1) / np.float32(scale)) + zero_point)
        q = np.clip(q, 0, layer.quant_max)
        weights = layer.weight().dequantize().numpy().astype(np.float64)
        x = (q - zero_point) * scale @ weights.T + layer.bias.numpy()
    return x


def test_convert_before_calibration_says_so():
    with pytest.raises(tg.TGError, match="saw no data: run the prepared model"):
        tg.quantization.convert(tg.quantization.prepare(_model(3)))


def test_static_kernel_matches_oracle():
    rng = np.random.default_rng(4)
    x = (rng.standard_normal((9, 40)) * 2).astype(np.float32)
    w = rng.integers(-128, 128, (20, 40), dtype=np.int8)
    w_scale = rng.uniform(0.001, 0.02, 20).astype(np.float32)
    packed, colsum = int8.pack_weights(w)
    scale, zero_point = np.float32(0.02), 100
    t = (x * (np.float32(1) / scale)).astype(np.float32) + np.float32(zero_point)
    q = np.clip(np.rint(t), 0, 255).astype(np.int64)
    expected = ((q - zero_point) @ w.T.astype(np.int64)).astype(np.float32) * (scale * w_scale)
    got = int8.qlinear(x, packed, colsum, w_scale, qparams=(float(scale), zero_point))
    np.testing.assert_array_equal(got, expected)


def test_conv2d_is_quantized_statically_as_a_product_of_patches():
    tg.manual_seed(5)
    model = tg.nn.Sequential(tg.nn.Conv2d(3, 8, 3, stride=2, padding=1), tg.nn.ReLU(),
                             tg.nn.Conv2d(8, 4, 2, bias=False))
    prepared = tg.quantization.prepare(model)
    rng = np.random.default_rng(6)
    for _ in range(3):
        prepared(tg.tensor(rng.standard_normal((2, 3, 9, 11)).astype(np.float32)))
    quantized = tg.quantization.convert(prepared)
    assert [type(m).__name__ for m in quantized] == ["StaticQuantizedConv2d", "ReLU", "StaticQuantizedConv2d"]
    x = rng.standard_normal((2, 3, 9, 11)).astype(np.float32)
    got = tg.compile(lambda x: quantized(x))(tg.tensor(x)).numpy()
    expected = torch.from_numpy(x).double()
    for layer, conv in ((quantized[0], model[0]), (quantized[2], model[2])):  # fake-quantized, in float64
        scale, zero_point = layer.activation_qparams
        t = (expected.float() * (np.float32(1) / np.float32(scale))).float() + zero_point
        q = torch.clamp(torch.round(t), 0, layer.quant_max).double()
        weights = torch.from_numpy(layer.weight().dequantize().numpy()).double().reshape(conv.weight.shape)
        bias = None if conv.bias is None else torch.from_numpy(conv.bias.detach().numpy()).double()
        expected = torch.nn.functional.conv2d((q - zero_point) * scale, weights, bias, conv.stride, conv.padding)
        expected = torch.relu(expected) if layer is quantized[0] else expected
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected.numpy(), rtol=1e-4, atol=1e-5)


def test_grouped_conv_is_refused_at_convert():
    prepared = tg.quantization.prepare(tg.nn.Sequential(tg.nn.Conv2d(4, 4, 3, groups=2)))
    prepared(tg.randn(1, 4, 5, 5))
    with pytest.raises(tg.TGError, match="groups=1"):
        tg.quantization.convert(prepared)
