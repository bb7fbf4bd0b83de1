"""tg.multinomial: the draws follow the probabilities (checked against the exact distributions), zero
weights are never drawn, draws without replacement are distinct, tg.manual_seed reproduces them, and bad
arguments raise at the call."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tensorgraphs as tg
from tensorgraphs.errors import ArgumentError, DTypeError, ShapeError

PROBS = np.array([0.1, 0.0, 0.6, 0.3])
DRAWS = 20000


def assert_frequencies(draws: np.ndarray, expected: np.ndarray) -> None:
    """Within 5 standard deviations of the binomial counts."""
    frequencies = np.bincount(draws, minlength=len(expected)) / len(draws)
    sigma = np.sqrt(expected * (1 - expected) / len(draws))
    assert np.all(np.abs(frequencies - expected) <= 5 * sigma + 1e-12), (frequencies, expected)


def test_with_replacement_draws_each_category_with_its_probability() -> None:
    tg.manual_seed(0)
    draws = tg.multinomial(tg.tensor(PROBS * 7, dtype=tg.float32), DRAWS, replacement=True).numpy()  # unnormalized
    assert draws.shape == (DRAWS,) and draws.dtype == np.int64
    assert_frequencies(draws, PROBS)


def test_without_replacement_draws_distinct_categories_in_weighted_order() -> None:
    rows = 5000
    tg.manual_seed(1)
    draws = tg.multinomial(tg.tensor(np.tile(PROBS, (rows, 1))), 3).numpy()
    assert draws.shape == (rows, 3)
    assert all(len(set(row)) == 3 for row in draws.tolist()) and not (draws == 1).any()
    second = np.array([sum(PROBS[i] * PROBS[j] / (1 - PROBS[i]) for i in range(4) if i != j) for j in range(4)])
    assert_frequencies(draws[:, 0], PROBS)
    assert_frequencies(draws[:, 1], second)


def test_manual_seed_and_generators_reproduce_draws_eager_and_compiled() -> None:
    probs = tg.tensor([[0.2, 0.5, 0.3], [0.9, 0.05, 0.05]])
    tg.manual_seed(7)
    first = probs.multinomial(6, replacement=True).numpy()
    tg.manual_seed(7)
    np.testing.assert_array_equal(tg.multinomial(probs, 6, True).numpy(), first)
    own = [tg.multinomial(probs, 2, generator=tg.Generator().manual_seed(3)).numpy() for _ in range(2)]
    np.testing.assert_array_equal(*own)
    sample = tg.compile(lambda p: tg.multinomial(p, 6, True))
    tg.manual_seed(7)
    np.testing.assert_array_equal(sample(probs).numpy(), first)
    assert not np.array_equal(sample(probs).numpy(), first)  # the next call draws anew


@pytest.mark.parametrize(("call", "error", "message"), [
    (lambda: tg.multinomial(tg.tensor([1, 2]), 1), DTypeError, "floating point"),
    (lambda: tg.multinomial(tg.ones(2, 2, 2), 1), ShapeError, "1-D or 2-D"),
    (lambda: tg.multinomial(tg.ones(3), 4), ArgumentError, "cannot draw 4 samples without replacement"),
    (lambda: tg.multinomial(tg.ones(3), 0, True), ArgumentError, "positive integer"),
], ids=["dtype", "ndim", "too-many", "zero"])
def test_bad_arguments_raise_at_the_call(call: object, error: type, message: str) -> None:
    with pytest.raises(error, match=f"multinomial.*{message}.*test_sampling.py"):
        call()  # type: ignore[operator]


@pytest.mark.parametrize("bad", [[0.5, float("nan")], [0.5, float("inf")], [0.5, -0.1], [0.0, 0.0]])
def test_invalid_probabilities_are_refused_at_the_call_as_torch_refuses_them(bad: list[float]) -> None:
    with pytest.raises(RuntimeError):
        torch.multinomial(torch.tensor([[0.2, 0.8], bad]), 1)
    with pytest.raises(tg.ArgumentError, match="multinomial.*test_sampling.py"):
        tg.multinomial(tg.tensor([[0.2, 0.8], bad]), 1)


def test_a_compiled_sampler_draws_from_the_probabilities_given_at_each_call() -> None:
    sample = tg.compile(lambda p: tg.multinomial(p, 1))
    for hot in (0, 2):
        probs = np.zeros((3, 4), np.float32)
        probs[:, hot] = 1.0
        np.testing.assert_array_equal(sample(tg.tensor(probs)).numpy(), np.full((3, 1), hot))
