"""The reference interpreter: float64 mode, bfloat16/float16 rounding, integer division, CAST, indexing."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tensorgraphs import dtypes
from tensorgraphs.backends.numpy_backend import REFERENCE, NumpyBackend
from tensorgraphs.dtypes import DType
from tensorgraphs.graph import node as g
from tensorgraphs.graph.node import Node
from tensorgraphs.graph.ops import Op
from tensorgraphs.runtime.buffer import Buffer

pytestmark = pytest.mark.device("numpy")

TORCH_DTYPES = {dtypes.float16: torch.float16, dtypes.bfloat16: torch.bfloat16, dtypes.float32: torch.float32,
                dtypes.float64: torch.float64, dtypes.int8: torch.int8, dtypes.uint8: torch.uint8,
                dtypes.int16: torch.int16, dtypes.int32: torch.int32, dtypes.int64: torch.int64,
                dtypes.bool_: torch.bool}


def leaf(values: np.ndarray | list, dtype: DType) -> Node:
    """A BUFFER node holding `values` converted to `dtype` (bfloat16 rounded as Tensor.from_numpy does)."""
    data = dtypes.round_to_storage(np.asarray(values).astype(dtype.storage), dtype)
    return g.buffer(Buffer("numpy", dtype, data.shape, data), dtype, data.shape)


def run(node: Node, backend: NumpyBackend = REFERENCE) -> np.ndarray:
    return backend.evaluate([node])[0]


def torch_values(node_values: np.ndarray, dtype: DType) -> torch.Tensor:
    return torch.tensor(node_values.tolist(), dtype=TORCH_DTYPES[dtype])


# ---------------------------------------------------------------------------
# float64 mode
# ---------------------------------------------------------------------------


def test_float64_mode_computes_float32_graphs_in_float64() -> None:
    big = g.const(1e8, dtypes.float32, (2,))
    x = g.binary(Op.ADD, g.binary(Op.ADD, big, g.const(1.0, dtypes.float32, (2,))), g.const(-1e8, dtypes.float32, (2,)))
    single, double = run(x), run(x, NumpyBackend(float64=True))
    assert single.dtype == np.float32 and double.dtype == np.float64
    np.testing.assert_array_equal(single, [0.0, 0.0])  # 1e8 + 1 rounds back to 1e8 in float32
    np.testing.assert_array_equal(double, [1.0, 1.0])


def test_float64_mode_skips_bfloat16_rounding_but_keeps_integers() -> None:
    third = g.binary(Op.DIV, g.const(1.0, dtypes.bfloat16, (1,)), g.const(3.0, dtypes.bfloat16, (1,)))
    count = g.binary(Op.ADD, g.const(2**31 - 1, dtypes.int32, (1,)), g.const(1, dtypes.int32, (1,)))
    backend = NumpyBackend(float64=True)
    assert run(third, backend)[0] == 1.0 / 3.0
    assert run(count, backend).dtype == np.int32 and run(count, backend)[0] == -(2**31)  # wraps


# ---------------------------------------------------------------------------
# low-precision floats: every result is rounded to the dtype, as PyTorch does
# ---------------------------------------------------------------------------

ROUNDED_OPS = {
    "ADD": lambda a, b: g.binary(Op.ADD, a, b),
    "MUL": lambda a, b: g.binary(Op.MUL, a, b),
    "DIV": lambda a, b: g.binary(Op.DIV, a, b),
    "SQRT": lambda a, b: g.unary(Op.SQRT, a),
    "REDUCE_SUM": lambda a, b: g.reduce(Op.REDUCE_SUM, a, (0,)),
}
TORCH_OPS = {
    "ADD": lambda a, b: a + b,
    "MUL": lambda a, b: a * b,
    "DIV": lambda a, b: a / b,
    "SQRT": lambda a, b: a.sqrt(),
    "REDUCE_SUM": lambda a, b: a.sum(0, keepdim=True),
}


def _is_representable(values: np.ndarray, dtype: DType) -> bool:
    as_float = values.astype(np.float32)
    return bool(np.array_equal(dtypes.round_to_storage(as_float, dtype), as_float, equal_nan=True))


@pytest.mark.parametrize("dtype", [dtypes.bfloat16, dtypes.float16], ids=lambda d: d.name)
@pytest.mark.parametrize("name", sorted(ROUNDED_OPS))
def test_correctly_rounded_ops_match_torch_exactly(dtype: DType, name: str) -> None:
    gen = np.random.default_rng(len(name))
    a_values, b_values = gen.uniform(0.1, 10.0, (2, 64))
    shape = (64,) if name != "REDUCE_SUM" else (2, 32)
    a, b = leaf(a_values.reshape(shape), dtype), leaf(b_values.reshape(shape), dtype)
    got = run(ROUNDED_OPS[name](a, b))
    want = TORCH_OPS[name](torch_values(run(a), dtype), torch_values(run(b), dtype))
    if name == "REDUCE_SUM":  # two addends: one correctly rounded addition
        np.testing.assert_array_equal(got, want.float().numpy())
    else:
        np.testing.assert_array_equal(got.astype(np.float32), want.float().numpy(), err_msg=f"{name} {dtype.name}")
    assert _is_representable(got, dtype)


def test_bfloat16_add_rounds_ties_to_even() -> None:
    one = g.const(1.0, dtypes.bfloat16, (2,))
    half_ulp = leaf([2.0**-8, 3 * 2.0**-8], dtypes.bfloat16)
    np.testing.assert_array_equal(run(g.binary(Op.ADD, one, half_ulp)), [1.0, 1.0 + 2.0**-6])


BFLOAT16_SOURCES = {
    "CONST": lambda: g.const(0.1, dtypes.bfloat16, (3,)),
    "IOTA": lambda: g.iota(300, dtypes.bfloat16),
    "CAST": lambda: g.unary(Op.CAST, leaf(np.linspace(0.1, 1000.0, 50), dtypes.float32), dtypes.bfloat16),
    "SCATTER_ADD": lambda: g.scatter_add(g.const(0.0, dtypes.bfloat16, (2,)), leaf([0, 0, 1], dtypes.int64),
                                         leaf([1.0, 2.0**-8, 3.0], dtypes.bfloat16), 0),
    "EXP2": lambda: g.unary(Op.EXP2, leaf(np.linspace(-3, 3, 50), dtypes.bfloat16)),
    "LOG2": lambda: g.unary(Op.LOG2, leaf(np.linspace(0.1, 30, 50), dtypes.bfloat16)),
    "SIN": lambda: g.unary(Op.SIN, leaf(np.linspace(-3, 3, 50), dtypes.bfloat16)),
}


@pytest.mark.parametrize("name", sorted(BFLOAT16_SOURCES))
def test_every_bfloat16_result_is_representable(name: str) -> None:
    values = run(BFLOAT16_SOURCES[name]())
    assert values.dtype == np.float32
    assert _is_representable(values, dtypes.bfloat16), f"{name}: {values}"


def test_bfloat16_const_and_iota_match_torch() -> None:
    np.testing.assert_array_equal(run(BFLOAT16_SOURCES["CONST"]()),
                                  torch.full((3,), 0.1, dtype=torch.bfloat16).float().numpy())
    np.testing.assert_array_equal(run(BFLOAT16_SOURCES["IOTA"]()),
                                  torch.arange(300, dtype=torch.bfloat16).float().numpy())


# ---------------------------------------------------------------------------
# integers: PyTorch's floor division and modulo with the divisor's sign
# ---------------------------------------------------------------------------

DIVIDENDS = [7, -7, 7, -7, 0, 6, -6, 1, -1, 13, -128, 127]
DIVISORS = [2, 2, -2, -2, 3, -4, 4, -3, 3, -5, 7, -128]


@pytest.mark.parametrize("dtype", [dtypes.int8, dtypes.int32, dtypes.int64], ids=lambda d: d.name)
def test_integer_division_and_modulo_follow_torch(dtype: DType) -> None:
    a, b = leaf(DIVIDENDS, dtype), leaf(DIVISORS, dtype)
    ta, tb = torch.tensor(DIVIDENDS, dtype=TORCH_DTYPES[dtype]), torch.tensor(DIVISORS, dtype=TORCH_DTYPES[dtype])
    quotient, remainder = run(g.binary(Op.DIV, a, b)), run(g.binary(Op.MOD, a, b))
    assert quotient.dtype == dtype.storage and remainder.dtype == dtype.storage
    np.testing.assert_array_equal(quotient, torch.div(ta, tb, rounding_mode="floor").numpy())
    np.testing.assert_array_equal(remainder, torch.remainder(ta, tb).numpy())
    np.testing.assert_array_equal(quotient * np.asarray(DIVISORS) + remainder, DIVIDENDS)
    nonzero = remainder != 0
    assert (np.sign(remainder[nonzero]) == np.sign(np.asarray(DIVISORS)[nonzero])).all()


def test_integer_division_by_zero_gives_zero() -> None:
    a, zero = leaf([5, -5, 0], dtypes.int32), g.const(0, dtypes.int32, (3,))
    np.testing.assert_array_equal(run(g.binary(Op.DIV, a, zero)), [0, 0, 0])
    np.testing.assert_array_equal(run(g.binary(Op.MOD, a, zero)), [0, 0, 0])


def test_float_division_is_ieee() -> None:
    a, zero = leaf([1.0, -1.0, 0.0], dtypes.float32), g.const(0.0, dtypes.float32, (3,))
    np.testing.assert_array_equal(run(g.binary(Op.DIV, a, zero)), [np.inf, -np.inf, np.nan])


# ---------------------------------------------------------------------------
# CAST
# ---------------------------------------------------------------------------

CAST_CASES = [
    # (source values, source dtype, target dtype): all defined in PyTorch (no NaN/inf/out-of-range to int)
    ([2.7, -2.7, 0.5, -0.5, 126.9, -127.9], dtypes.float32, dtypes.int8),
    ([2.7, -2.7, 1e9, -1e9], dtypes.float64, dtypes.int32),
    ([0.0, -0.0, 0.1, np.nan, np.inf, -3.0], dtypes.float32, dtypes.bool_),
    ([0, 3, -2], dtypes.int64, dtypes.bool_),
    ([True, False], dtypes.bool_, dtypes.int32),
    ([True, False], dtypes.bool_, dtypes.float32),
    ([-1, 256, 300, -129], dtypes.int64, dtypes.uint8),
    ([200, 255, 128], dtypes.int32, dtypes.int8),
    ([2**24 + 1, -(2**24) - 3, 2**62 + 2**38 + 1], dtypes.int64, dtypes.float32),
    ([1.0 + 2.0**-20, 70000.0, -1e-8, 1e5], dtypes.float32, dtypes.float16),
    ([1.0 + 2.0**-9, 3.14159, 1e38], dtypes.float32, dtypes.bfloat16),
    ([1.0 + 2.0**-30, 1e300], dtypes.float64, dtypes.float32),
    ([250.7, 3.2], dtypes.float32, dtypes.uint8),
]


@pytest.mark.parametrize("values, source, target", CAST_CASES,
                         ids=[f"{s.name}->{t.name}" for _, s, t in CAST_CASES])
def test_cast_matches_torch(values: list, source: DType, target: DType) -> None:
    x = leaf(values, source)
    got = run(g.unary(Op.CAST, x, target))
    want = torch_values(run(x), source).to(TORCH_DTYPES[target])
    want_values = want.float().numpy() if target is dtypes.bfloat16 else want.numpy()
    assert got.dtype == target.storage
    np.testing.assert_array_equal(got, want_values)


def test_cast_of_nan_and_inf_to_int_is_defined_in_the_reference() -> None:
    """Undefined in C and PyTorch; the reference documents 0 for NaN/inf and saturation otherwise."""
    got = run(g.unary(Op.CAST, leaf([np.nan, np.inf, -np.inf, 1e10, -1e10], dtypes.float32), dtypes.int32))
    np.testing.assert_array_equal(got, [0, 0, 0, 2**31 - 1, -(2**31)])
    got = run(g.unary(Op.CAST, leaf([1e19, -1e19, 2.0**63], dtypes.float64), dtypes.int64))
    np.testing.assert_array_equal(got, [2**63 - 1, -(2**63), 2**63 - 1])


# ---------------------------------------------------------------------------
# NaN behaviour, reductions, indexing
# ---------------------------------------------------------------------------


def test_max_propagates_nan_and_comparisons_follow_ieee() -> None:
    a = leaf([np.nan, 1.0, np.nan, 2.0], dtypes.float32)
    b = leaf([1.0, np.nan, np.nan, 1.0], dtypes.float32)
    np.testing.assert_array_equal(run(g.binary(Op.MAX, a, b)), [np.nan, np.nan, np.nan, 2.0])
    np.testing.assert_array_equal(run(g.binary(Op.CMPLT, a, b)), [False, False, False, False])
    np.testing.assert_array_equal(run(g.binary(Op.CMPNE, a, b)), [True, True, True, True])
    np.testing.assert_array_equal(run(g.reduce(Op.REDUCE_MAX, a, (0,))), [np.nan])


def test_reductions_keep_reduced_axes_and_dtype() -> None:
    x = leaf(np.arange(24).reshape(2, 3, 4), dtypes.int32)
    total = run(g.reduce(Op.REDUCE_SUM, x, (0, 2)))
    assert total.shape == (1, 3, 1) and total.dtype == np.int32
    np.testing.assert_array_equal(total.reshape(-1), np.arange(24).reshape(2, 3, 4).sum((0, 2)))
    empty = leaf(np.zeros((2, 0)), dtypes.float32)
    np.testing.assert_array_equal(run(g.reduce(Op.REDUCE_SUM, empty, (1,))), [[0.0], [0.0]])


def test_gather_and_scatter_add_follow_torch() -> None:
    x_values = np.arange(12.0).reshape(3, 4)
    index_values = np.array([[2, 0, 0, 1], [1, 1, 2, 2]])
    x, index = leaf(x_values, dtypes.float32), leaf(index_values, dtypes.int64)
    np.testing.assert_array_equal(run(g.gather(x, index, 0)),
                                  torch.gather(torch.tensor(x_values), 0, torch.tensor(index_values)).numpy())
    values = leaf(np.ones((2, 4)), dtypes.float32)
    want = torch.zeros(3, 4, dtype=torch.float64).scatter_add(0, torch.tensor(index_values), torch.ones(2, 4).double())
    np.testing.assert_array_equal(run(g.scatter_add(g.const(0.0, dtypes.float32, (3, 4)), index, values, 0)),
                                  want.numpy())


@pytest.mark.parametrize("bad", [3, -1])
def test_gather_out_of_range_raises_a_clear_index_error(bad: int) -> None:
    x = leaf(np.zeros((2, 3)), dtypes.float32)
    index = leaf([[0, bad], [1, 2]], dtypes.int64)
    with pytest.raises(IndexError, match=rf"gather: index {bad} is out of bounds for axis 1 with size 3"):
        run(g.gather(x, index, 1))


@pytest.mark.parametrize("bad", [2, -1])
def test_scatter_add_out_of_range_raises_a_clear_index_error(bad: int) -> None:
    index = leaf([bad, 0], dtypes.int64)
    with pytest.raises(IndexError, match=rf"scatter_add: index {bad} is out of bounds for axis 0 with size 2"):
        run(g.scatter_add(g.const(0.0, dtypes.float32, (2,)), index, leaf([1.0, 1.0], dtypes.float32), 0))


def test_movement_ops_follow_their_index_maps() -> None:
    values = np.arange(6.0).reshape(2, 3)
    x = leaf(values, dtypes.float32)
    cases = {
        Op.RESHAPE: ((3, 2), values.reshape(3, 2)),
        Op.PERMUTE: ((1, 0), values.T),
        Op.EXPAND: ((2, 2, 3), None),
        Op.PAD: (((1, 0), (0, 2)), np.pad(values, ((1, 0), (0, 2)))),
        Op.SHRINK: (((1, 2), (0, 2)), values[1:2, 0:2]),
        Op.FLIP: ((1,), values[:, ::-1]),
    }
    for op, (arg, want) in cases.items():
        source = g.movement(Op.RESHAPE, x, (1, 2, 3)) if op is Op.EXPAND else x
        want = np.broadcast_to(values, (2, 2, 3)) if want is None else want
        np.testing.assert_array_equal(run(g.movement(op, source, arg)), want, err_msg=op.name)


def test_known_values_are_used_instead_of_recomputing() -> None:
    x = leaf([1.0, 2.0], dtypes.float32)
    doubled = g.binary(Op.ADD, x, x)
    out = g.binary(Op.MUL, doubled, doubled)
    np.testing.assert_array_equal(REFERENCE.evaluate([out], known={doubled: np.array([3.0, 4.0], np.float32)})[0],
                                  [9.0, 16.0])


def test_composites_run_through_their_decomposition() -> None:
    import tensorgraphs as tg

    a, b = np.arange(6.0).reshape(2, 3), np.arange(12.0).reshape(3, 4)
    product = tg.matmul(tg.tensor(a, dtype=tg.float64), tg.tensor(b, dtype=tg.float64))
    np.testing.assert_allclose(run(product.node), a @ b, rtol=1e-15)
