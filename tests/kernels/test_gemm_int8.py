"""The int8 GEMM against a numpy oracle (int64 sums, float32 steps as the reference decomposition takes them), on
odd shapes (tile tails, 1 and 0), both activation signs, zero points, NaN/Inf activations and the epilogue; and
against torch (integer products, quantize_per_tensor, fbgemm's dynamic linear layer) where the kernel's inner
product differs by target (VNNI, or AVX2's two steps for 7-bit and 8-bit activations)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tensorgraphs.errors import ShapeError
from tensorgraphs.kernels.gemm import int8

pytestmark = [pytest.mark.skipif(not int8.available(), reason="needs AVX2 (or AVX-512) and a C compiler"),
              pytest.mark.filterwarnings("ignore::UserWarning")]  # torch deprecates its quantized tensors

SHAPES = [(1, 1, 1), (7, 33, 255), (13, 70, 5), (6, 64, 4), (5, 65, 3), (100, 130, 131), (0, 5, 7), (5, 0, 7),
          (5, 7, 0), (300, 200, 100)]


def _weights(n: int, k: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(-128, 128, (n, k), dtype=np.int8)


@pytest.mark.parametrize(("m", "n", "k"), SHAPES)
@pytest.mark.parametrize(("dtype", "zero_point"), [(np.uint8, 0), (np.uint8, 131), (np.int8, -5), (np.int8, 0)])
def test_qgemm_matches_integer_oracle(m, n, k, dtype, zero_point):
    info = np.iinfo(dtype)
    a = np.random.default_rng(1).integers(info.min, info.max + 1, (m, k), dtype=dtype)
    w = _weights(n, k, 2)
    packed, colsum = int8.pack_weights(w)
    expected = (a.astype(np.int64) - zero_point) @ w.T.astype(np.int64)
    np.testing.assert_array_equal(int8.qgemm(a, packed, colsum, zero_point), expected, err_msg=f"{m}x{n}x{k}")


def test_extreme_values_do_not_saturate():
    """255 * -128 summed over k = 4096: VPDPBUSD's int32 sums wrap nowhere near here, and nothing saturates."""
    a = np.full((3, 4096), 255, np.uint8)
    w = np.full((70, 4096), -128, np.int8)
    packed, colsum = int8.pack_weights(w)
    np.testing.assert_array_equal(int8.qgemm(a, packed, colsum), np.full((3, 70), 255 * -128 * 4096))


def _qlinear_oracle(x, w, w_scale, bias, quant_max, activation):
    """gemm_int8.h's tg_qlinear_f32 in numpy, each step rounded to float32 as stated there."""
    f32, top = np.float32, np.float32(quant_max)
    with np.errstate(all="ignore"):
        low, high = (f32(reduce([*x.ravel(), f32(0)])) for reduce in (np.min, np.max))
        scale = (high - low) / top
        scale = f32(0.1) if scale == 0 else scale
        zero_point = np.clip(np.rint(-low / scale), f32(0), top)
        t = (x * (f32(1) / scale)).astype(f32) + zero_point
        q = np.where(np.isnan(t) | (t > top), top, np.clip(np.rint(t), 0, None)).astype(np.int64)
        sums = (q - (0 if np.isnan(zero_point) else int(zero_point))) @ w.T.astype(np.int64)
        y = sums.astype(f32) * (scale * w_scale)
        y = y + bias if bias is not None else y
        return np.where((y < 0) | (y == 0), f32(0), y) if activation == "relu" else y


INPUTS = {
    "normal": lambda rng, shape: (rng.standard_normal(shape) * 3).astype(np.float32),
    "positive": lambda rng, shape: np.abs(rng.standard_normal(shape)).astype(np.float32),
    "negative": lambda rng, shape: -np.abs(rng.standard_normal(shape)).astype(np.float32) - 1,
    "zeros": lambda rng, shape: np.zeros(shape, np.float32),
    "nan": lambda rng, shape: np.where(rng.random(shape) < 0.01, np.nan, rng.standard_normal(shape)).astype(np.float32),
    "inf": lambda rng, shape: np.where(rng.random(shape) < 0.01, np.inf, rng.standard_normal(shape)).astype(np.float32),
}


@pytest.mark.parametrize(("m", "n", "k"), SHAPES)
@pytest.mark.parametrize(("bias", "activation", "quant_max"), [(True, "none", 255), (False, "relu", 127),
                                                              (True, "relu", 255)])
def test_qlinear_matches_oracle_bit_for_bit(m, n, k, bias, activation, quant_max):
    rng = np.random.default_rng(3)
    x = INPUTS["normal"](rng, (m, k))
    w = _weights(n, k, 4)
    w_scale = rng.uniform(0.001, 0.02, n).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32) if bias else None
    packed, colsum = int8.pack_weights(w)
    got = int8.qlinear(x, packed, colsum, w_scale, b, quant_max=quant_max, activation=activation)
    expected = _qlinear_oracle(x, w, w_scale, b, quant_max, activation)
    np.testing.assert_array_equal(got, expected, err_msg=f"{m}x{n}x{k}")


@pytest.mark.parametrize("kind", list(INPUTS))
def test_qlinear_chooses_quantization_parameters_as_the_oracle(kind):
    rng = np.random.default_rng(5)
    x = INPUTS[kind](rng, (300, 100))  # large enough for the parallel range reduction
    w, w_scale = _weights(20, 100, 6), rng.uniform(0.001, 0.02, 20).astype(np.float32)
    packed, colsum = int8.pack_weights(w)
    np.testing.assert_array_equal(int8.qlinear(x, packed, colsum, w_scale), _qlinear_oracle(x, w, w_scale, None, 255,
                                                                                          "none"))


