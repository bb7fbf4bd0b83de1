"""Quantized tensors against torch: int_repr bit for bit (rounding ties, saturation, NaN/Inf, zero points), the
dequantized values, and errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tensorgraphs as tg

pytestmark = pytest.mark.filterwarnings("ignore:.*quantized tensor creation functions")
DTYPES = [(tg.qint8, torch.qint8), (tg.quint8, torch.quint8), (tg.qint32, torch.qint32)]
EDGES = [float("nan"), float("inf"), -float("inf"), 0.5, 1.5, 2.5, -0.5, -2.5, 1e3, -1e3, 3e9, -3e9, 0.49999997, 0.0,
         -0.0, 1e-45]


def _values(seed: int, shape: tuple[int, ...]) -> np.ndarray:
    rng = np.random.default_rng(seed)
    values = (rng.standard_normal(shape) * 40).astype(np.float32)
    ties = rng.integers(-300, 300, shape) / 2  # exact halves: rounding ties at scale 0.5 or 1
    return np.where(rng.random(shape) < 0.3, ties, values).astype(np.float32)


@pytest.mark.parametrize("device", ["cpu", "numpy"])
@pytest.mark.parametrize(("dtype", "torch_dtype"), DTYPES)
@pytest.mark.parametrize(("scale", "zero_point"), [(1.0, 3), (0.5, 0), (0.1, -7), (0.07, 100), (1 / 3, 1)])
def test_quantize_per_tensor_matches_torch(device, dtype, torch_dtype, scale, zero_point):
    zero_point = min(max(zero_point, 0), 255) if dtype is tg.quint8 else zero_point
    x = np.concatenate([np.array(EDGES, np.float32), _values(0, (1000,))])
    with tg.device(device):
        q = tg.quantize_per_tensor(tg.tensor(x), scale, zero_point, dtype)
        integers, values = q.int_repr().numpy(), q.dequantize().numpy()
    expected = torch.quantize_per_tensor(torch.from_numpy(x), scale, zero_point, torch_dtype)
    assert integers.dtype == expected.int_repr().numpy().dtype
    np.testing.assert_array_equal(integers, expected.int_repr().numpy(), err_msg=f"{dtype} {scale} {zero_point}")
    finite = np.abs(expected.int_repr().numpy().astype(np.int64)) < 2**30  # torch's qint32 (q - zp) wraps
    np.testing.assert_array_equal(values[finite], expected.dequantize().numpy()[finite])
    assert q.q_scale() == expected.q_scale() and q.q_zero_point() == expected.q_zero_point()


@pytest.mark.parametrize(("dtype", "torch_dtype"), DTYPES)
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_quantize_per_channel_matches_torch(dtype, torch_dtype, axis):
    x = _values(1, (3, 5, 70))
    x[0, 0, :6] = [0.5, 1.5, 2.5, float("inf"), -float("inf"), 1e3]  # NaN per channel is undefined in torch
    channels = x.shape[axis]
    rng = np.random.default_rng(2)
    scales = rng.choice([1.0, 0.5, 0.1, 0.3, 0.07], channels)
    low = 0 if dtype is tg.quint8 else -10
    zero_points = rng.integers(low, low + 20, channels)
    q = tg.quantize_per_channel(tg.tensor(x), scales.tolist(), zero_points.tolist(), axis, dtype)
    expected = torch.quantize_per_channel(torch.from_numpy(x), torch.from_numpy(scales), torch.from_numpy(zero_points),
                                          axis % 3, torch_dtype)
    np.testing.assert_array_equal(q.int_repr().numpy(), expected.int_repr().numpy())
    np.testing.assert_array_equal(q.dequantize().numpy(), expected.dequantize().numpy())
    np.testing.assert_array_equal(q.q_per_channel_scales().numpy(), expected.q_per_channel_scales().numpy())
    np.testing.assert_array_equal(q.q_per_channel_zero_points().numpy(), expected.q_per_channel_zero_points().numpy())
    assert q.q_per_channel_axis() == axis % 3 and q.qscheme() == "per_channel_affine"


def test_size_zero_dims():
    q = tg.quantize_per_tensor(tg.ones(3, 0), 0.5, 2, tg.quint8)
    assert q.int_repr().shape == (3, 0) and q.int_repr().dtype is tg.uint8 and q.dequantize().shape == (3, 0)
    per_channel = tg.quantize_per_channel(tg.ones(0, 4), [0.5] * 4, [0] * 4, 1, tg.qint8)
    assert per_channel.int_repr().shape == (0, 4) and per_channel.dequantize().numpy().size == 0


def test_scale_and_zero_point_as_tensors_are_lazy():
    x = tg.tensor([0.25, -1.0, 2.0])
    q = tg.quantize_per_tensor(x, x.abs().max() / 127, tg.tensor(0), tg.qint8)
    expected = torch.quantize_per_tensor(torch.tensor([0.25, -1.0, 2.0]), 2.0 / 127, 0, torch.qint8)
    np.testing.assert_array_equal(q.int_repr().numpy(), expected.int_repr().numpy())


@pytest.mark.parametrize(("call", "message"), [
    (lambda: tg.quantize_per_tensor(tg.ones(2), 1.0, 300, tg.quint8), "zero_point 300 is outside"),
    (lambda: tg.quantize_per_tensor(tg.ones(2), 1.0, -129, tg.qint8), "zero_point -129 is outside"),
    (lambda: tg.quantize_per_tensor(tg.ones(2, dtype=tg.int32), 1.0, 0, tg.qint8), "only float32"),
    (lambda: tg.quantize_per_tensor(tg.ones(2), 1.0, 0, tg.int8), "dtype must be one of"),
    (lambda: tg.quantize_per_channel(tg.ones(2, 3), [1.0] * 2, [0] * 2, 1, tg.qint8), "one entry per slice"),
    (lambda: tg.quantize_per_channel(tg.ones(2, 3), [1.0] * 2, [0] * 2, 2, tg.qint8), "axis 2 is out of range"),
    (lambda: tg.quantize_per_tensor(tg.ones(2), 1.0, 0, tg.qint8).q_per_channel_scales(), "quantized per tensor"),
    (lambda: tg.quantize_per_channel(tg.ones(2), [1.0] * 2, [0] * 2, 0, tg.qint8).q_scale(), "per channel"),
])
def test_errors_name_the_call(call, message):
    with pytest.raises(tg.TGError, match=message) as raised:
        call()
    assert "test_quantized_tensor.py" in str(raised.value)
