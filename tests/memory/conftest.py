"""Shared fixtures; every test here runs with poison on, so a temporary read before it is written reads NaN."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import pytest

import tensorgraphs as tg
from tensorgraphs import nn
from tensorgraphs.graph.node import Node
from tensorgraphs.memory.order import order_for_memory
from tensorgraphs.rewrite import optimize
from tensorgraphs.schedule.fusion import Schedule, schedule_kernels

SMALL_TRANSFORMER = {"d_model": 32, "nhead": 4, "dim_feedforward": 128}
"""The benchmark's pre-LN layer (bench/memory.py) at an eighth of its width: the same kernels, smaller buffers."""
SMALL_BATCH = (2, 16)  # batch, sequence


@pytest.fixture(autouse=True)
def poison(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TG_POISON", "1")


def product_then_exp_and_sum(seed: int = 0) -> list[Node]:
    """p = x@w is read by two kernels (so it gets a buffer): exp(p), which feeds a matmul (so it gets a buffer
    too), and p.sum(0). Run in graph order p outlives exp; run the sum first and exp may overwrite p."""
    rng = np.random.default_rng(seed)
    x, w, w2 = (tg.tensor(rng.normal(size=s).astype(np.float32)) for s in ((8, 16), (16, 16), (16, 4)))
    product = x @ w
    return [((product * 0.25).exp() @ w2).node, product.sum(0).node]


@pytest.fixture
def handoff_roots() -> list[Node]:
    return product_then_exp_and_sum()


@pytest.fixture
def graph_order_schedule(handoff_roots: list[Node]) -> Schedule:
    return schedule_kernels(handoff_roots)


@pytest.fixture
def handoff_schedule(graph_order_schedule: Schedule) -> Schedule:
    """The schedule in the order the cpu backend runs it, with one in-place handoff."""
    return order_for_memory(graph_order_schedule)


@dataclass
class TransformerStep:
    """The benchmark's training step (mean squared output, the gradient of every parameter) on a small model."""

    model: nn.Module
    x: np.ndarray
    target: np.ndarray

    def __call__(self, x: tg.Tensor, target: tg.Tensor) -> tuple[tg.Tensor, ...]:
        loss = ((self.model(x) - target) ** 2).mean()
        return (loss, *tg.grad(loss, list(self.model.parameters())))

    def schedule(self) -> Schedule:
        """Its kernels in graph order (not compiled)."""
        outputs = self(tg.tensor(self.x), tg.tensor(self.target))
        return schedule_kernels(optimize([t.node for t in outputs]))


def small_transformer_step(layers: int) -> TransformerStep:
    tg.manual_seed(0)
    model = nn.Sequential(*[nn.TransformerEncoderLayer(**SMALL_TRANSFORMER, dropout=0.0, batch_first=True,
                                                       norm_first=True) for _ in range(layers)])
    rng = np.random.default_rng(0)
    shape = (*SMALL_BATCH, SMALL_TRANSFORMER["d_model"])
    return TransformerStep(model, *(rng.normal(size=shape).astype(np.float32) for _ in range(2)))


@pytest.fixture
def transformer_step() -> Callable[[int], TransformerStep]:
    return small_transformer_step


@pytest.fixture(scope="session")
def two_layer_training() -> TransformerStep:
    return small_transformer_step(2)


@pytest.fixture(scope="session")
def two_layer_step(two_layer_training: TransformerStep) -> Schedule:
    return two_layer_training.schedule()
