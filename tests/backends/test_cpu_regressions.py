"""Silent wrong results the cpu device once gave, each checked against the numpy device (or torch) with
compilation forced: every graph here, however small, runs as generated C."""

from __future__ import annotations

import math
from typing import Callable

import numpy as np
import pytest
import torch

import tensorgraphs as tg
import tensorgraphs.nn.functional as F
from tensorgraphs.autograd.vjp import vjp
from tensorgraphs.backends.cpu.renderer import CpuRenderer
from tensorgraphs.graph import node
from tensorgraphs.schedule.fusion import schedule_kernels

pytestmark = pytest.mark.device("cpu", compile=True)  # checks generated C, small graphs included


def on_both(build: Callable[[], dict[str, tg.Tensor]]) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """`build()`'s outputs evaluated on the numpy device (expected) and on the cpu device (got)."""
    results = []
    for device in ("numpy", "cpu"):
        with tg.device(device):
            results.append({name: t.detach().numpy() for name, t in build().items()})
    return results[0], results[1]


def assert_same(build: Callable[[], dict[str, tg.Tensor]], rtol: float = 1e-5, atol: float = 1e-6) -> None:
    expected, got = on_both(build)
    for name, want in expected.items():
        np.testing.assert_allclose(got[name], want, rtol=rtol, atol=atol, equal_nan=True, err_msg=name)


# -- scatter-add of a single element --------------------------------------------------------------------------


def test_scatter_add_of_one_element_adds_to_the_base() -> None:
    """A one-element scatter has no loop of its own: its store must still follow the loop copying the base."""
    assert_same(lambda: {
        "vector": tg.scatter_add(tg.zeros(70000), 0, tg.tensor([2]), tg.ones(1)),
        "row": tg.scatter_add(tg.ones(1, 5), 1, tg.tensor([[4]]), tg.full((1, 1), 2.0)) * 2 + 1,
        "column": tg.scatter_add(tg.ones(3, 5), 1, tg.tensor([[2], [0], [4]]), tg.full((3, 1), 2.0)),
        "single": tg.scatter_add(tg.zeros(1), 0, tg.tensor([0]), tg.full((1,), 3.0)),
    })


def test_batch_of_one_gradients_through_gather_are_not_zero() -> None:
    logits = np.random.default_rng(0).normal(size=(1, 70000)).astype(np.float32)

    def build() -> dict[str, tg.Tensor]:
        grads = {}
        for name, loss in {
            "cross_entropy": lambda x: F.cross_entropy(x, tg.tensor([5])),
            "label_smoothing": lambda x: F.cross_entropy(x, tg.tensor([5]), label_smoothing=0.1),
            "nll_loss": lambda x: F.nll_loss(x.log_softmax(1), tg.tensor([7])),
            "gather": lambda x: (x.gather(1, tg.tensor([[4]])) * 3).sum(),
        }.items():
            x = tg.tensor(logits, requires_grad=True)
            loss(x).backward()
            grads[name] = x.grad
        return grads

    expected, got = on_both(build)
    for name, want in expected.items():
        assert np.abs(want).sum() > 0.5, name
        np.testing.assert_allclose(got[name], want, rtol=1e-5, atol=1e-7, err_msg=name)


# -- a row operation broadcast after it -------------------------------------------------------------------------


@pytest.mark.parametrize("shape, expanded", [((512, 1, 64), (512, 3, 64)), ((2, 1, 10000), (2, 3, 10000)),
                                             ((3, 1, 1, 64), (3, 2, 4, 64))],
                         ids=["row array", "row through the output", "two broadcast axes"])
def test_softmax_expanded_along_a_new_axis(shape: tuple[int, ...], expanded: tuple[int, ...]) -> None:
    """The exp a softmax computes in its row reduction is passed to its output loop; the reduction sits above
    the broadcast axis, so the row array must be declared there (it was declared inside that axis' loop)."""
    x = np.random.default_rng(1).normal(size=shape).astype(np.float32)
    assert_same(lambda: {
        "log_softmax": tg.tensor(x).log_softmax(-1).expand(*expanded),
        "softmax_plus": tg.tensor(x).softmax(-1).expand(*expanded) + 1,
    })


