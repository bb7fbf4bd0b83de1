"""The int8 GEMM against a numpy oracle (int64 sums, float32 steps as the reference decomposition takes them), on
odd shapes (tile tails, 1 and 0), both activation signs, zero points, NaN/Inf activations and the epilogue."""

from __future__ import annotations

import numpy as np
import pytest

from tensorgraphs.errors import ShapeError
from tensorgraphs.kernels.gemm import int8

pytestmark = pytest.mark.skipif(not int8.available(), reason="needs AVX2 (or AVX-512) and a C compiler")

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
