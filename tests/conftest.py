"""Suite-wide settings: the tests of the compiled path compile every graph, however small."""

from __future__ import annotations

from pathlib import Path

import pytest

from tensorgraphs.backends.cpu import CPU

COMPILING_DIRECTORIES = {"backends", "codegen", "memory", "schedule", "testing"}
"""Tests here check the generated C: the "cpu" device must not hand their small graphs to the interpreter."""


@pytest.fixture(autouse=True)
def compile_everything_where_tested(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    if Path(request.node.path).parent.name in COMPILING_DIRECTORIES:
        monkeypatch.setattr(CPU, "interpret_below", 0)
