"""Suite-wide settings: the tests of the compiled path compile every graph, however small."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import pytest

import tensorgraphs as tg
import tensorgraphs.nn.functional as F
from tensorgraphs.backends.cpu import CPU

COMPILING_DIRECTORIES = {"backends", "codegen", "memory", "schedule", "testing"}
"""Tests here check the generated C: the "cpu" device must not hand their small graphs to the interpreter."""


@pytest.fixture(autouse=True)
def compile_everything_where_tested(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    if Path(request.node.path).parent.name in COMPILING_DIRECTORIES:
        monkeypatch.setattr(CPU, "interpret_below", 0)


def _compiled_classifier_step(model: tg.nn.Module, optimizer: tg.optim.Optimizer) -> tg.CompiledFunction:
    @tg.compile
    def step(x: tg.Tensor, y: tg.Tensor) -> tg.Tensor:
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        return loss

    return step


@pytest.fixture
def compiled_step() -> Callable[[tg.nn.Module, tg.optim.Optimizer], tg.CompiledFunction]:
    """Builds one classification training step (zero_grad, cross entropy, backward, optimizer step) of a model and
    its optimizer, compiled whole by `tg.compile`."""
    return _compiled_classifier_step