# -- integer powers ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["int8", "uint8", "int16", "int32", "int64"])
def test_integer_pow_is_exact_and_wraps_as_torch(dtype: str) -> None:
    rng = np.random.default_rng(2)
    low = 0 if dtype == "uint8" else -6
    base, exponent = rng.integers(low, 12, 48).astype(dtype), rng.integers(low, 70, 48).astype(dtype)
    base[:4] = [5, 6, 10, 1] if dtype == "uint8" else [5, 6, 10, -1]
    exponent[:4] = [5, 6, 10, 7]
    for device in ("numpy", "cpu"):
        with tg.device(device):
            x, y = tg.tensor(base), tg.tensor(exponent)
            got = {"tensor": x ** y, "scalar": x ** 13, "scalar_base": 3 ** y}
            for name, value in got.items():
                want = {"tensor": torch.tensor(base) ** torch.tensor(exponent), "scalar": torch.tensor(base) ** 13,
                        "scalar_base": 3 ** torch.tensor(exponent)}[name].numpy()
                np.testing.assert_array_equal(value.numpy(), want, err_msg=f"{device} {name}")
                assert value.numpy().dtype == want.dtype, (device, name)


def test_int32_ten_to_the_ten_wraps() -> None:
    x = np.array([5, 6, 10], np.int32)
    want = (torch.tensor(x) ** torch.tensor(x)).numpy()
    assert want[2] == 1410065408
    for device in ("numpy", "cpu"):
        with tg.device(device):
            np.testing.assert_array_equal((tg.tensor(x) ** tg.tensor(x)).numpy(), want, err_msg=device)


# -- NaN bounds and signed zeros --------------------------------------------------------------------------------


def assert_same_bits_as_torch(got: np.ndarray, want: torch.Tensor, message: str) -> None:
    want_array = want.detach().float().numpy() if want.dtype == torch.bfloat16 else want.detach().numpy()
    got = got.astype(want_array.dtype)
    np.testing.assert_array_equal(got, want_array, err_msg=message)
    np.testing.assert_array_equal(np.signbit(got), np.signbit(want_array), err_msg=f"{message}: sign of zero")


def test_clamp_with_a_nan_bound_gives_nan_as_torch() -> None:
    x = np.array([1.0, 3.0, np.nan, -0.0, 7.0], np.float32)
    low, high = np.array([np.nan, 0, 0, 0, 0], np.float32), np.array([5, np.nan, 5, 5, 5], np.float32)
    cases = {
        "max_nan": (lambda m, a, b: m.clamp(m.tensor(x), 2, math.nan)),
        "min_nan": (lambda m, a, b: m.clamp(m.tensor(x), math.nan, 3)),
        "max_only_nan": (lambda m, a, b: m.clamp(m.tensor(x), max=math.nan)),
        "tensor_bounds": (lambda m, a, b: m.clamp(m.tensor(x), m.tensor(a), m.tensor(b))),
    }
    for device in ("numpy", "cpu"):
        with tg.device(device):
            for name, case in cases.items():
                assert_same_bits_as_torch(case(tg, low, high).numpy(), case(torch, low, high), f"{device} {name}")


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16"])
def test_rounding_keeps_negative_zero_and_rounds_half_to_even(dtype: str) -> None:
    values = np.array([-0.0, 0.0, -0.4, -0.5, -0.7, -1.5, -2.5, 0.5, 1.5, 2.5, -3.5, np.nan, np.inf, -np.inf, -1e30
                       if dtype != "float16" else -6e4, 2.0**23 + 0.5 if dtype != "float16" else 1000.5], dtype)
    for device in ("numpy", "cpu"):
        with tg.device(device):
            for name in ("trunc", "ceil", "floor", "round"):
                got = getattr(tg.tensor(values), name)().numpy()
                assert_same_bits_as_torch(got, getattr(torch.tensor(values), name)(), f"{device} {name}")


# -- scans ------------------------------------------------------------------------------------------------------


