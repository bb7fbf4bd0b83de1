"""Shared fixtures; every test here runs with poison on, so a temporary read before it is written reads NaN."""

from __future__ import annotations

import numpy as np
import pytest

import tensorgraphs as tg
from tensorgraphs.graph.node import Node
from tensorgraphs.memory.order import order_for_memory
from tensorgraphs.schedule.fusion import Schedule, schedule_kernels


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
