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
from tensorgraphs.backends.cpu import CPU


@pytest.fixture(autouse=True)
def forced_compilation(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(CPU, "interpret_below", 0)


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