def test_weights_must_fit_the_activations():
    packed, colsum = int8.pack_weights(_weights(8, 16, 0))
    with pytest.raises(ShapeError, match="do not fit k = 12"):
        int8.qgemm(np.zeros((2, 12), np.uint8), packed, colsum)


def test_quantizing_rounds_the_product_before_adding_the_zero_point():
    """x * (1 / scale) + zero_point is two roundings, as torch and the decomposition take it: a fused multiply-add
    (gcc contracts one unless told not to) rounds these x to the next integer up or down."""
    x = np.array([[0.69495004, 0.59655005, 0.43664986, 0.64575005, 0.99015003, 0.53504986, -0.8302499, 0.8056498]],
                 np.float32)
    w = np.eye(8, dtype=np.int8)
    packed, colsum = int8.pack_weights(w)
    scale, zero_point = np.float32(0.0123), 100
    t = (x * (np.float32(1) / scale)).astype(np.float32) + np.float32(zero_point)
    expected = (np.rint(t) - zero_point).astype(np.float32) * scale
    got = int8.qlinear(x, packed, colsum, np.ones(8, np.float32), qparams=(float(scale), zero_point))
    np.testing.assert_array_equal(got, expected)


# Without VNNI the kernel has two inner-product steps (gemm_int8.c, dot4): VPMADDUBSW pairs in int16 for activations
# that are all at most 127, and a split into a & 127 and a & 128 for the rest. The cases below sit at the int16 limit
# of each, and switch between them by one byte.
@pytest.mark.parametrize(("a_value", "w_value"), [(127, -128), (127, 127), (128, -128), (255, 127), (128, 127)])
def test_pairs_at_the_int16_limit_are_exact(a_value, w_value):
    a = np.full((7, 37), a_value, np.uint8)
    w = np.full((20, 37), w_value, np.int8)
    packed, colsum = int8.pack_weights(w)
    expected = torch.from_numpy(a).long() @ torch.from_numpy(w).long().T
    np.testing.assert_array_equal(int8.qgemm(a, packed, colsum), expected.numpy())


@pytest.mark.parametrize(("m", "n", "k"), SHAPES)
@pytest.mark.parametrize(("top", "zero_point"), [(128, 0), (128, 64), (256, 0)])
def test_qgemm_matches_torch(m, n, k, top, zero_point):
    """Seven-bit activations (top 128), then one byte of 255 in them (the exact split step takes over)."""
    rng = np.random.default_rng(8)
    a = rng.integers(0, top, (m, k), dtype=np.uint8)
    w = _weights(n, k, 9)
    packed, colsum = int8.pack_weights(w)
    expected = (torch.from_numpy(a).long() - zero_point) @ torch.from_numpy(w).long().T
    np.testing.assert_array_equal(int8.qgemm(a, packed, colsum, zero_point), expected.numpy(), err_msg=f"{m}x{n}x{k}")
    if a.size:
        a[m // 2, k // 2] = 255
        expected = (torch.from_numpy(a).long() - zero_point) @ torch.from_numpy(w).long().T
        np.testing.assert_array_equal(int8.qgemm(a, packed, colsum, zero_point), expected.numpy())


@pytest.mark.parametrize(("m", "k"), [(1, 1), (7, 33), (13, 5), (40, 131)])
@pytest.mark.parametrize(("quant_max", "scale", "zero_point"), [(127, 0.05, 60), (127, 0.013, 0), (255, 0.02, 131)])
def test_quantized_activations_match_torch(m, k, quant_max, scale, zero_point):
    """Identity weights: each output is an activation quantized and dequantized, torch.quantize_per_tensor's value
    (clamped to quant_max) times the scale."""
    x = (np.random.default_rng(10).standard_normal((m, k)) * 2).astype(np.float32)
    packed, colsum = int8.pack_weights(np.eye(k, dtype=np.int8))
    q = torch.quantize_per_tensor(torch.from_numpy(x), scale, zero_point, torch.quint8).int_repr().int()
    expected = (q.clamp(max=quant_max) - zero_point).float() * torch.tensor(scale, dtype=torch.float32)
    got = int8.qlinear(x, packed, colsum, np.ones(k, np.float32), quant_max=quant_max, qparams=(scale, zero_point))
    np.testing.assert_array_equal(got, expected.numpy())


@pytest.mark.parametrize(("m", "n", "k"), [(7, 33, 255), (13, 70, 5), (100, 130, 131), (1, 1, 1), (300, 200, 100)])
def test_qlinear_matches_torch_dynamic_linear(m, n, k):
    """torch's dynamically quantized linear layer (fbgemm, per-channel int8 weights, activations in [0, 127]): the
    same integer sums, so results differ only by float rounding (torch picks the activations' scale in double),
    far below one quantization step."""
    rng = np.random.default_rng(11)
    x = (rng.standard_normal((m, k)) * 3).astype(np.float32)
    w_float = rng.standard_normal((n, k)).astype(np.float32)
    scales = np.abs(w_float).max(1).astype(np.float64) / 127.5
    weight = torch.quantize_per_channel(torch.from_numpy(w_float), torch.from_numpy(scales),
                                        torch.zeros(n, dtype=torch.long), 0, torch.qint8)
    bias = rng.standard_normal(n).astype(np.float32)
    expected = torch.ops.quantized.linear_dynamic(
        torch.from_numpy(x), torch.ops.quantized.linear_prepack(weight, torch.from_numpy(bias)), True).numpy()
    packed, colsum = int8.pack_weights(weight.int_repr().numpy())
    got = int8.qlinear(x, packed, colsum, scales.astype(np.float32), bias, quant_max=127)
    step = (x.max() - min(x.min(), 0)) / 127 * scales.min()
    np.testing.assert_allclose(got, expected, rtol=5e-7, atol=0.01 * step)  # a few ulp, or 1% of a step