def scan_gradient_program(op: str, shape: tuple[int, ...], dim: int) -> tuple[int, int]:
    """Kernels and characters of C for the gradient of op(x, dim).cos().sum() (the program is not compiled)."""
    x = tg.tensor(np.random.default_rng(3).normal(size=shape).astype(np.float32))
    y = getattr(x, op)(dim).cos().sum()
    (grad,) = vjp([y.node], [node.const(1.0, y.dtype, y.shape)], [x.node])
    schedule = schedule_kernels([grad])
    return len(schedule.kernels), len(CpuRenderer.render_program(schedule.kernels, [b.name for b in schedule.buffers]))


@pytest.mark.parametrize("op", ["cumsum", "cumprod"])
def test_scan_gradients_are_loops_not_unrolled_expressions(op: str) -> None:
    """The scan is one loop along its axis: the program does not grow with the axis' length (it was 1.9 MB
    of C for cumsum over 64 rows, compiled in minutes)."""
    short, long = scan_gradient_program(op, (8, 17, 64), 0), scan_gradient_program(op, (64, 17, 64), 0)
    assert long[0] == short[0] <= 8
    assert long[1] <= short[1] * 1.05


@pytest.mark.parametrize("op", ["cumsum", "cumprod"])
@pytest.mark.parametrize("dim", [0, 1, 2])
def test_scans_and_their_gradients_match_torch(op: str, dim: int) -> None:
    rng = np.random.default_rng(4)
    x, seed = rng.normal(size=(6, 9, 5)).astype(np.float32), rng.normal(size=(6, 9, 5)).astype(np.float32)
    x[0, 2, 1] = x[1, 3, 2] = x[1, 6, 2] = x[2, 0, 0] = x[5, 8, 4] = 0.0  # zeros: cumprod's gradient cases
    t = torch.tensor(x, requires_grad=True)
    getattr(t, op)(dim).backward(torch.tensor(seed))
    expected_value = getattr(torch.tensor(x), op)(dim).numpy()
    for device in ("numpy", "cpu"):
        with tg.device(device):
            value = tg.tensor(x, requires_grad=True)
            result = getattr(value, op)(dim)
            result.backward(tg.tensor(seed))
            np.testing.assert_allclose(result.detach().numpy(), expected_value, rtol=1e-5, atol=1e-6,
                                       err_msg=f"{device} value")
            np.testing.assert_allclose(value.grad.numpy(), t.grad.numpy(), rtol=1e-5, atol=1e-5,
                                       err_msg=f"{device} gradient")


def test_integer_and_compiled_scans() -> None:
    x = np.random.default_rng(5).integers(-9, 9, (70, 300)).astype(np.int32)
    compiled = tg.compile(lambda t: (t.cumsum(0), t.cumprod(1), (t.float() * 0.1).cumsum(1)))
    got = [r.numpy() for r in compiled(tg.tensor(x))]
    torch_x = torch.tensor(x)
    want = [torch_x.cumsum(0).numpy(), torch_x.cumprod(1).numpy(), (torch_x.float() * 0.1).cumsum(1).numpy()]
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])
    np.testing.assert_allclose(got[2], want[2], rtol=1e-5, atol=1e-5)


# -- non-finite values in matrix products (the contract in docs/ops.md) ------------------------------------------


