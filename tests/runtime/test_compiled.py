"""tg.compile: one trace per signature, replay on new data, captured tensors fixed at trace time."""

from __future__ import annotations

import numpy as np
import pytest

import tensorgraphs as tg
import tensorgraphs.nn.functional as F


def data(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=shape).astype(np.float32)


def test_traces_once_per_signature_and_replays_new_data() -> None:
    calls = []

    @tg.compile
    def step(x: tg.Tensor, scale: float) -> tg.Tensor:
        calls.append(1)
        return F.softmax(x * scale, -1)

    for seed in range(3):
        x = data(4, 9, seed=seed)
        got = step(tg.tensor(x), 2.0).numpy()
        np.testing.assert_allclose(got, F.softmax(tg.tensor(x) * 2.0, -1).numpy(), rtol=1e-6, atol=1e-7)
    assert len(calls) == 1
    step(tg.tensor(data(5, 9)), 2.0)
    step(tg.tensor(data(5, 9)), 3.0)
    assert len(calls) == 3 and len(step.traces) == 3


def test_numpy_inputs_tuple_outputs_and_captured_tensors() -> None:
    weight = tg.tensor(data(3, 4, seed=1), requires_grad=True)

    @tg.compile
    def forward(x: np.ndarray) -> tuple[tg.Tensor, tg.Tensor]:
        y = x @ weight.detach()
        return y, y.sum()

    x = data(2, 3, seed=2)
    y, total = forward(x)
    np.testing.assert_allclose(y.numpy(), x @ data(3, 4, seed=1), rtol=1e-5)
    np.testing.assert_allclose(total.item(), y.numpy().sum(), rtol=1e-5)
    weight.assign(tg.tensor(np.ones((3, 4), np.float32)))  # a new node: the trace keeps the captured one
    y2, _ = forward(x)
    np.testing.assert_allclose(y2.numpy(), y.numpy(), rtol=1e-6)
    assert len(forward.traces) == 1
    as_argument = tg.compile(lambda x, w: x @ w)
    np.testing.assert_allclose(as_argument(x, weight.detach()).numpy(), x @ np.ones((3, 4), np.float32), rtol=1e-5)


def test_non_tensor_results_are_rejected() -> None:
    with pytest.raises(tg.ArgumentError, match="must return a Tensor"):
        tg.compile(lambda x: 3)(tg.tensor(data(2)))


def test_stats_report_kernels_and_planned_memory() -> None:
    rng = np.random.default_rng(3)
    w, w2 = (tg.tensor(rng.normal(size=s).astype(np.float32)) for s in ((16, 16), (16, 4)))

    @tg.compile
    def step(x: tg.Tensor) -> tuple[tg.Tensor, tg.Tensor]:
        """x@w is read by two kernels, exp(x@w) feeds a matmul: two temporaries, the second may overwrite the first."""
        product = x @ w
        return ((product * 0.25).exp() @ w2), product.sum(0)

    with pytest.raises(tg.ArgumentError, match="call the compiled function once"):
        _ = step.stats
    step(tg.tensor(data(8, 16)))
    stats = step.stats
    assert stats.kernels == len(step.traces[next(iter(step.traces))].program.kernels) >= 2
    assert 0 < stats.arena_bytes < stats.naive_bytes and stats.compile_seconds > 0
