"""The int8 GEMM against a numpy oracle (int64 sums, float32 steps as the reference decomposition takes them), on
odd shapes (tile tails, 1 and 0), both activation signs, zero points, NaN/Inf activations and the epilogue."""

from __future__ import annotations

import numpy as np
import pytest

from tensorgraphs.errors import ShapeError
from tensorgraphs.kernels.gemm import int8

pytestmark = pytest.mark.skipif(not int8.available(), reason="needs AVX-512 VNNI and a C compiler")

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


def _qlinear_oracle(x, scale, zero_point, w, w_scale, bias, quant_max, activation):
    f32 = np.float32
    t = (x * (f32(1) / f32(scale))).astype(f32) + f32(zero_point)
    q = np.where(np.isnan(t) | (t > quant_max), quant_max, np.clip(np.rint(t), 0, None)).astype(np.int64)
    sums = (q - int(zero_point)) @ w.T.astype(np.int64)
    y = sums.astype(f32) * (f32(scale) * w_scale)
    y = y + bias if bias is not None else y
    return np.maximum(y, f32(0)) if activation == "relu" else y


@pytest.mark.parametrize(("m", "n", "k"), SHAPES)
@pytest.mark.parametrize(("bias", "activation", "quant_max"), [(True, "none", 255), (False, "relu", 127),
                                                              (True, "relu", 255)])
def test_qlinear_matches_oracle_bit_for_bit(m, n, k, bias, activation, quant_max):
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((m, k)) * 3).astype(np.float32)
    if x.size:
        x.flat[:3] = [np.nan, np.inf, -np.inf][: x.size]
    w = _weights(n, k, 4)
    w_scale = rng.uniform(0.001, 0.02, n).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32) if bias else None
    scale, zero_point = 0.037, 93.0
    packed, colsum = int8.pack_weights(w)
    got = int8.qlinear(x, scale, zero_point, packed, colsum, w_scale, b, quant_max=quant_max, activation=activation)
    expected = _qlinear_oracle(x, scale, zero_point, w, w_scale, b, quant_max, activation)
    np.testing.assert_array_equal(got, expected, err_msg=f"{m}x{n}x{k}")


def test_weights_must_fit_the_activations():
    packed, colsum = int8.pack_weights(_weights(8, 16, 0))
    with pytest.raises(ShapeError, match="do not fit k = 12"):
        int8.qgemm(np.zeros((2, 12), np.uint8), packed, colsum)