def product_operands() -> dict[str, tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(6)
    a, b = rng.normal(size=(37, 70)).astype(np.float32), rng.normal(size=(70, 45)).astype(np.float32)
    inf_times_zero, nan, inf_minus_inf, same_sign = a.copy(), a.copy(), a.copy(), a.copy()
    inf_times_zero[3, 5] = np.inf
    nan[4, 6] = np.nan
    inf_minus_inf[1, 2], inf_minus_inf[1, 3] = np.inf, -np.inf
    same_sign[7] = 3e38
    zero_row, positive = b.copy(), np.abs(b)
    zero_row[5] = 0
    return {"inf_times_zero": (inf_times_zero, zero_row), "nan": (nan, b), "inf_minus_inf": (inf_minus_inf, positive),
            "overflow_same_sign": (same_sign, positive), "overflow_mixed_signs": (a * 1e20, b * 1e20)}


@pytest.mark.parametrize("case", list(product_operands()))
def test_matrix_products_are_non_finite_exactly_where_torch_is(case: str) -> None:
    a, b = product_operands()[case]
    want = (torch.tensor(a) @ torch.tensor(b)).numpy()
    assert not np.isfinite(want).all()
    linear = tg.compile(lambda x, w: F.linear(x, w))
    for device in ("numpy", "cpu"):
        with tg.device(device):
            got = {"matmul": (tg.tensor(a) @ tg.tensor(b)).numpy(),
                   "linear": F.linear(tg.tensor(a), tg.tensor(b.T)).numpy()}
        if device == "cpu":
            got["compiled"] = linear(tg.tensor(a), tg.tensor(b.T)).numpy()
        for name, value in got.items():
            finite = np.isfinite(want)
            np.testing.assert_array_equal(np.isfinite(value), finite, err_msg=f"{device} {name}: finite where")
            np.testing.assert_allclose(value[finite], want[finite], rtol=1e-4, atol=1e-4, err_msg=f"{device} {name}")


@pytest.mark.parametrize("scale", [1e19, 1e25, 3e18])
def test_attention_with_overflowing_scores_is_non_finite_where_torch_is(scale: float) -> None:
    rng = np.random.default_rng(7)
    q, k, v = (rng.normal(size=(2, 2, 33, 16)).astype(np.float32) for _ in range(3))
    q, k = (q * scale).astype(np.float32), (k * scale).astype(np.float32)
    want = torch.nn.functional.scaled_dot_product_attention(*map(torch.tensor, (q, k, v))).numpy()
    attention = tg.compile(lambda *t: F.scaled_dot_product_attention(*t))
    for device in ("numpy", "cpu"):
        with tg.device(device):
            got = {"eager": F.scaled_dot_product_attention(*map(tg.tensor, (q, k, v))).numpy()}
        if device == "cpu":
            got["compiled"] = attention(*map(tg.tensor, (q, k, v))).numpy()
        for name, value in got.items():
            finite = np.isfinite(want)
            np.testing.assert_array_equal(np.isfinite(value), finite, err_msg=f"{device} {name}: finite where")
            np.testing.assert_allclose(value[finite], want[finite], rtol=1e-4, atol=1e-4, err_msg=f"{device} {name}")


def test_integer_tensor_to_a_negative_python_int_raises_as_torch() -> None:
    with pytest.raises(RuntimeError, match="negative integer powers"):
        torch.tensor([2, 3]) ** -1
    with pytest.raises(tg.errors.DTypeError, match="negative integer powers"):
        tg.tensor([2, 3]) ** -1


@pytest.mark.parametrize("dtype, ulp_at_32", [("float16", 2.0**-5), ("bfloat16", 2.0**-2)])
def test_half_precision_scans_accumulate_in_float32_as_torch(dtype: str, ulp_at_32: float) -> None:
    """Rounding every partial sum to the half type drifts by several ulp over 300 elements."""
    x = np.random.default_rng(8).normal(size=(5, 300)).astype(np.float32)
    want = torch.tensor(x).to(getattr(torch, dtype)).cumsum(1).float().numpy()
    assert 32 <= np.abs(want).max() < 64
    for device in ("numpy", "cpu"):
        with tg.device(device):
            got = tg.tensor(x).to(getattr(tg, dtype)).cumsum(1).float().numpy()
        np.testing.assert_allclose(got, want, rtol=0, atol=ulp_at_32, err_msg=device)


@pytest.mark.parametrize("shape,dim", [((3, 4), 1), ((7, 1, 4, 1), -2), ((7, 4), 0), ((5, 8), 1)])
@pytest.mark.parametrize("reduction", ["all", "any"])
def test_short_reductions_of_comparisons_give_booleans(shape: tuple[int, ...], dim: int, reduction: str) -> None:
    """gcc 12's straight-line vectorizer stored 254 for `(x == 2).all(1)` over rows of 4 uint8 (found by the
    fuzzer); generated C is compiled without it."""
    x = np.random.default_rng(1).integers(0, 255, shape).astype(np.uint8)
    x.flat[::5] = 2
    for condition in (lambda t: t == 2, lambda t: t != 2):
        with tg.device("numpy"):
            expected = getattr(condition(tg.tensor(x)), reduction)(dim).numpy()
        got = getattr(condition(tg.tensor(x)), reduction)(dim).numpy()
        np.testing.assert_array_equal(got.view(np.uint8), expected.view(np.uint8))
