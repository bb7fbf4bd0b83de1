"""The quantized linear composite: the int8 GEMM that compiled programs call agrees bit for bit with the reference
decomposition (the numpy device), on odd shapes, batch dims, bias and relu; it is one library call."""

from __future__ import annotations

import numpy as np
import pytest

import tensorgraphs as tg
from tensorgraphs.codegen.loop_ir import NativeCall, walk
from tensorgraphs.kernels.gemm import int8
from tensorgraphs.plan.choices import route_of
from tensorgraphs.quantization.linear import matmul_integer, quantized_linear
from tensorgraphs.schedule import schedule_kernels

pytestmark = [pytest.mark.device("cpu", compile=True),
              pytest.mark.skipif(not int8.available(), reason="needs AVX2 (or AVX-512) and a C compiler")]


def _layer(n: int, k: int, seed: int) -> tuple[tg.Tensor, tg.Tensor, tg.Tensor, tg.Tensor]:
    rng = np.random.default_rng(seed)
    packed, colsum = int8.pack_weights(rng.integers(-128, 128, (n, k), dtype=np.int8))
    scales = rng.uniform(0.001, 0.05, n).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32)
    return tg.tensor(packed), tg.tensor(colsum), tg.tensor(scales), tg.tensor(bias)


@pytest.mark.parametrize(("x_shape", "n"), [((9, 33), 70), ((1, 1), 1), ((2, 3, 130), 65), ((64, 5), 7),
                                             ((0, 8), 5), ((5, 0), 3)])
@pytest.mark.parametrize(("bias", "activation", "quant_max"), [(True, "none", 255), (False, "relu", 127)])
def test_int8_gemm_matches_the_decomposition(x_shape, n, bias, activation, quant_max):
    packed, colsum, scales, b = _layer(n, x_shape[-1], 1)
    x = tg.tensor((np.random.default_rng(2).standard_normal(x_shape) * 4).astype(np.float32))
    layer = lambda x: quantized_linear(x, packed, colsum, scales, b if bias else None,  # noqa: E731
                                       quant_max=quant_max, activation=activation)
    with tg.device("numpy"):
        expected = layer(x).numpy()
    got = tg.compile(layer)(x).numpy()
    assert got.shape == x_shape[:-1] + (n,)
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize(("scale", "special"), [(1.0, float("nan")), (1.0, float("inf")), (0.0, 0.0)])
def test_special_activations_match_the_decomposition(scale, special):
    """NaN (every output NaN), Inf, all zeros (the default scale 0.1)."""
    packed, colsum, scales, bias = _layer(20, 30, 5)
    x = np.random.default_rng(6).standard_normal((8, 30)).astype(np.float32) * np.float32(scale)
    x[3, 7] = special
    x = tg.tensor(x)
    layer = lambda x: quantized_linear(x, packed, colsum, scales, bias, activation="relu")  # noqa: E731
    with tg.device("numpy"):
        expected = layer(x).numpy()
    np.testing.assert_array_equal(tg.compile(layer)(x).numpy(), expected)


def test_a_layer_is_one_library_call():
    packed, colsum, scales, bias = _layer(70, 33, 3)
    x = tg.randn(9, 33)
    y = quantized_linear(x, packed, colsum, scales, bias, activation="relu")
    assert route_of(y.node) == "int8_gemm"
    calls = [s for kernel in schedule_kernels([y.node]).kernels for s in walk(kernel.body)
             if isinstance(s, NativeCall)]
    assert [call.function for call in calls] == [int8.C_FUNCTIONS["linear"]]


def test_gemm_off_runs_the_decomposition(monkeypatch):
    monkeypatch.setenv("TG_GEMM", "0")
    packed, colsum, scales, bias = _layer(7, 5, 4)
    y = quantized_linear(tg.randn(3, 5), packed, colsum, scales, bias)
    assert route_of(y.node) == "decompose"


@pytest.mark.parametrize(("dtype", "zero_point"), [(np.uint8, 0), (np.uint8, 128), (np.int8, -3)])
@pytest.mark.parametrize(("shape", "n"), [((9, 33), 70), ((2, 3, 64), 5), ((1, 1), 1)])
def test_integer_product_matches_the_decomposition_and_numpy(dtype, zero_point, shape, n):
    info = np.iinfo(dtype)
    rng = np.random.default_rng(7)
    a = rng.integers(info.min, info.max + 1, shape, dtype=dtype)
    w = rng.integers(-128, 128, (n, shape[-1]), dtype=np.int8)
    packed, colsum = (tg.tensor(v) for v in int8.pack_weights(w))
    product = lambda a: matmul_integer(a, packed, colsum, zero_point)  # noqa: E731
    got = tg.compile(product)(tg.tensor(a)).numpy()
    with tg.device("numpy"):
        np.testing.assert_array_equal(got, product(tg.tensor(a)).numpy())
    np.testing.assert_array_equal(got, (a.astype(np.int64) - zero_point) @ w.T.astype(np.int64))
    assert route_of(product(tg.tensor(a)).node) == "int8_gemm"
